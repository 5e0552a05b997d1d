/* The Thread-Local Context Record of OTEP 4947, byte-packed as the OTEP
 * lays it out, for the test writers (otel_thread_ctx.c, otel_span_lib.c),
 * with room for attributes longer than a reader takes in its first read. */
#ifndef OTEL_THREAD_CTX_H
#define OTEL_THREAD_CTX_H

#include <stdint.h>

struct __attribute__((packed, aligned(8))) otel_thread_ctx_record {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t valid;
    uint8_t trace_flags;
    uint16_t attrs_data_size;
    uint8_t attrs_data[256];
};

#endif
