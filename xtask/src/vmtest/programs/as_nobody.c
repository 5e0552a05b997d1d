// as_nobody COMMAND ARGS...: runs COMMAND as uid and gid 65534 without
// supplementary groups (busybox has no setpriv), for vmtest's check that
// an unprivileged hostprof fails with one clear line.
#include <grp.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: as_nobody COMMAND ARGS...\n");
        return 127;
    }
    if (setgroups(0, NULL) || setgid(65534) || setuid(65534)) {
        perror("as_nobody");
        return 127;
    }
    execv(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
