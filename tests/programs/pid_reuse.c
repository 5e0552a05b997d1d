// Runs OLD, then makes NEW run under the very pid OLD had: sets the host's
// ns_last_pid to one below it and forks until a child gets it (other
// processes on the host may take pids in between). Needs root.
// Usage: pid_reuse OLD NEW SECONDS
// Prints "pid P reused" on stderr once NEW runs as P; exits 2 if it never did.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void set_last_pid(pid_t pid) {
    FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
    if (!f) { perror("ns_last_pid"); exit(1); }
    fprintf(f, "%d", pid);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: pid_reuse OLD NEW SECONDS\n"); return 1; }
    pid_t old = fork();
    if (old == 0) {
        execl(argv[1], argv[1], argv[3], (char *)NULL);
        _exit(127);
    }
    waitpid(old, NULL, 0);
    for (int attempt = 0; attempt < 5000; attempt++) {
        set_last_pid(old - 1);
        pid_t child = fork();
        if (child == 0) {
            // Only the child that got the old pid runs NEW.
            if (getpid() == old) execl(argv[2], argv[2], argv[3], (char *)NULL);
            _exit(0);
        }
        waitpid(child, NULL, 0);
        if (child == old) {
            fprintf(stderr, "pid %d reused\n", old);
            return 0;
        }
    }
    fprintf(stderr, "pid %d was never reused\n", old);
    return 2;
}
