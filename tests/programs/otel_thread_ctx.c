/* An OpenTelemetry thread-context writer (OTEP 4947) for tests/thread_context.rs.
 *
 * `otel_thread_ctx_v1` is a thread-local of this executable (static TLS),
 * exported in .dynsym (build with -Wl,--export-dynamic-symbol=otel_thread_ctx_v1).
 *
 *   otel_thread_ctx LOG STOP SECONDS [THREADS]
 *     THREADS threads (default 3) burn CPU until the file STOP exists (at
 *     most SECONDS), cycling through: a new span attached for 6 ms (a
 *     fresh record, valid = 1, then the pointer), detached (pointer NULL)
 *     for 3 ms, and a record marked under modification (valid = 0) for
 *     3 ms. Each switch is logged, at exit, to LOG as
 *     "tid monotonic_ns state trace_hex span_hex", state 1 linked, 0 none;
 *     the first line is "offset REALTIME-MONOTONIC_ns".
 *   otel_thread_ctx --hostile SECONDS
 *     points the variable at unmapped memory and burns CPU.
 *
 * Timestamps are CLOCK_MONOTONIC: the clock of bpf_ktime_get_ns, which
 * the sampler stamps samples with.
 *
 * Built with -DOTEL_WRITER_LIBRARY -fPIC -shared, the same writer is a
 * library (the variable in its TLS block, reached however -mtls-dialect
 * says) whose entry `otel_writer_main` takes the same arguments; see
 * otel_thread_ctx_main.c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* The record's fixed part, byte-packed as the OTEP lays it out. */
struct __attribute__((packed, aligned(8))) otel_thread_ctx_record {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t valid;
    uint8_t trace_flags;
    uint16_t attrs_data_size;
    uint8_t attrs_data[36];
};

__thread struct otel_thread_ctx_record *otel_thread_ctx_v1;

#define SPAN_NS 6000000L
#define GAP_NS 3000000L
#define MAX_SWITCHES 20000

struct switch_log {
    uint64_t ns;
    int state;
    uint8_t trace_id[16];
    uint8_t span_id[8];
};

struct thread_arg {
    int index;
    double seconds;
    pid_t tid;
    int count;
    struct switch_log *log;
};

static volatile uint64_t sink;
static volatile int stopping;

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void burn_until(uint64_t end) {
    while (now_ns(CLOCK_MONOTONIC) < end)
        for (int i = 0; i < 2000; i++)
            sink += (uint64_t)i * 2654435761u;
}

static void note(struct thread_arg *arg, int state, const struct otel_thread_ctx_record *record) {
    if (arg->count >= MAX_SWITCHES)
        return;
    struct switch_log *entry = &arg->log[arg->count++];
    entry->ns = now_ns(CLOCK_MONOTONIC);
    entry->state = state;
    memset(entry->trace_id, 0, sizeof entry->trace_id);
    memset(entry->span_id, 0, sizeof entry->span_id);
    if (record) {
        memcpy(entry->trace_id, record->trace_id, 16);
        memcpy(entry->span_id, record->span_id, 8);
    }
}

static void *run(void *p) {
    struct thread_arg *arg = p;
    arg->tid = gettid();
    /* Two records used in turn: the one being built is never the one
     * the pointer shows. */
    static __thread struct otel_thread_ctx_record records[2];
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(arg->seconds * 1e9);
    uint64_t serial = 0;
    note(arg, 0, NULL);
    while (!stopping && now_ns(CLOCK_MONOTONIC) < end) {
        struct otel_thread_ctx_record *record = &records[serial & 1];
        serial++;
        /* Attach: build the record, mark it valid, then point at it. */
        memset(record, 0, sizeof *record);
        for (int i = 0; i < 16; i++)
            record->trace_id[i] = (uint8_t)(0x10 * (arg->index + 1) + (serial >> 8) + i);
        for (int i = 0; i < 8; i++)
            record->span_id[i] = (uint8_t)((serial >> (8 * (i % 4))) + 0x40 * (i / 4) + 1);
        record->trace_flags = 1;
        record->attrs_data_size = 0;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        *(volatile uint8_t *)&record->valid = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = record;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        note(arg, 1, record);
        burn_until(now_ns(CLOCK_MONOTONIC) + SPAN_NS);
        /* Detach: the pointer back to NULL. */
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = NULL;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        note(arg, 0, NULL);
        burn_until(now_ns(CLOCK_MONOTONIC) + GAP_NS);
        /* A record under modification: pointed at, valid = 0. */
        *(volatile uint8_t *)&record->valid = 0;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = record;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        note(arg, 0, NULL);
        burn_until(now_ns(CLOCK_MONOTONIC) + GAP_NS);
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = NULL;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void hex(FILE *out, const uint8_t *bytes, int len) {
    for (int i = 0; i < len; i++)
        fprintf(out, "%02x", bytes[i]);
}

#ifdef OTEL_WRITER_LIBRARY
#define main otel_writer_main
int otel_writer_main(int argc, char **argv);
#endif

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--hostile") == 0) {
        long page = sysconf(_SC_PAGESIZE);
        void *gone = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        munmap(gone, page);
        otel_thread_ctx_v1 = gone;
        burn_until(now_ns(CLOCK_MONOTONIC) + (uint64_t)(atof(argv[2]) * 1e9));
        return 0;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: %s LOG STOP SECONDS [THREADS] | --hostile SECONDS\n", argv[0]);
        return 2;
    }
    int threads = argc > 4 ? atoi(argv[4]) : 3;
    if (threads < 1 || threads > 16)
        return 2;
    uint64_t mono = now_ns(CLOCK_MONOTONIC);
    uint64_t real = now_ns(CLOCK_REALTIME);
    struct thread_arg args[16];
    pthread_t ids[16];
    for (int i = 0; i < threads; i++) {
        args[i] = (struct thread_arg){.index = i, .seconds = atof(argv[3])};
        args[i].log = calloc(MAX_SWITCHES, sizeof(struct switch_log));
        pthread_create(&ids[i], NULL, run, &args[i]);
    }
    uint64_t end = mono + (uint64_t)(atof(argv[3]) * 1e9);
    while (access(argv[2], F_OK) != 0 && now_ns(CLOCK_MONOTONIC) < end)
        usleep(10000);
    stopping = 1;
    for (int i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    FILE *out = fopen(argv[1], "w");
    if (!out)
        return 1;
    fprintf(out, "offset %lld\n", (long long)(real - mono));
    for (int i = 0; i < threads; i++) {
        for (int j = 0; j < args[i].count; j++) {
            struct switch_log *entry = &args[i].log[j];
            fprintf(out, "%d %llu %d ", args[i].tid, (unsigned long long)entry->ns, entry->state);
            hex(out, entry->trace_id, 16);
            fputc(' ', out);
            hex(out, entry->span_id, 8);
            fputc('\n', out);
        }
    }
    return fclose(out) == 0 ? 0 : 1;
}
