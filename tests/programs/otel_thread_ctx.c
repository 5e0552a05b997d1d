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
 *     3 ms. Each span carries attributes (OTEP 4947's attrs-data):
 *     http.route, "/cart", "/checkout" or a 150-byte route by turns (every
 *     other record ends its page, the next page unmapped), and, once the process
 *     context has been republished with a second key (KEYS_AFTER_NS after
 *     the start), http.method "GET" or "POST". The process context (OTEP
 *     4719, otel_ctx_publish.h) holds the key map: ["http.route"], then
 *     ["http.route", "http.method"]. Each switch is logged, at exit, to LOG
 *     as "tid monotonic_ns state trace_hex span_hex route method", state 1
 *     linked, 0 none, "-" for no attribute; the first line is
 *     "offset REALTIME-MONOTONIC_ns".
 *   otel_thread_ctx --hostile SECONDS
 *     points the variable at unmapped memory and burns CPU.
 *   otel_thread_ctx --no-tls STOP
 *     a thread burns CPU with its thread pointer 0 (as a process's
 *     threads run before its loader sets their TLS up) until STOP exists.
 *   otel_thread_ctx --churn STOP SECONDS
 *     starts short-lived threads, two at a time, each exiting with a span
 *     attached, until STOP exists (at most SECONDS).
 *   otel_thread_ctx --hostile-attrs SECONDS
 *     publishes the key map ["http.route"] and valid records whose
 *     attributes a reader must refuse, by turns: attrs-data-size over the
 *     640-byte record the OTEP recommends; a value that is not UTF-8, a key
 *     index past the map and an entry cut short.
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

#include "otel_ctx_publish.h"
#include "otel_thread_ctx.h"

/* Bytes of the records that end a page (see run): the fixed part and the
 * attributes of their spans, which are short. */
#define SHORT_RECORD (28 + 36)

/* A route longer than the attribute bytes a sampler may read along with
 * the fixed part (hostprof takes 100), so that the rest needs a read of
 * its own. */
static const char LONG_ROUTE[] =
    "/catalog/departments/garden-and-outdoor/categories/watering-equipment/"
    "products/oscillating-sprinkler-with-sixteen-nozzles/reviews/most-helpful";

/* When the key map gains http.method. */
#define KEYS_AFTER_NS 1500000000ull

static const char *const KEYS[] = {"http.route", "http.method"};
/* Keys of the published map: a thread writes only those. */
static _Atomic int published_keys;

__thread struct otel_thread_ctx_record *otel_thread_ctx_v1;

#define SPAN_NS 6000000L
#define GAP_NS 3000000L
#define MAX_SWITCHES 20000

struct switch_log {
    uint64_t ns;
    int state;
    uint8_t trace_id[16];
    uint8_t span_id[8];
    const char *route;
    const char *method;
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

/* REALTIME - MONOTONIC, from the narrowest of a few (monotonic, realtime,
 * monotonic) brackets: a preemption between two reads would shift every
 * logged switch against the samples' times (the agent measures alike). */
static int64_t clock_offset(void) {
    uint64_t best_width = UINT64_MAX;
    int64_t best = 0;
    for (int i = 0; i < 8; i++) {
        uint64_t before = now_ns(CLOCK_MONOTONIC);
        uint64_t real = now_ns(CLOCK_REALTIME);
        uint64_t after = now_ns(CLOCK_MONOTONIC);
        if (after - before < best_width) {
            best_width = after - before;
            best = (int64_t)(real - (before + (after - before) / 2));
        }
    }
    return best;
}

static void burn_until(uint64_t end) {
    while (now_ns(CLOCK_MONOTONIC) < end)
        for (int i = 0; i < 2000; i++)
            sink += (uint64_t)i * 2654435761u;
}

/* Appends one attribute entry (key index, length, UTF-8 bytes). */
static uint16_t put_attr(struct otel_thread_ctx_record *record, uint16_t at, uint8_t key,
                         const char *value) {
    size_t len = strlen(value);
    record->attrs_data[at] = key;
    record->attrs_data[at + 1] = (uint8_t)len;
    memcpy(&record->attrs_data[at + 2], value, len);
    return (uint16_t)(at + 2 + len);
}

static void note(struct thread_arg *arg, int state, const struct otel_thread_ctx_record *record,
                 const char *route, const char *method) {
    if (arg->count >= MAX_SWITCHES)
        return;
    struct switch_log *entry = &arg->log[arg->count++];
    entry->ns = now_ns(CLOCK_MONOTONIC);
    entry->state = state;
    memset(entry->trace_id, 0, sizeof entry->trace_id);
    memset(entry->span_id, 0, sizeof entry->span_id);
    entry->route = route;
    entry->method = method;
    if (record) {
        memcpy(entry->trace_id, record->trace_id, 16);
        memcpy(entry->span_id, record->span_id, 8);
    }
}

static void *run(void *p) {
    struct thread_arg *arg = p;
    arg->tid = gettid();
    /* Two records used in turn: the one being built is never the one
     * the pointer shows. The second ends its page and the next page is
     * not readable: a reader must not read past a record's own bytes. */
    static __thread struct otel_thread_ctx_record first;
    long page = sysconf(_SC_PAGESIZE);
    uint8_t *pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED)
        return NULL;
    mprotect(pages + page, page, PROT_NONE);
    struct otel_thread_ctx_record *records[2] = {
        &first, (struct otel_thread_ctx_record *)(pages + page - SHORT_RECORD)};
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(arg->seconds * 1e9);
    uint64_t serial = 0;
    note(arg, 0, NULL, NULL, NULL);
    while (!stopping && now_ns(CLOCK_MONOTONIC) < end) {
        uint64_t n = serial++;
        struct otel_thread_ctx_record *record = records[n & 1];
        /* Attach: build the record, mark it valid, then point at it. */
        memset(record, 0, n & 1 ? SHORT_RECORD : sizeof *record);
        for (int i = 0; i < 16; i++)
            record->trace_id[i] = (uint8_t)(0x10 * (arg->index + 1) + (serial >> 8) + i);
        for (int i = 0; i < 8; i++)
            record->span_id[i] = (uint8_t)((serial >> (8 * (i % 4))) + 0x40 * (i / 4) + 1);
        record->trace_flags = 1;
        const char *route = n & 1 ? ((n >> 1) & 1 ? "/checkout" : "/cart")
                                  : ((n >> 1) & 1 ? LONG_ROUTE : "/checkout");
        const char *method =
            atomic_load(&published_keys) > 1 ? (serial % 3 ? "GET" : "POST") : NULL;
        uint16_t size = put_attr(record, 0, 0, route);
        if (method)
            size = put_attr(record, size, 1, method);
        record->attrs_data_size = size;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        *(volatile uint8_t *)&record->valid = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = record;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        note(arg, 1, record, route, method);
        burn_until(now_ns(CLOCK_MONOTONIC) + SPAN_NS);
        /* Detach: the pointer back to NULL. */
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = NULL;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        note(arg, 0, NULL, NULL, NULL);
        burn_until(now_ns(CLOCK_MONOTONIC) + GAP_NS);
        /* A record under modification: pointed at, valid = 0. */
        *(volatile uint8_t *)&record->valid = 0;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = record;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        note(arg, 0, NULL, NULL, NULL);
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

/* ProcessContext { resource { service.name }, attributes: the thread
 * context's schema and key map of `keys` keys }. */
static size_t encode_context(uint8_t *out, int keys) {
    uint8_t resource[128];
    size_t resource_len = put_attribute(resource, 1, "service.name", "otel-thread-writer");
    size_t len = put_field(out, 1, resource, resource_len);
    len += put_attribute(out + len, 2, "threadlocal.schema_version", "tls_v1");
    return len + put_key_map(out + len, KEYS, keys);
}

static uint8_t payloads[2][1024];

/* Valid records whose attributes are to be refused, by turns. */
static int hostile_attrs(double seconds) {
    size_t mapping_size;
    publish(payloads[0], encode_context(payloads[0], 1), &mapping_size);
    static struct otel_thread_ctx_record records[2];
    for (int i = 0; i < 2; i++) {
        memset(records[i].trace_id, 0x77, 16);
        memset(records[i].span_id, 0x66 + i, 8);
        records[i].trace_flags = 1;
    }
    /* Over the cap: the kernel must not copy 4000 bytes. */
    records[0].attrs_data_size = 4000;
    /* Not UTF-8; a key index past the map; an entry longer than the rest. */
    const uint8_t bad[] = {0, 2, 0xff, 0xfe, 200, 1, 'x', 0, 30, '/'};
    memcpy(records[1].attrs_data, bad, sizeof bad);
    records[1].attrs_data_size = sizeof bad;
    records[0].valid = records[1].valid = 1;
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    for (unsigned n = 0; now_ns(CLOCK_MONOTONIC) < end; n++) {
        *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = &records[n & 1];
        burn_until(now_ns(CLOCK_MONOTONIC) + GAP_NS);
    }
    return 0;
}

/* A short-lived thread: a span attached, a little work, then its exit
 * with the span still attached (samples of it past exit_mm in do_exit
 * find its memory gone). */
static void *short_lived(void *unused) {
    (void)unused;
    static __thread struct otel_thread_ctx_record record;
    memset(record.trace_id, 0x55, 16);
    memset(record.span_id, 0x44, 8);
    record.trace_flags = 1;
    record.valid = 1;
    *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = &record;
    burn_until(now_ns(CLOCK_MONOTONIC) + 200000);
    return NULL;
}

/* Threads started and joined one after another until STOP exists (at most
 * SECONDS): two at a time, so both CPUs of a small machine see exits. */
static int churn(const char *stop, double seconds) {
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    while (access(stop, F_OK) != 0 && now_ns(CLOCK_MONOTONIC) < end) {
        pthread_t ids[2];
        for (int i = 0; i < 2; i++)
            if (pthread_create(&ids[i], NULL, short_lived, NULL) != 0)
                return 1;
        for (int i = 0; i < 2; i++)
            pthread_join(ids[i], NULL);
    }
    return 0;
}

/* The thread pointer, read and set without libc (which reaches its own
 * data through it). */
static uintptr_t thread_pointer(void) {
    uintptr_t tp = 0;
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(158 /* arch_prctl */), "D"(0x1003 /* ARCH_GET_FS */), "S"(&tp)
                     : "rcx", "r11", "memory");
    (void)ret;
#elif defined(__aarch64__)
    __asm__ volatile("mrs %0, tpidr_el0" : "=r"(tp));
#endif
    return tp;
}

static void set_thread_pointer(uintptr_t tp) {
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(158 /* arch_prctl */), "D"(0x1002 /* ARCH_SET_FS */), "S"(tp)
                     : "rcx", "r11", "memory");
    (void)ret;
#elif defined(__aarch64__)
    __asm__ volatile("msr tpidr_el0, %0" ::"r"(tp));
#endif
}

/* Spins with no thread pointer until `stopping`: no libc call and no
 * stack protector (its canary lives in the TLS) while it is 0. */
__attribute__((noinline, no_stack_protector)) static void *tls_less(void *unused) {
    (void)unused;
    uintptr_t saved = thread_pointer();
    set_thread_pointer(0);
    while (!stopping)
        for (int i = 0; i < 2000; i++)
            sink += (uint64_t)i * 2654435761u;
    set_thread_pointer(saved);
    return NULL;
}

static int no_tls(const char *stop) {
    pthread_t id;
    if (pthread_create(&id, NULL, tls_less, NULL) != 0)
        return 1;
    while (access(stop, F_OK) != 0)
        usleep(10000);
    stopping = 1;
    pthread_join(id, NULL);
    return 0;
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
    if (argc >= 3 && strcmp(argv[1], "--hostile-attrs") == 0)
        return hostile_attrs(atof(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "--no-tls") == 0)
        return no_tls(argv[2]);
    if (argc >= 4 && strcmp(argv[1], "--churn") == 0)
        return churn(argv[2], atof(argv[3]));
    if (argc < 4) {
        fprintf(stderr,
                "usage: %s LOG STOP SECONDS [THREADS] | --hostile[-attrs] SECONDS | --churn STOP "
                "SECONDS | --no-tls STOP\n",
                argv[0]);
        return 2;
    }
    int threads = argc > 4 ? atoi(argv[4]) : 3;
    if (threads < 1 || threads > 16)
        return 2;
    /* The key map before any thread writes a key index. */
    size_t mapping_size;
    struct otel_ctx_header *context =
        publish(payloads[0], encode_context(payloads[0], 1), &mapping_size);
    atomic_store(&published_keys, 1);
    uint64_t mono = now_ns(CLOCK_MONOTONIC);
    int64_t offset = clock_offset();
    struct thread_arg args[16];
    pthread_t ids[16];
    for (int i = 0; i < threads; i++) {
        args[i] = (struct thread_arg){.index = i, .seconds = atof(argv[3])};
        args[i].log = calloc(MAX_SWITCHES, sizeof(struct switch_log));
        pthread_create(&ids[i], NULL, run, &args[i]);
    }
    uint64_t end = mono + (uint64_t)(atof(argv[3]) * 1e9);
    while (access(argv[2], F_OK) != 0 && now_ns(CLOCK_MONOTONIC) < end) {
        /* The key map grows (append-only, as the OTEP says), then
         * threads write the new key. */
        if (atomic_load(&published_keys) == 1 && now_ns(CLOCK_MONOTONIC) - mono >= KEYS_AFTER_NS) {
            republish(context, mapping_size, payloads[1], encode_context(payloads[1], 2));
            atomic_store(&published_keys, 2);
        }
        usleep(10000);
    }
    stopping = 1;
    for (int i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    FILE *out = fopen(argv[1], "w");
    if (!out)
        return 1;
    fprintf(out, "offset %lld\n", (long long)offset);
    for (int i = 0; i < threads; i++) {
        for (int j = 0; j < args[i].count; j++) {
            struct switch_log *entry = &args[i].log[j];
            fprintf(out, "%d %llu %d ", args[i].tid, (unsigned long long)entry->ns, entry->state);
            hex(out, entry->trace_id, 16);
            fputc(' ', out);
            hex(out, entry->span_id, 8);
            fprintf(out, " %s %s\n", entry->route ? entry->route : "-",
                    entry->method ? entry->method : "-");
        }
    }
    return fclose(out) == 0 ? 0 : 1;
}
