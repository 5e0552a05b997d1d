#!/bin/sh
# Regenerates the ELF and .gopclntab seeds in corpus/ (the text seeds are
# written by hand). Small on purpose: shared objects without libc, tiny page
# alignment, no .comment. Needs gcc, g++, binutils, xz, python3.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
programs="$here/../tests/programs"
elf="$here/corpus/elf_symbolize"
go="$here/corpus/gopclntab"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$elf" "$go"
cd "$tmp"

link="-shared -fPIC -nostdlib -Wl,-z,noseparate-code -Wl,-z,max-page-size=0x40 \
 -Wl,-z,common-page-size=0x40 -Wl,-z,norelro -Wl,--build-id -Wl,--hash-style=gnu"
# DWARF 5; DWARF 4 with zlib-compressed sections; C++ with inlined calls;
# stripped (.dynsym only).
gcc -Os -g -gdwarf-5 $link -o sym_dwarf5.so "$programs/sym_target.c"
gcc -Os -g -gdwarf-4 -gz=zlib $link -o sym_dwarf4_zlib.so "$programs/sym_target.c"
g++ -O2 -g $link -o cpp_inlined.so "$programs/cpp_target.cpp"
gcc -Os -s $link -o sym_stripped.so "$programs/sym_target.c"
for so in *.so; do objcopy --remove-section .comment "$so"; done

# MiniDebugInfo: the symbol table, xz-compressed in .gnu_debugdata.
strip --strip-debug sym_dwarf5.so -o nodebug
objcopy --only-keep-debug nodebug mini
xz -c mini > mini.xz
objcopy --add-section .gnu_debugdata=mini.xz sym_stripped.so sym_minidebuginfo.so
# A .gnu_debuglink naming a debug file (not present when fuzzing).
cp sym_dwarf5.so app.debug
objcopy --add-gnu-debuglink=app.debug sym_stripped.so sym_debuglink.so

# Go: a hand-built pclntab (as in gopclntab.rs's unit tests) and build id note.
python3 - <<'PY'
import struct

def table(magic, text_start):
    data = bytearray(struct.pack("<I", magic)) + bytes([0, 0, 1, 8])
    header_end = 8 + 8 * 8
    names = b"main.main\0main.helper\0"
    func_data = header_end + len(names)
    for value in [2, 0, text_start, header_end, 0, 0, 0, func_data]:
        data += struct.pack("<Q", value)
    data += names
    funcs_at = 3 * 8
    for entry, func in [(0, funcs_at), (0x40, funcs_at + 8), (0x100, 0)]:
        data += struct.pack("<II", entry, func)
    for entry, name in [(0, 0), (0x40, 10)]:
        data += struct.pack("<Ii", entry, name)
    return bytes(data)

open("pclntab_120.bin", "wb").write(table(0xFFFFFFF1, 0x401000))
open("pclntab_120_pie.bin", "wb").write(table(0xFFFFFFF1, 0))
open("pclntab_118.bin", "wb").write(table(0xFFFFFFF0, 0x1000))
desc = b"abcdefghijklmnopqrst/uvwxyzABCDEFGHIJKL"
note = struct.pack("<III", 4, len(desc), 4) + b"Go\0\0" + desc
note += b"\0" * (-len(note) % 4)
open("go_note.bin", "wb").write(note)
PY
objcopy --add-section .gopclntab=pclntab_120_pie.bin \
  --add-section .note.go.buildid=go_note.bin sym_stripped.so go_stripped.so

cp sym_dwarf5.so sym_dwarf4_zlib.so cpp_inlined.so sym_stripped.so \
  sym_minidebuginfo.so sym_debuglink.so go_stripped.so "$elf/"
cp pclntab_120.bin pclntab_120_pie.bin pclntab_118.bin "$go/"
mkdir -p "$here/corpus/elf_notes"
cp go_note.bin "$here/corpus/elf_notes/go_buildid"
objcopy -O binary --only-section=.note.gnu.build-id sym_dwarf5.so \
  "$here/corpus/elf_notes/gnu_buildid"

