// Blocks in known ways, in known functions, for designed times. Per round the
// main thread spends ~50 ms in in_sleep (nanosleep), ~30 ms in in_pipe
// (waiting on a pipe a helper fills 30 ms later) and ~20 ms in in_lock
// (waiting on a futex lock a helper holds for 20 ms): shares 50/30/20 %.
// The blocking system calls are made inline: libc's wrappers have no frame
// pointer, which would hide the calling function from the stack.
// Usage: off_cpu ROUNDS
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int pipe_request[2], pipe_reply[2], lock_request[2], lock_taken[2];
static volatile int lock_word;

static inline long syscall3(long number, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(number), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}

static inline long syscall4(long number, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return ret;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
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
        __atomic_store_n(&lock_word, 1, __ATOMIC_SEQ_CST);
        if (write(lock_taken[1], &c, 1) != 1) exit(1);
        sleep_ms(20);
        __atomic_store_n(&lock_word, 0, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &lock_word, FUTEX_WAKE_PRIVATE, 1, NULL);
    }
    return unused;
}

__attribute__((noinline)) void in_sleep(void) {
    struct timespec ts = {0, 50 * 1000000L};
    while (syscall3(SYS_nanosleep, (long)&ts, (long)&ts, 0) != 0) {}
}

__attribute__((noinline)) void in_pipe(void) {
    char c = 'p';
    if (write(pipe_request[1], &c, 1) != 1) exit(1);
    while (syscall3(SYS_read, pipe_reply[0], (long)&c, 1) != 1) {}
}

__attribute__((noinline)) void in_lock(void) {
    char c = 'm';
    if (write(lock_request[1], &c, 1) != 1 || read(lock_taken[0], &c, 1) != 1) exit(1);
    while (__atomic_load_n(&lock_word, __ATOMIC_SEQ_CST) != 0)
        syscall4(SYS_futex, (long)&lock_word, FUTEX_WAIT_PRIVATE, 1, 0);
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
        in_lock();
    }
    return 0;
}
