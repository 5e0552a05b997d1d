// Tries to open BPF maps by id, as an unprivileged process would to tamper
// with a profiler's maps. Prints "ID ok" or "ID errno" per argument.
// Usage: bpf_map_by_id ID...
#include <errno.h>
#include <linux/bpf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        union bpf_attr attr;
        memset(&attr, 0, sizeof attr);
        attr.map_id = (unsigned)strtoul(argv[i], NULL, 10);
        long fd = syscall(__NR_bpf, BPF_MAP_GET_FD_BY_ID, &attr, sizeof attr);
        if (fd >= 0) {
            printf("%s ok\n", argv[i]);
            close((int)fd);
        } else {
            printf("%s %d\n", argv[i], errno);
        }
    }
    return 0;
}