# CPython (python_layout, python_code, python_linetable): _Py_DebugOffsets of
# 3.13 and 3.14 release builds (about: sizes and offsets in range, as the
# unit tests in python/layout.rs), code objects as python/code.rs's tests
# build them, location tables.
PY_CORPUS="$here/corpus" python3 - <<'PY'
import os, struct
corpus = os.environ["PY_CORPUS"]
def write(target, name, data):
    os.makedirs(f"{corpus}/{target}", exist_ok=True)
    open(f"{corpus}/{target}/{name}", "wb").write(data)

def debug_offsets(version, fields):
    values = [0] * 64
    values[1] = version
    for index, value in fields.items():
        values[index] = value
    blob = bytearray(struct.pack("<64Q", *values))
    blob[:8] = b"xdebugpy"
    return bytes(blob)

py313 = {3: 0x50000, 5: 0x620, 6: 0x80000, 9: 0x1c48, 19: 0x150, 21: 8,
         23: 0x48, 25: 0x98, 28: 0x50, 29: 0, 30: 8, 31: 0x38, 33: 0x46,
         34: 0xd0, 35: 0x70, 37: 0x80, 38: 0x88, 39: 0x44, 43: 0xc8}
py314 = {3: 0x60000, 5: 0x7a0, 6: 0x90000, 9: 0x1d08, 22: 0x160, 24: 8,
         26: 0x48, 28: 0x98, 31: 0x50, 32: 0, 33: 8, 34: 0x38, 36: 0x4a,
         39: 0xd8, 40: 0x70, 42: 0x80, 43: 0x88, 44: 0x44, 48: 0xd0}
write("python_layout", "py313", b"\0" + debug_offsets(0x030d00f0, py313))
write("python_layout", "py314", b"\1" + debug_offsets(0x030e00f0, py314))
write("python_layout", "py313_huge_qualname",
      b"\0" + debug_offsets(0x030d00f0, {**py313, 37: 0x80000}))

BASE = 0x1000
def code_object(version, qualname, filename, table):
    # (qualname, filename, firstlineno, linetable, ascii_size) of 3.11, 3.12.
    q, f, first, lt, ascii = {11: (128, 112, 72, 136, 48),
                              12: (128, 112, 68, 136, 40)}[version]
    image = bytearray(0x400 + len(table))
    def put(at, value):
        image[at - BASE:at - BASE + 8] = struct.pack("<Q", value)
    q_at, f_at, t_at = BASE + 0x100, BASE + 0x200, BASE + 0x300
    put(BASE + 8, 0xc0de)
    put(BASE + q, q_at)
    put(BASE + f, f_at)
    put(BASE + lt, t_at)
    image[first:first + 4] = struct.pack("<I", 10)
    for at, text in [(q_at, qualname), (f_at, filename)]:
        put(at + 16, len(text))
        put(at + 32, (1 << 6) | (1 << 5) | (1 << 2))
        image[at - BASE + ascii:at - BASE + ascii + len(text)] = text
    put(t_at + 16, len(table))
    image[t_at - BASE + 32:t_at - BASE + 32 + len(table)] = table
    return bytes([version - 11]) + bytes(image)

table = bytes([0x80 | 1, 0x05, 0x80 | (11 << 3) | 2, 4, 8, 0x80 | (15 << 3),
               0x80 | (13 << 3) | 1, 7])
# A long form (delta 3, end line, columns) and runs of short forms.
long_table = table + bytes([0x80 | (14 << 3) | 3, 6, 0, 4, 9]) \
    + bytes([0x80 | 2, 0x10] * 20)
write("python_code", "py311", code_object(11, b"Class.method", b"/app/main.py", table))
write("python_code", "py312", code_object(12, b"<module>", b"/usr/lib/python3.12/runpy.py", long_table))
write("python_linetable", "short", struct.pack("<I", 10) + table)
write("python_linetable", "long", struct.pack("<I", 1) + long_table)
PY
