// Unwinding target built without frame pointers (-O2 -fomit-frame-pointer).
// Usage: unwind_c MODE SECONDS (of its own CPU time: a busy machine makes it
// run longer, not give fewer samples)
//   split:   main -> run_split -> stage -> hot_work (75%) / cold_work (25%)
//   qsort:   main -> run_qsort -> qsort (libc) -> compare_slowly (the hot path
//            goes through libc's callback)
//   recurse: main -> recurse x DEPTH -> spin_at_bottom
#include <stdlib.h>
#include <string.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// A unit is long next to a 999 Hz sampling period (tens of ms a pair of
// calls): with 100,000 iterations a pair took about 0.4 ms on a fast CPU,
// close enough to a fraction of the period that the samples fell in step
// with it, and both perf and hostprof saw hot_work at 0.58 to 0.86 of a
// designed 0.75.
#define ITERATIONS_PER_UNIT 10000000UL

__attribute__((noinline)) void hot_work(unsigned long units) {
    for (unsigned long i = 0; i < units * ITERATIONS_PER_UNIT; i++) sink += i ^ (i >> 3);
}

__attribute__((noinline)) void cold_work(unsigned long units) {
    for (unsigned long i = 0; i < units * ITERATIONS_PER_UNIT; i++) sink += i ^ (i >> 3);
}

// A frame of its own between run_split and the workers (stack usage keeps
// it from being merged or turned into a tail call).
__attribute__((noinline)) void stage(int hot) {
    volatile char pad[64];
    pad[0] = (char)hot;
    if (hot) hot_work(3); else cold_work(1);
    sink += pad[0];
}

__attribute__((noinline)) void run_split(double end) {
    while (now() < end) {
        stage(1);
        stage(0);
    }
    sink++;
}

__attribute__((noinline)) int compare_slowly(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    for (int i = 0; i < 200; i++) sink += i;
    return x < y ? -1 : x > y;
}

__attribute__((noinline)) void run_qsort(double end) {
    enum { N = 4096 };
    static unsigned long values[N];
    while (now() < end) {
        for (int i = 0; i < N; i++) values[i] = (unsigned long)rand();
        qsort(values, N, sizeof values[0], compare_slowly);
    }
    sink++;
}

__attribute__((noinline)) void spin_at_bottom(double end) {
    while (now() < end)
        for (int i = 0; i < 100000; i++) sink += i;
}

__attribute__((noinline)) int recurse(int depth, double end) {
    volatile int pad[4];
    pad[0] = depth;
    if (depth == 0) spin_at_bottom(end);
    else recurse(depth - 1, end);
    return pad[0];
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "split";
    double end = now() + (argc > 2 ? atof(argv[2]) : 2.0);
    if (strcmp(mode, "qsort") == 0) run_qsort(end);
    else if (strcmp(mode, "recurse") == 0) sink += recurse(80, end);
    else run_split(end);
    return 0;
}
