"""A Python program whose busy thread is the oldest of many: `busy` starts
first and spins in `spin`, then argv[2] (default 200) idle workers start and
wait on an event, as a thread pool's do. Prints "ready" once all run; runs
for argv[1] seconds (default 30). For hostprof's test that the kernel finds
the busy thread's state however many threads came after it."""
import sys
import threading
import time


def spin(until):
    total = 0
    while time.monotonic() < until:
        for n in range(1000):
            total += n * n
    return total


def busy(until):
    spin(until)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30
    idle = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    until = time.monotonic() + seconds
    worker = threading.Thread(target=busy, args=(until,), name="busy")
    worker.start()
    stop = threading.Event()
    pool = [threading.Thread(target=stop.wait, daemon=True) for _ in range(idle)]
    for thread in pool:
        thread.start()
    print("ready", flush=True)
    worker.join()
    stop.set()


main()
