// Two processes bounce a byte over a pair of pipes: a context switch per hop.
// Prints the round trips per second it achieved.
// Usage: pingpong ROUND_TRIPS
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long trips = argc > 1 ? atol(argv[1]) : 100000;
    int ping[2], pong[2];
    if (pipe(ping) || pipe(pong)) return 1;
    char c = 'x';
    if (fork() == 0) {
        for (long i = 0; i < trips; i++)
            if (read(ping[0], &c, 1) != 1 || write(pong[1], &c, 1) != 1) _exit(1);
        _exit(0);
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < trips; i++)
        if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1) return 1;
    clock_gettime(CLOCK_MONOTONIC, &end);
    wait(NULL);
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    printf("%.0f round trips/s\n", trips / seconds);
    return 0;
}
