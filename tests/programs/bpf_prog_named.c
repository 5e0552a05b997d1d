// Loads a tiny BPF socket filter named "hp_named_prog" and prints, as the
// kernel reports them, where its JIT-compiled code is and its tag:
// "ADDRESS LENGTH TAG NAME" (hex address, decimal length, hex tag). Keeps the
// program loaded until stdin closes.
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    struct bpf_insn insns[] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = 0},
        {.code = BPF_JMP | BPF_EXIT},
    };
    union bpf_attr load;
    memset(&load, 0, sizeof load);
    load.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;
    load.insn_cnt = sizeof insns / sizeof insns[0];
    load.insns = (uintptr_t)insns;
    load.license = (uintptr_t) "GPL";
    strncpy(load.prog_name, "hp_named_prog", sizeof load.prog_name - 1);
    long fd = syscall(__NR_bpf, BPF_PROG_LOAD, &load, sizeof load);
    if (fd < 0) {
        perror("BPF_PROG_LOAD");
        return 1;
    }
    uint64_t ksym = 0;
    uint32_t length = 0;
    struct bpf_prog_info info;
    memset(&info, 0, sizeof info);
    info.nr_jited_ksyms = 1;
    info.jited_ksyms = (uintptr_t)&ksym;
    info.nr_jited_func_lens = 1;
    info.jited_func_lens = (uintptr_t)&length;
    union bpf_attr get;
    memset(&get, 0, sizeof get);
    get.info.bpf_fd = (uint32_t)fd;
    get.info.info_len = sizeof info;
    get.info.info = (uintptr_t)&info;
    if (syscall(__NR_bpf, BPF_OBJ_GET_INFO_BY_FD, &get, sizeof get) < 0) {
        perror("BPF_OBJ_GET_INFO_BY_FD");
        return 1;
    }
    printf("%llx %u ", (unsigned long long)ksym, length);
    for (size_t i = 0; i < sizeof info.tag; i++) printf("%02x", info.tag[i]);
    printf(" %s\n", info.name);
    fflush(stdout);
    char byte;
    (void)read(0, &byte, 1);
    return 0;
}
