// A process whose files are hostile to a profiler reading them: it spins in
// a named native function and in JIT code whose perf map
// (/tmp/perf-PID.map) is a FIFO nobody writes (MODE "fifo") or a symlink to
// /dev/zero (MODE "zero"). Prints "ready" once the map is in place.
// Usage: hostile_files MODE SECONDS
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void native_named_spin(void) {
    for (unsigned long i = 0; i < 2000000; i++) sink += i ^ (i >> 3);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "fifo";
    double seconds = argc > 2 ? atof(argv[2]) : 10.0;
    unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    // mov ecx, 0x200000; 1: dec ecx; jnz 1b; ret
    const unsigned char body[] = {0xb9, 0x00, 0x00, 0x20, 0x00, 0xff, 0xc9, 0x75, 0xfc, 0xc3};
    memcpy(code, body, sizeof body);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    unlink(path);
    int made = strcmp(mode, "zero") == 0 ? symlink("/dev/zero", path) : mkfifo(path, 0600);
    if (made != 0) {
        perror(path);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        native_named_spin();
        ((void (*)(void))code)();
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    unlink(path);
    return 0;
}
