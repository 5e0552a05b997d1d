"""A Python program with a known call graph, for hostprof's Python tests.

<module> -> run -> stage -> hot_path (3 of 4 calls) / cold_path (1 of 4),
and from stage a C function calling back into Python: sorted(key=by_key),
whose key runs hot_path. Two more threads run the same loop from `worker`.
Runs for argv[1] seconds (default 30), prints "ready" once all threads run.
"""
import sys
import threading
import time


def hot_path(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def cold_path(n):
    total = 0
    for i in range(n):
        total ^= i
    return total


def by_key(x):
    return hot_path(50) + x


def stage(i):
    if i % 4:
        hot_path(30000)
    else:
        cold_path(30000)
    sorted(range(8), key=by_key)


def run(deadline):
    i = 0
    while time.monotonic() < deadline:
        stage(i)
        i += 1


def worker(deadline, started):
    started.release()
    run(deadline)


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
deadline = time.monotonic() + seconds
started = threading.Semaphore(0)
threads = [threading.Thread(target=worker, args=(deadline, started)) for _ in range(2)]
for thread in threads:
    thread.start()
for _ in threads:
    started.acquire()
print("ready", flush=True)
run(deadline)
for thread in threads:
    thread.join()
