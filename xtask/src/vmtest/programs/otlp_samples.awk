# The samples of an OTLP/JSON profile (`hostprof record -o X.otlp.json`),
# one line per timestamp: "TID TRACE_HEX SPAN_HEX UNIX_NS", "-" for the
# trace and span of a sample with no link, TID "-" for one without
# thread.id. For the guest's thread-context check, whose busybox has no
# JSON tool.
#
# Input: the JSON's tokens, one a line, as
#   grep -oE '"([^"\\]|\\.)*"|[][{}]|-?[0-9]+' FILE
# (strings, brackets and numbers; colons and commas dropped). The
# tokens are parsed as JSON (keys and values told apart by position), so
# the check does not lean on how hostprof orders or spaces its fields.
# Samples reach their thread and link through the dictionary (after them
# in the file): the thread.id entry of the attribute table among their
# attributeIndices, the link table at their linkIndex.

function unquote(text) {
    sub(/^"/, "", text)
    sub(/"$/, "", text)
    return text
}

# A scalar or a container finished at depth `depth`: the next token is
# its object's next key, or its array's next element.
function finished() {
    if (kind[depth] == "o")
        want_key[depth] = 1
    else
        at[depth]++
}

# Where the container at depth d is: "samples[]" for an element of an
# array named samples, else its key.
function place(d) {
    return name[d] == "[]" ? name[d - 1] "[]" : name[d]
}

$0 == "{" || $0 == "[" {
    parent = depth == 0 ? "" : kind[depth] == "o" ? key[depth] : "[]"
    index_in = depth > 0 && kind[depth] == "a" ? at[depth] : -1
    depth++
    kind[depth] = $0 == "{" ? "o" : "a"
    name[depth] = parent
    slot[depth] = index_in
    want_key[depth] = 1
    at[depth] = 0
    if (place(depth) == "samples[]") {
        sample_depth = depth
        attributes = ""
        link = 0
        stamps = ""
    }
    next
}

$0 == "}" || $0 == "]" {
    if (depth == sample_depth) {
        samples++
        sample_attributes[samples] = attributes
        sample_link[samples] = link
        sample_stamps[samples] = stamps
        sample_depth = -1
    }
    depth--
    if (depth > 0)
        finished()
    next
}

kind[depth] == "o" && want_key[depth] {
    key[depth] = unquote($0)
    want_key[depth] = 0
    next
}

{
    value = unquote($0)
    here = kind[depth] == "o" ? key[depth] : place(depth)
    if (sample_depth > 0 && depth == sample_depth && here == "linkIndex")
        link = value + 0
    else if (sample_depth > 0 && depth == sample_depth + 1 && here == "attributeIndices")
        attributes = attributes " " value
    else if (sample_depth > 0 && depth == sample_depth + 1 && here == "timestampsUnixNano")
        stamps = stamps " " value
    else if (place(depth) == "linkTable[]" && (here == "traceId" || here == "spanId"))
        link_ids[slot[depth], here] = value
    else if (here == "stringTable")
        strings[at[depth]] = value
    else if (place(depth) == "attributeTable[]" && here == "keyStrindex")
        attribute_key[slot[depth]] = value
    else if (name[depth] == "value" && place(depth - 1) == "attributeTable[]" && here == "intValue")
        attribute_int[slot[depth - 1]] = value
    finished()
}

END {
    thread_key = -1
    for (i in strings)
        if (strings[i] == "thread.id")
            thread_key = i
    for (s = 1; s <= samples; s++) {
        tid = "-"
        n = split(sample_attributes[s], list, " ")
        for (i = 1; i <= n; i++)
            if ((list[i] in attribute_key) && attribute_key[list[i]] == thread_key)
                tid = attribute_int[list[i]]
        l = sample_link[s]
        ids = l > 0 ? link_ids[l, "traceId"] " " link_ids[l, "spanId"] : "- -"
        n = split(sample_stamps[s], list, " ")
        for (i = 1; i <= n; i++)
            print tid, ids, list[i]
    }
}
