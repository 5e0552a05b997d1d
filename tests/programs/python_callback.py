"""A Python program for hostprof's test of where interpreter frames go:
nearly all of its time is in `work`, which `by_key` calls, which the C
function sorted() calls back, from `stage`:

<module> -> run -> stage -> [sorted, in C] -> by_key -> work

so each sample's native stack holds two calls of the evaluation loop,
one above the C frames and one below. Runs for argv[1] seconds (default
30), prints "ready" first.
"""
import sys
import time


def work(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def by_key(x):
    return work(2000) + x


def stage():
    return sorted(range(64), key=by_key)


def run(deadline):
    while time.monotonic() < deadline:
        stage()


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
print("ready", flush=True)
run(time.monotonic() + seconds)
