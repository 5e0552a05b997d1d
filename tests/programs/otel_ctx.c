/* Publishes an OpenTelemetry process context the way OTEP 4719 asks of a
 * writer (opentelemetry-specification, oteps/profiles/4719-process-ctx.md),
 * then burns CPU so a profiler samples it.
 *
 *   otel_ctx NAME INSTANCE SECONDS [REPUBLISH_MS NEW_NAME]
 *   otel_ctx --hostile huge|unmapped|loop SECONDS
 *
 * Header (32 bytes): "OTEL_CTX", version 2, payload size, CLOCK_BOOTTIME
 * publication time, payload pointer. Payload: a ProcessContext protobuf
 * whose resource (field 1) holds service.name and service.instance.id,
 * encoded by hand here so the test needs no protobuf library. After
 * REPUBLISH_MS milliseconds it follows the OTEP's updating protocol once,
 * with service.name = NEW_NAME.
 *
 * --hostile publishes what a reader must refuse: a payload size of 100 MiB,
 * a payload pointer into unmapped memory, or a context republished in a
 * tight loop for as long as it runs. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

struct otel_ctx_header {
    char signature[8];
    uint32_t version;
    uint32_t payload_size;
    uint64_t monotonic_published_at_ns;
    uint64_t payload;
};

_Static_assert(sizeof(struct otel_ctx_header) == 32, "the OTEP's header is 32 bytes");

static uint8_t payloads[2][1024];
volatile unsigned long sink;

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static size_t put_varint(uint8_t *out, uint64_t value) {
    size_t n = 0;
    while (value >= 0x80) {
        out[n++] = (uint8_t)(value | 0x80);
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}

/* A length-delimited field: tag, length, bytes. */
static size_t put_field(uint8_t *out, unsigned field, const void *data, size_t len) {
    size_t n = put_varint(out, (field << 3) | 2);
    n += put_varint(out + n, len);
    memcpy(out + n, data, len);
    return n + len;
}

/* KeyValue { key = 1; AnyValue value = 2 { string_value = 1 } }. */
static size_t put_attribute(uint8_t *out, const char *key, const char *value) {
    uint8_t any[256], kv[512];
    size_t any_len = put_field(any, 1, value, strlen(value));
    size_t kv_len = put_field(kv, 1, key, strlen(key));
    kv_len += put_field(kv + kv_len, 2, any, any_len);
    return put_field(out, 1, kv, kv_len); /* Resource.attributes = 1 */
}

/* ProcessContext { Resource resource = 1 }. */
static size_t encode(uint8_t *out, const char *name, const char *instance) {
    uint8_t resource[768];
    size_t len = put_attribute(resource, "service.name", name);
    len += put_attribute(resource + len, "service.instance.id", instance);
    return put_field(out, 1, resource, len);
}

static struct otel_ctx_header *publish(uint8_t *payload, size_t size, size_t *mapping_size) {
    *mapping_size = (size_t)sysconf(_SC_PAGESIZE);
    struct otel_ctx_header *header = MAP_FAILED;
    int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
    if (fd < 0)
        fd = memfd_create("OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)*mapping_size) == 0)
            header = mmap(NULL, *mapping_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        close(fd);
    }
    if (header == MAP_FAILED)
        header = mmap(NULL, *mapping_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (header == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    madvise(header, *mapping_size, MADV_DONTFORK);
    memcpy(header->signature, "OTEL_CTX", 8);
    header->version = 2;
    header->payload_size = (uint32_t)size;
    header->payload = (uint64_t)(uintptr_t)payload;
    atomic_thread_fence(memory_order_seq_cst);
    header->monotonic_published_at_ns = now_ns(CLOCK_BOOTTIME);
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, header, *mapping_size, "OTEL_CTX");
    return header;
}

static void republish(struct otel_ctx_header *header, size_t mapping_size, uint8_t *payload,
                      size_t size) {
    uint64_t before = header->monotonic_published_at_ns;
    header->monotonic_published_at_ns = 0;
    atomic_thread_fence(memory_order_seq_cst);
    header->payload = (uint64_t)(uintptr_t)payload;
    header->payload_size = (uint32_t)size;
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t stamp = now_ns(CLOCK_BOOTTIME);
    header->monotonic_published_at_ns = stamp > before ? stamp : before + 1;
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, header, mapping_size, "OTEL_CTX");
}

static int hostile(const char *kind, double seconds) {
    size_t mapping_size;
    size_t size = encode(payloads[0], "hostile", "hostile");
    encode(payloads[1], "hostile-too", "hostile");
    uint8_t *where = payloads[0];
    if (strcmp(kind, "huge") == 0)
        size = 100u << 20;
    else if (strcmp(kind, "unmapped") == 0)
        where = (uint8_t *)16;
    struct otel_ctx_header *header = publish(where, size, &mapping_size);
    int loop = strcmp(kind, "loop") == 0;
    uint64_t start = now_ns(CLOCK_MONOTONIC);
    for (unsigned long n = 0; now_ns(CLOCK_MONOTONIC) - start < seconds * 1e9; n++) {
        if (loop)
            republish(header, mapping_size, payloads[n & 1], size);
        else
            sink += n * 2654435761u;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--hostile") == 0)
        return hostile(argv[2], atof(argv[3]));
    if (argc < 4) {
        fprintf(stderr, "usage: %s NAME INSTANCE SECONDS [REPUBLISH_MS NEW_NAME]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[3]);
    long republish_ms = argc > 5 ? atol(argv[4]) : -1;
    size_t mapping_size;
    size_t size = encode(payloads[0], argv[1], argv[2]);
    struct otel_ctx_header *header = publish(payloads[0], size, &mapping_size);
    uint64_t start = now_ns(CLOCK_MONOTONIC);
    int republished = 0;
    for (;;) {
        for (int i = 0; i < 1000000; i++)
            sink += (unsigned long)i * 2654435761u;
        uint64_t elapsed = now_ns(CLOCK_MONOTONIC) - start;
        if (!republished && republish_ms >= 0 && elapsed >= (uint64_t)republish_ms * 1000000u) {
            republish(header, mapping_size, payloads[1], encode(payloads[1], argv[5], argv[2]));
            republished = 1;
        }
        if (elapsed >= seconds * 1e9)
            return 0;
    }
}
