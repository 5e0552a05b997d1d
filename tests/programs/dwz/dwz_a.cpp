// One of two programs sharing common.h, for the dwz (multifile) test.
#include <cstdio>

#include "common.h"

__attribute__((noinline)) long program_a_work(long n) {
    std::vector<long> squares = shared::sorted_squares(n);
    auto counts = shared::word_counts("a b a c b a");
    return shared::checksum(squares) + counts["a"];
}

int main(int argc, char **) {
    std::printf("%ld\n", program_a_work(argc * 1000));
    return 0;
}
