// vmtest's off-CPU target: main -> block_here, which sleeps 20 ms at a time
// until killed. Built -O2 -fomit-frame-pointer -static like the CPU target.
#include <time.h>

__attribute__((noinline)) void block_here(void) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, 0);
    __asm__ volatile("" ::: "memory"); // not a tail call: keep the frame
}

int main(void) {
    for (;;) block_here();
}
