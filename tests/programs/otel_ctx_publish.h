/* Publishing an OpenTelemetry process context as OTEP 4719 asks of a
 * writer (opentelemetry-specification, oteps/profiles/4719-process-ctx.md),
 * shared by the test writers (otel_ctx.c, otel_thread_ctx.c).
 *
 * Header (32 bytes): "OTEL_CTX", version 2, payload size, CLOCK_BOOTTIME
 * publication time, payload pointer; the payload a ProcessContext protobuf
 * encoded by hand here, so the tests need no protobuf library. */
#ifndef OTEL_CTX_PUBLISH_H
#define OTEL_CTX_PUBLISH_H

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

static inline uint64_t otel_now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline size_t put_varint(uint8_t *out, uint64_t value) {
    size_t n = 0;
    while (value >= 0x80) {
        out[n++] = (uint8_t)(value | 0x80);
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}

/* A length-delimited field: tag, length, bytes. */
static inline size_t put_field(uint8_t *out, unsigned field, const void *data, size_t len) {
    size_t n = put_varint(out, (field << 3) | 2);
    n += put_varint(out + n, len);
    memcpy(out + n, data, len);
    return n + len;
}

/* KeyValue { key = 1; AnyValue value = 2 { string_value = 1 } } as field
 * `field` (1 in a Resource, 2 for ProcessContext's extra attributes). */
static inline size_t put_attribute(uint8_t *out, unsigned field, const char *key, const char *value) {
    uint8_t any[256], kv[512];
    size_t any_len = put_field(any, 1, value, strlen(value));
    size_t kv_len = put_field(kv, 1, key, strlen(key));
    kv_len += put_field(kv + kv_len, 2, any, any_len);
    return put_field(out, field, kv, kv_len);
}

/* ProcessContext.attributes (field 2) entry
 * `threadlocal.attribute_key_map`: an AnyValue { array_value = 5 {
 * repeated AnyValue values = 1 { string_value = 1 } } } of `count` keys
 * (OTEP 4947). */
static inline size_t put_key_map(uint8_t *out, const char *const *keys, int count) {
    uint8_t array[512], any[600], kv[700], one[128];
    size_t array_len = 0;
    for (int i = 0; i < count; i++) {
        size_t one_len = put_field(one, 1, keys[i], strlen(keys[i]));
        array_len += put_field(array + array_len, 1, one, one_len);
    }
    size_t any_len = put_field(any, 5, array, array_len);
    const char *key = "threadlocal.attribute_key_map";
    size_t kv_len = put_field(kv, 1, key, strlen(key));
    kv_len += put_field(kv + kv_len, 2, any, any_len);
    return put_field(out, 2, kv, kv_len);
}

static inline struct otel_ctx_header *publish(uint8_t *payload, size_t size, size_t *mapping_size) {
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
    header->monotonic_published_at_ns = otel_now_ns(CLOCK_BOOTTIME);
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, header, *mapping_size, "OTEL_CTX");
    return header;
}

static inline void republish(struct otel_ctx_header *header, size_t mapping_size, uint8_t *payload,
                      size_t size) {
    uint64_t before = header->monotonic_published_at_ns;
    header->monotonic_published_at_ns = 0;
    atomic_thread_fence(memory_order_seq_cst);
    header->payload = (uint64_t)(uintptr_t)payload;
    header->payload_size = (uint32_t)size;
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t stamp = otel_now_ns(CLOCK_BOOTTIME);
    header->monotonic_published_at_ns = stamp > before ? stamp : before + 1;
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, header, mapping_size, "OTEL_CTX");
}

#endif
