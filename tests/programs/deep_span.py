"""A Python thread with an OpenTelemetry span attached (through
tests/programs/otel_span_lib.c, loaded with ctypes) that burns CPU 150
calls deep in `descend`, for tests/python_context.rs. Prints "attached"
once the span is.

    python3 deep_span.py LIBRARY SECONDS ROUTE
"""
import ctypes
import sys
import time


def spin(seconds):
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        for i in range(10000):
            total += i
    return total


def descend(depth, seconds):
    if depth == 0:
        return spin(seconds)
    return descend(depth - 1, seconds)


def main():
    library = ctypes.CDLL(sys.argv[1])
    library.otel_span_publish()
    library.otel_span_attach(sys.argv[3].encode())
    # The reader may start now: the variable is loaded and set.
    print("attached", flush=True)
    descend(150, float(sys.argv[2]))


main()
