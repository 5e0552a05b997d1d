// Many processes with many executable mappings each, for the unwinder's
// capacity test: maps the first page of its own executable MAPS times
// (executable, at addresses of the kernel's choosing: each its own
// mapping, since their file offsets are not contiguous), then forks
// PROCS children that inherit them, once it has printed "ready" and read
// a line on stdin (so a profiler can select it first and follow its
// children). Each child burns SPIN_MS of CPU (so the sampler sees it and
// asks for its tables), tells the parent, and waits. Once every child has
// spun the parent prints "spun" and waits for its stdin to close, then
// ends the children.
//
// usage: many_maps PROCS MAPS SPIN_MS
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin(double seconds) {
    double end = cpu_now() + seconds;
    volatile unsigned long x = 0;
    while (cpu_now() < end)
        for (int i = 0; i < 1000; i++) x += i;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: many_maps PROCS MAPS SPIN_MS\n");
        return 2;
    }
    int procs = atoi(argv[1]), maps = atoi(argv[2]);
    // A process group of our own: kill(0, ...) must reach only ours.
    if (setpgid(0, 0) != 0) {
        perror("setpgid");
        return 1;
    }
    double spin_s = atof(argv[3]) / 1000.0;
    int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0) {
        perror("open /proc/self/exe");
        return 1;
    }
    for (int i = 0; i < maps; i++) {
        if (mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 1;
    int done[2];
    if (pipe(done) != 0) {
        perror("pipe");
        return 1;
    }
    // Children share the parent's process group: one kill ends them all.
    for (int i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            kill(0, SIGKILL);
            return 1;
        }
        if (pid == 0) {
            close(done[0]);
            spin(spin_s);
            char byte = 1;
            if (write(done[1], &byte, 1) != 1) _exit(1);
            for (;;) pause();
        }
    }
    close(done[1]);
    char byte;
    for (int i = 0; i < procs; i++) {
        if (read(done[0], &byte, 1) != 1) {
            fprintf(stderr, "a child died\n");
            kill(0, SIGKILL);
            return 1;
        }
    }
    printf("spun\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    signal(SIGTERM, SIG_IGN);
    kill(0, SIGTERM);
    return 0;
}
