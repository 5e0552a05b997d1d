/* An OpenTelemetry thread-context writer (OTEP 4947) as a library, for
 * tests/python_context.rs: a Python program loads it with ctypes (dlopen:
 * the variable sits in dynamic TLS), publishes the process context (OTEP
 * 4719, key map ["http.route"]) and attaches one span to its own thread
 * before it recurses deep in Python code. Deep enough that the sample's
 * runtime frames fill the record: the attributes must then be moved to
 * the ring through the sampler's scratch (they would overlap themselves).
 *
 *   otel_span_publish()        publish the process context
 *   otel_span_attach(route)    attach the span (trace a0..af, span b0..b7)
 *                              with http.route = route (at most 250 bytes)
 *                              to the calling thread
 *
 * Built with -DCONTEXT_ONLY: the process context's half alone (no
 * thread-context variable, no otel_span_attach), an SDK's part that
 * publishes before the library with the variable is loaded. With
 * -DSCHEMA='"name"': the context names that threadlocal.schema_version
 * instead of the OTEP's tls_v1. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>

#include "otel_ctx_publish.h"
#include "otel_thread_ctx.h"

#ifndef SCHEMA
#define SCHEMA "tls_v1"
#endif

static uint8_t payload[512];

void otel_span_publish(void) {
    static const char *const keys[] = {"http.route"};
    uint8_t resource[128];
    size_t resource_len = put_attribute(resource, 1, "service.name", "deep-python");
    size_t len = put_field(payload, 1, resource, resource_len);
    len += put_attribute(payload + len, 2, "threadlocal.schema_version", SCHEMA);
    len += put_key_map(payload + len, keys, 1);
    size_t mapping_size;
    publish(payload, len, &mapping_size);
}

#ifndef CONTEXT_ONLY
__thread struct otel_thread_ctx_record *otel_thread_ctx_v1;
static __thread struct otel_thread_ctx_record record;

void otel_span_attach(const char *route) {
    memset(&record, 0, sizeof record);
    for (int i = 0; i < 16; i++)
        record.trace_id[i] = (uint8_t)(0xa0 + i);
    for (int i = 0; i < 8; i++)
        record.span_id[i] = (uint8_t)(0xb0 + i);
    record.trace_flags = 1;
    size_t len = strlen(route);
    if (len > 250)
        len = 250;
    record.attrs_data[0] = 0;
    record.attrs_data[1] = (uint8_t)len;
    memcpy(&record.attrs_data[2], route, len);
    record.attrs_data_size = (uint16_t)(2 + len);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    *(volatile uint8_t *)&record.valid = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    *(struct otel_thread_ctx_record *volatile *)&otel_thread_ctx_v1 = &record;
}
#endif
