"""hostprof's test of a Python process's native threads: argv[2] is
native_spinner.c's library, whose "spinner" thread runs C only, while the
main thread runs Python (`<module> -> spin`). Runs for argv[1] seconds
(default 30), prints "ready" once both run."""
import ctypes
import sys
import time

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
library = ctypes.CDLL(sys.argv[2])
library.start_spinner.argtypes = [ctypes.c_double]
assert library.start_spinner(seconds) == 0


def spin(deadline):
    total = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            total += i * i
    return total


print("ready", flush=True)
spin(time.monotonic() + seconds)
