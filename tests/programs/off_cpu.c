// Blocks in known ways, in known functions, for designed times. Per round the
// main thread spends ~50 ms in in_sleep (nanosleep), ~30 ms in in_pipe
// (waiting on a pipe a helper fills 30 ms later) and ~20 ms in in_mutex
// (waiting for a mutex a helper holds for 20 ms): shares 50/30/20 %.
// Usage: off_cpu ROUNDS
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pipe_request[2], pipe_reply[2], lock_request[2], lock_taken[2];

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}
}

static void *pipe_helper(void *unused) {
    char c;
    while (read(pipe_request[0], &c, 1) == 1) {
        sleep_ms(30);
        if (write(pipe_reply[1], &c, 1) != 1) exit(1);
    }
    return unused;
}

static void *lock_helper(void *unused) {
    char c;
    while (read(lock_request[0], &c, 1) == 1) {
        pthread_mutex_lock(&lock);
        if (write(lock_taken[1], &c, 1) != 1) exit(1);
        sleep_ms(20);
        pthread_mutex_unlock(&lock);
    }
    return unused;
}

__attribute__((noinline)) void in_sleep(void) { sleep_ms(50); }

__attribute__((noinline)) void in_pipe(void) {
    char c = 'p';
    if (write(pipe_request[1], &c, 1) != 1 || read(pipe_reply[0], &c, 1) != 1) exit(1);
}

__attribute__((noinline)) void in_mutex(void) {
    char c = 'm';
    if (write(lock_request[1], &c, 1) != 1 || read(lock_taken[0], &c, 1) != 1) exit(1);
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    if (pipe(pipe_request) || pipe(pipe_reply) || pipe(lock_request) || pipe(lock_taken)) return 1;
    pthread_t a, b;
    pthread_create(&a, NULL, pipe_helper, NULL);
    pthread_create(&b, NULL, lock_helper, NULL);
    pthread_setname_np(a, "pipe_helper");
    pthread_setname_np(b, "lock_helper");
    for (int i = 0; i < rounds; i++) {
        in_sleep();
        in_pipe();
        in_mutex();
    }
    return 0;
}
