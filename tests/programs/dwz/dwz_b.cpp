// One of two programs sharing common.h, for the dwz (multifile) test.
#include <cstdio>

#include "common.h"

__attribute__((noinline)) long program_b_work(long n) {
    auto counts = shared::word_counts("x y x");
    std::vector<long> squares = shared::sorted_squares(n + counts["x"]);
    std::vector<int> small(squares.begin(), squares.begin() + 3);
    return shared::checksum(squares) ^ shared::checksum(small);
}

int main(int argc, char **) {
    std::printf("%ld\n", program_b_work(argc * 500));
    return 0;
}
