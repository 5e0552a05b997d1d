/*
 * A library that defines the OTEP 4947 thread-local otel_thread_ctx_v1 but
 * whose code never touches it, so the loader fills no slot for it (no
 * TPOFF64, DTPMOD64 or TLSDESC relocation): a reader cannot know where it
 * is in a thread. Built as the library (-DUNREACHED_LIBRARY) and as the
 * program that links it and burns SECONDS of its own CPU time (however
 * busy the machine, it is sampled for that long).
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#ifdef UNREACHED_LIBRARY
__thread void *otel_thread_ctx_v1 __attribute__((used));

int unreached_library_loaded(void) { return 1; }
#else
int unreached_library_loaded(void);

static uint64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    uint64_t end = cpu_ns() + (uint64_t)(atof(argc > 1 ? argv[1] : "30") * 1e9);
    volatile uint64_t sink = (uint64_t)unreached_library_loaded();
    while (cpu_ns() < end)
        for (int i = 0; i < 100000; i++)
            sink += (uint64_t)i * 7;
    return 0;
}
#endif
