/* A library for hostprof's Python tests: start_spinner() starts a thread
 * named "spinner" that runs native code only, never the interpreter, for
 * `seconds`. Built with -shared -fPIC -pthread, loaded with ctypes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

static double seconds_to_run;

static double now(void) {
    struct timespec at;
    clock_gettime(CLOCK_MONOTONIC, &at);
    return at.tv_sec + at.tv_nsec / 1e9;
}

__attribute__((noinline)) static unsigned long spin_natively(double until) {
    volatile unsigned long total = 0;
    while (now() < until) {
        for (unsigned long i = 0; i < 100000; i++) {
            total += i * i;
        }
    }
    return total;
}

static void *spinner(void *arg) {
    (void)arg;
    spin_natively(now() + seconds_to_run);
    return 0;
}

int start_spinner(double seconds) {
    pthread_t thread;
    seconds_to_run = seconds;
    if (pthread_create(&thread, 0, spinner, 0) != 0) {
        return -1;
    }
    pthread_setname_np(thread, "spinner");
    return pthread_detach(thread);
}
