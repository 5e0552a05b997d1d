// Spends most of its time in the kernel: one-byte writes to /dev/null.
// Usage: syscall_heavy SECONDS
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) void write_bytes(int fd, int count) {
    char byte = 'x';
    for (int i = 0; i < count; i++) {
        if (write(fd, &byte, 1) != 1) exit(1);
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0) return 1;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        write_bytes(fd, 10000);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    return 0;
}
