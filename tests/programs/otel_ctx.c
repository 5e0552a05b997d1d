/* Publishes an OpenTelemetry process context the way OTEP 4719 asks of a
 * writer (opentelemetry-specification, oteps/profiles/4719-process-ctx.md),
 * then burns CPU so a profiler samples it.
 *
 *   otel_ctx NAME INSTANCE SECONDS [REPUBLISH_WHEN NEW_NAME]
 *   otel_ctx --hostile huge|unmapped|loop SECONDS
 *
 * Header (32 bytes): "OTEL_CTX", version 2, payload size, CLOCK_BOOTTIME
 * publication time, payload pointer. Payload: a ProcessContext protobuf
 * whose resource (field 1) holds service.name and service.instance.id,
 * encoded by hand here so the test needs no protobuf library. Once the
 * file REPUBLISH_WHEN exists (the test creates it when it has seen the
 * first name, however far behind a loaded agent runs) it follows the
 * OTEP's updating protocol once, with service.name = NEW_NAME.
 *
 * --hostile publishes what a reader must refuse: a payload size of 100 MiB,
 * a payload pointer into unmapped memory, or a context republished in a
 * tight loop for as long as it runs. */
#include "otel_ctx_publish.h"

#include <unistd.h>

static uint8_t payloads[2][1024];
volatile unsigned long sink;

/* ProcessContext { Resource resource = 1 }. */
static size_t encode(uint8_t *out, const char *name, const char *instance) {
    uint8_t resource[768];
    size_t len = put_attribute(resource, 1, "service.name", name);
    len += put_attribute(resource + len, 1, "service.instance.id", instance);
    return put_field(out, 1, resource, len);
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
    uint64_t start = otel_now_ns(CLOCK_MONOTONIC);
    for (unsigned long n = 0; otel_now_ns(CLOCK_MONOTONIC) - start < seconds * 1e9; n++) {
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
        fprintf(stderr, "usage: %s NAME INSTANCE SECONDS [REPUBLISH_WHEN NEW_NAME]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[3]);
    const char *republish_when = argc > 5 ? argv[4] : NULL;
    size_t mapping_size;
    size_t size = encode(payloads[0], argv[1], argv[2]);
    struct otel_ctx_header *header = publish(payloads[0], size, &mapping_size);
    uint64_t start = otel_now_ns(CLOCK_MONOTONIC);
    int republished = 0;
    for (;;) {
        for (int i = 0; i < 1000000; i++)
            sink += (unsigned long)i * 2654435761u;
        uint64_t elapsed = otel_now_ns(CLOCK_MONOTONIC) - start;
        if (!republished && republish_when && access(republish_when, F_OK) == 0) {
            republish(header, mapping_size, payloads[1], encode(payloads[1], argv[5], argv[2]));
            republished = 1;
        }
        if (elapsed >= seconds * 1e9)
            return 0;
    }
}
