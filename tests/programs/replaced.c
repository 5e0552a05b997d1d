// Spins in a function whose name is chosen at build time (-DHOT=name), so two
// builds of this file differ only in that name: one replaces the other on
// disk while the first still runs.
// Usage: replaced SECONDS (of its own CPU time)
#include <stdlib.h>
#include <time.h>

#ifndef HOT
#define HOT hot_default
#endif

volatile unsigned long sink;

__attribute__((noinline)) void HOT(void) {
    for (unsigned long i = 0; i < 1000000; i++) sink += i ^ (i >> 3);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    struct timespec start, now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    do {
        HOT();
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
