/* The executable around the thread-context writer built as a library
 * (otel_thread_ctx.c with -DOTEL_WRITER_LIBRARY), for tests/thread_context.rs.
 *
 *   otel_thread_ctx_main ARGS...
 *     (linked with the library) runs the writer with ARGS.
 *   otel_thread_ctx_main --dlopen LIBRARY GO ARGS...
 *     burns CPU in the executable until the file GO exists (at most 120 s),
 *     then dlopens LIBRARY (the thread-local appears in a running process,
 *     in dynamic TLS unless the loader finds room in static TLS) and runs
 *     its writer with ARGS. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int otel_writer_main(int argc, char **argv) __attribute__((weak));

static volatile uint64_t sink;

static uint64_t now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec;
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--dlopen") == 0) {
        uint64_t end = now_s() + 120;
        while (access(argv[3], F_OK) != 0 && now_s() < end)
            for (int i = 0; i < 200000; i++)
                sink += (uint64_t)i * 2654435761u;
        void *library = dlopen(argv[2], RTLD_NOW);
        if (!library) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        int (*writer)(int, char **) = (int (*)(int, char **))dlsym(library, "otel_writer_main");
        if (!writer)
            return 1;
        argv[3] = argv[0];
        return writer(argc - 3, argv + 3);
    }
    if (!otel_writer_main) {
        fprintf(stderr, "not linked with the writer library\n");
        return 2;
    }
    return otel_writer_main(argc, argv);
}
