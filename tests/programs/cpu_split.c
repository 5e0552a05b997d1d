// A CPU-bound program with a designed profile: hot_work does 3 units of work
// for every 1 unit of cold_work, so hot_work should hold ~75% of its samples
// and cold_work ~25%. Both loops are the same code, so time follows counts.
// Usage: cpu_split SECONDS (of its own CPU time: a busy machine makes it run
// longer, not give fewer samples)
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void hot_work(unsigned long units) {
    for (unsigned long i = 0; i < units * 100000; i++) sink += i ^ (i >> 3);
}

__attribute__((noinline)) void cold_work(unsigned long units) {
    for (unsigned long i = 0; i < units * 100000; i++) sink += i ^ (i >> 3);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    double end = now() + seconds;
    while (now() < end) {
        hot_work(3);
        cold_work(1);
    }
    return 0;
}
