#!/usr/bin/env python3
"""Reads a `.otlp.json` file with the OpenTelemetry project's own protobuf
classes (PyPI opentelemetry-proto, none of hostprof's code) and prints what
it holds, one profile after the other:

    profile TYPE UNIT SAMPLES
    leaf COUNT FUNCTION
    ...

SAMPLES counts the samples of the profile (one per timestamp, or the sum of
the values when a sample has values); each `leaf` line counts them by the
name of their leaf function (the first line of the first location of their
stack; `-` when it has none).

Strict: a field the OTLP schema does not have, a value of the wrong type, an
index outside its table or an id that is not hex makes it fail.

Usage: otlp_json_summary.py FILE.otlp.json
"""
import base64
import json
import sys
from collections import Counter

from google.protobuf import json_format
from opentelemetry.proto.profiles.v1development import profiles_pb2

# OTLP/JSON writes these bytes fields as hex where proto3 JSON has base64.
HEX_FIELDS = {"traceId": 16, "spanId": 8, "profileId": 16}

# The profiles layout of OTLP v1.11.0 (the protos hostprof vendors), which
# v1.10.0 renumbered: a decoder from another layout must not pass for this one.
V1_11_SAMPLE_FIELDS = {
    "stack_index": 1,
    "attribute_indices": 2,
    "link_index": 3,
    "values": 4,
    "timestamps_unix_nano": 5,
}


def check_schema():
    fields = profiles_pb2.Sample.DESCRIPTOR.fields_by_name
    found = {name: fields[name].number for name in V1_11_SAMPLE_FIELDS if name in fields}
    if found != V1_11_SAMPLE_FIELDS:
        sys.exit(f"opentelemetry-proto's Sample is not OTLP v1.11.0's: {found}")


def hex_to_base64(node):
    """Rewrites the hex ids of OTLP/JSON as the base64 json_format reads."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in HEX_FIELDS:
                raw = bytes.fromhex(value)
                if len(raw) != HEX_FIELDS[key]:
                    raise ValueError(f"{key} {value!r} is not {HEX_FIELDS[key]} bytes")
                node[key] = base64.b64encode(raw).decode()
            else:
                hex_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            hex_to_base64(item)


def leaf_name(dictionary, stack_index):
    stack = dictionary.stack_table[stack_index]
    if not stack.location_indices:
        return None
    location = dictionary.location_table[stack.location_indices[0]]
    if not location.lines:
        return None
    function = dictionary.function_table[location.lines[0].function_index]
    return dictionary.string_table[function.name_strindex]


def main():
    check_schema()
    with open(sys.argv[1], encoding="utf-8") as file:
        document = json.load(file)
    hex_to_base64(document)
    data = profiles_pb2.ProfilesData()
    json_format.ParseDict(document, data, ignore_unknown_fields=False)
    dictionary = data.dictionary
    strings = dictionary.string_table
    if not strings or strings[0] != "":
        sys.exit("string_table[0] must be the empty string")
    for resource in data.resource_profiles:
        for scope in resource.scope_profiles:
            for profile in scope.profiles:
                leaves = Counter()
                total = 0
                for sample in profile.samples:
                    weight = sum(sample.values) if sample.values else len(sample.timestamps_unix_nano)
                    total += weight
                    leaves[leaf_name(dictionary, sample.stack_index)] += weight
                kind = strings[profile.sample_type.type_strindex]
                unit = strings[profile.sample_type.unit_strindex]
                print(f"profile {kind} {unit} {total}")
                for name, count in leaves.most_common():
                    print(f"leaf {count} {name or '-'}")


if __name__ == "__main__":
    main()
