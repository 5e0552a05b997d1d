# Judges the links of the thread-context writer's samples against what
# its threads published: `awk -f thread_links.awk LOG SAMPLES` prints
# "samples=N in_threads=N linked=N good=N foreign=N unknown=N outside=N
# outside_us=N outside_side=before|after|- threads=N" (outside_us: how far
# past its span's edge, in µs, the farthest outside sample was).
#
# LOG is the writer's switch log (tests/programs/otel_thread_ctx.c):
# "offset REALTIME-MONOTONIC_ns", then per thread, in order, "tid
# monotonic_ns state trace_hex span_hex route method" (state 1: a span
# attached). SAMPLES is otlp_samples.awk's "tid trace span unix_ns".
#
# Of the linked samples: good, the thread's own span; foreign, a span
# another thread published; unknown, a span no thread published. Outside:
# good ones taken, give or take SLACK_NS (the agent's clock offset and the
# writer's are two readings), before the thread's previous switch or after
# the span's end. The writer stamps a switch just after writing the
# pointer, and may be preempted in between: a sample can precede its
# span's own stamp, never the stamp before it. in_threads:
# the samples of the writer's span-switching threads (not of its main
# thread, which only waits, then writes the log); threads: how many of
# them have samples.

BEGIN {
    SLACK_NS = 1000000
}

FNR == NR && $1 == "offset" {
    offset = $2
    next
}

FNR == NR {
    # A switch ends the thread's previous span.
    if (previous_tid == $1 && open_span != "")
        span_end[open_span] = $2
    open_span = ""
    before = previous_tid == $1 ? previous_ns : $2
    previous_tid = $1
    previous_ns = $2
    writer[$1] = 1
    if ($3 == 1) {
        span = $1 " " $4 " " $5
        span_start[span] = before
        owner[$4 " " $5] = $1
        open_span = span
    }
    next
}

{
    samples++
    if ($1 in writer) {
        seen[$1] = 1
        in_threads++
    }
    if ($2 == "-")
        next
    linked++
    span = $1 " " $2 " " $3
    if (!(span in span_start)) {
        if (($2 " " $3) in owner)
            foreign++
        else
            unknown++
        next
    }
    good++
    at = $4 - offset
    early = span_start[span] - at
    late = (span in span_end) ? at - span_end[span] : 0
    if (early > SLACK_NS || late > SLACK_NS) {
        outside++
        # How far out the worst one was, and on which side: a clock
        # misread shifts every sample alike, a misattributed one does not.
        excess = early > late ? early : late
        if (excess > outside_ns) {
            outside_ns = excess
            outside_side = early > late ? "before" : "after"
        }
    }
}

END {
    for (tid in seen)
        threads++
    printf "samples=%d in_threads=%d linked=%d good=%d foreign=%d unknown=%d outside=%d outside_us=%d outside_side=%s threads=%d\n",
        samples, in_threads, linked, good, foreign, unknown, outside, outside_ns / 1000, outside ? outside_side : "-", threads
}
