// Replay target: crashes on purpose so qemu-user writes a core file whose
// registers and stack the host replays through the kernel's unwinder.
// Built -O2 -fomit-frame-pointer -static for x86_64 and aarch64.
// Usage: unwind_replay signal   (crash in a function called by a signal handler)
//        unwind_replay leaf     (crash in a leaf: on aarch64 its return address is in LR)
#include <signal.h>
#include <string.h>

volatile int sink;
volatile int *volatile null_pointer;

__attribute__((noinline)) void crash_here(int n) {
    // A leaf: no call, so no frame on aarch64 and the return address stays in LR.
    *null_pointer = n;
}

__attribute__((noinline)) void in_handler(int n) {
    volatile char pad[32];
    pad[0] = (char)n;
    crash_here(pad[0]);
    sink += pad[1];
}

__attribute__((noinline)) void on_signal(int signo) {
    in_handler(signo);
    sink++;
}

__attribute__((noinline)) void raise_it(void) {
    raise(SIGUSR1);
    sink++;
}

__attribute__((noinline)) void outer(int leaf) {
    volatile char pad[48];
    pad[0] = 1;
    if (leaf) crash_here(pad[0]); else raise_it();
    sink += pad[1];
}

int main(int argc, char **argv) {
    signal(SIGUSR1, on_signal);
    outer(argc > 1 && strcmp(argv[1], "leaf") == 0);
    return sink;
}
