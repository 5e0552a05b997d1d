// A parent that does little itself and forks workers that burn CPU in
// child_work: profiling the command must include its children.
// Usage: forking SECONDS (of each worker's own CPU time)
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void child_work(double seconds) {
    struct timespec start, now;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    // Each worker names itself, so a profile shows which were followed.
    for (int i = 0; i < 2; i++) {
        if (fork() == 0) {
            // A grandchild too: following must be transitive.
            if (i == 1 && fork() == 0) {
                prctl(PR_SET_NAME, "grandchild");
                child_work(seconds);
                _exit(0);
            }
            prctl(PR_SET_NAME, i == 0 ? "child_a" : "child_b");
            child_work(seconds);
            _exit(0);
        }
    }
    while (wait(NULL) > 0) {}
    return 0;
}
