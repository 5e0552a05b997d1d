// A toy JIT: copies a `ret` into anonymous executable memory and describes
// it in /tmp/perf-PID.map, as V8 or the JVM would. Prints the code's address,
// then waits for stdin to close.
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(void) {
    unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(code, 0xc3, 4096);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    if (!map) {
        perror(path);
        return 1;
    }
    fprintf(map, "%lx 40 jit_compiled_function\n", (unsigned long)code + 0x100);
    fclose(map);
    printf("%p\n", (void *)(code + 0x110));
    fflush(stdout);
    char byte;
    (void)read(0, &byte, 1);
    unlink(path);
    return 0;
}
