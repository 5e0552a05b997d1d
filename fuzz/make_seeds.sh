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
