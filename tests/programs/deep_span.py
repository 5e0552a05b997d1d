"""A Python thread with an OpenTelemetry span attached (through
tests/programs/otel_span_lib.c, loaded with ctypes) that burns CPU 150
calls deep in `descend`, for tests/python_context.rs. Prints "attached"
once the span is.

    python3 deep_span.py LIBRARY SECONDS ROUTE [--late] [--no-context]
        [--context-from CONTEXT_LIBRARY]

With --late, the library is loaded only on SIGUSR1, which the program
waits for burning CPU outside it (printing "waiting" first): a service
that loads its SDK after the agent first looked at it. With
--no-context, it publishes no process context (no service name, and no
key map to name the route with). With --context-from, the process context
is published at start by CONTEXT_LIBRARY (otel_span_lib.c built with
-DCONTEXT_ONLY: no thread-context variable), LIBRARY only attaches.
"""
import ctypes
import signal
import sys
import time

woken = False


def wake(_signum, _frame):
    global woken
    woken = True


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
    flags = sys.argv[4:]
    context_only = "--context-from" in flags
    if context_only:
        ctypes.CDLL(flags[flags.index("--context-from") + 1]).otel_span_publish()
    if "--late" in flags:
        signal.signal(signal.SIGUSR1, wake)
        print("waiting", flush=True)
        while not woken:
            spin(0.01)
    library = ctypes.CDLL(sys.argv[1])
    if "--no-context" not in flags and not context_only:
        library.otel_span_publish()
    library.otel_span_attach(sys.argv[3].encode())
    # The reader may start now: the variable is loaded and set.
    print("attached", flush=True)
    descend(150, float(sys.argv[2]))


main()
