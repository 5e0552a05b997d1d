/* A binary that claims to be CPython 3.13, as a hostile or broken tenant's
 * might, for tests/python_hostile.rs. Built as `python3.13` so the agent
 * looks at it; exports what the agent reads (`_PyRuntime` starting with
 * `_Py_DebugOffsets`, `Py_Version`, `PyCode_Type`, `_PyEval_EvalFrameDefault`)
 * and spins in `_PyEval_EvalFrameDefault`.
 *
 *   fake_python offsets   debug offsets and sizes far past any real struct
 *   fake_python cyclic    offsets in range, but the thread's frames form a
 *                         cycle and their code objects hold strings and a
 *                         line table that claim 2^40 bytes
 *   fake_python idle      as cyclic, but no interpreter (interpreters.head
 *                         0): a program that links libpython and never
 *                         starts it, as perf does
 *
 * Prints "ready" once its structures are in place. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((used)) uint64_t _PyRuntime[0x400];
__attribute__((used)) uint32_t Py_Version = 0x030d00f0;
__attribute__((used)) uint64_t PyCode_Type[32];

static uint64_t interpreter[0x200];
static uint64_t thread[0x40];
static uint64_t frame_a[0x20], frame_b[0x20];
static uint64_t code[0x40];
static uint64_t huge_str[8], huge_bytes[8];

__attribute__((noinline, used)) void _PyEval_EvalFrameDefault(void) {
    volatile uint64_t spin = 0;
    for (;;)
        spin++;
}

/* _Py_DebugOffsets of 3.13, by index of its u64 fields (as hostprof's
 * python/layout.rs reads them). */
static void debug_offsets(uint64_t value_for_all) {
    memcpy(&_PyRuntime[0], "xdebugpy", 8);
    _PyRuntime[1] = 0x030d00f0; /* version */
    _PyRuntime[2] = 0;          /* not free-threaded */
    for (int index = 3; index < 64; index++)
        _PyRuntime[index] = value_for_all;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "offsets";
    if (strcmp(mode, "offsets") == 0) {
        debug_offsets(1ull << 40);
    } else {
        debug_offsets(0);
        /* Sizes: runtime, interpreter, thread, frame, code. */
        _PyRuntime[3] = sizeof _PyRuntime;
        _PyRuntime[6] = sizeof interpreter;
        _PyRuntime[19] = sizeof thread;
        _PyRuntime[28] = sizeof frame_a;
        _PyRuntime[34] = sizeof code;
        /* runtime -> interpreter -> thread (the only one). */
        _PyRuntime[5] = 0x1000; /* interpreters.head */
        _PyRuntime[0x1000 / 8] = (uint64_t)interpreter;
        _PyRuntime[9] = 0x10; /* threads.head */
        interpreter[2] = (uint64_t)thread;
        _PyRuntime[21] = 0x8;  /* next */
        _PyRuntime[23] = 0x20; /* current_frame */
        _PyRuntime[25] = 0x30; /* native_thread_id */
        thread[1] = 0;
        thread[4] = (uint64_t)frame_a;
        thread[6] = (uint64_t)syscall(SYS_gettid);
        /* Frames: previous, executable, instr_ptr, owner (0: Python). */
        _PyRuntime[29] = 0x0;
        _PyRuntime[30] = 0x8;
        _PyRuntime[31] = 0x10;
        _PyRuntime[33] = 0x18;
        frame_a[0] = (uint64_t)frame_b;
        frame_b[0] = (uint64_t)frame_a;
        frame_a[1] = frame_b[1] = (uint64_t)code;
        frame_a[2] = frame_b[2] = (uint64_t)code + 0x80;
        /* Code: filename, qualname, linetable, firstlineno, bytecode. */
        _PyRuntime[35] = 0x10;
        _PyRuntime[37] = 0x18;
        _PyRuntime[38] = 0x20;
        _PyRuntime[39] = 0x28;
        _PyRuntime[43] = 0x80;
        code[1] = (uint64_t)PyCode_Type;
        code[2] = code[3] = (uint64_t)huge_str;
        code[4] = (uint64_t)huge_bytes;
        code[5] = 1;
        /* A compact ASCII str of 2^40 characters; bytes of 2^40. */
        huge_str[2] = 1ull << 40;
        huge_str[4] = (1u << 5) | (1u << 6) | (1u << 2);
        huge_bytes[2] = 1ull << 40;
        if (strcmp(mode, "idle") == 0)
            _PyRuntime[0x1000 / 8] = 0;
    }
    printf("ready\n");
    fflush(stdout);
    _PyEval_EvalFrameDefault();
    return 0;
}
