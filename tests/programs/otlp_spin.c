/* Burns CPU in one named function for argv[1] seconds of its own CPU time
 * (default 5: a busy machine makes it run longer, not less), so a
 * profile of it has a known hot leaf: otlp_hot_loop. Built with -O0 and frame
 * pointers so the stack walks through main. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void otlp_hot_loop(double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    do {
        for (int i = 0; i < 1000000; i++)
            sink += (unsigned long)i * 2654435761u;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    otlp_hot_loop(argc > 1 ? atof(argv[1]) : 5.0);
    return 0;
}
