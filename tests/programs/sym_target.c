// Symbolization target: an inlined helper inside a non-inlined function.
// Prints the address of outer_function, then waits for stdin to close.
#include <stdio.h>
#include <unistd.h>

static volatile unsigned long sink;

static inline __attribute__((always_inline)) unsigned long inlined_helper(unsigned long x) {
    for (unsigned long i = 0; i < x; i++) {
        sink += i * 3;
    }
    return sink;
}

__attribute__((noinline)) unsigned long outer_function(unsigned long x) {
    sink += 1;
    return inlined_helper(x) + 7;
}

int main(void) {
    printf("%p\n", (void *)outer_function);
    fflush(stdout);
    outer_function(10);
    char byte;
    (void)read(0, &byte, 1);
    return 0;
}
