"""A Python program that mostly waits: <module> -> loop -> wait_here ->
time.sleep, for hostprof's off-CPU Python test. Runs for argv[1] seconds
(default 30), prints "ready" once it loops."""
import sys
import time


def wait_here():
    time.sleep(0.005)


def loop(seconds):
    end = time.monotonic() + seconds
    print("ready", flush=True)
    while time.monotonic() < end:
        wait_here()


loop(float(sys.argv[1]) if len(sys.argv) > 1 else 30)
