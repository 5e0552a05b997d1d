// Keeps a secret on its stack while it burns CPU: the string SEED with each
// byte plus one (so the secret itself is in no argument, file or binary).
// Usage: stack_marker SEED SECONDS
#include <stdlib.h>
#include <string.h>
#include <time.h>

volatile unsigned long sink;

__attribute__((noinline)) void spin_with_secret(const volatile char *secret, double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        for (int i = 0; i < 100000; i++) sink += i ^ secret[i & 7];
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    if (argc < 3) return 1;
    volatile char secret[128];
    size_t len = strlen(argv[1]);
    if (len >= sizeof secret) return 1;
    for (size_t i = 0; i < len; i++) secret[i] = argv[1][i] + 1;
    secret[len] = 0;
    spin_with_secret(secret, atof(argv[2]));
    return 0;
}
