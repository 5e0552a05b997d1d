// Shared by dwz_a.cpp and dwz_b.cpp: the inline functions and template
// instances both emit identical DWARF for, which `dwz -m` moves into the
// common supplementary file.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace shared {

template <typename T>
inline T checksum(const std::vector<T> &values) {
    T sum = 0;
    for (const T &value : values) {
        sum = sum * 31 + value;
    }
    return sum;
}

inline std::vector<long> sorted_squares(long n) {
    std::vector<long> out;
    for (long i = -n; i < n; i++) {
        out.push_back(i * i);
    }
    std::sort(out.begin(), out.end());
    return out;
}

inline std::map<std::string, long> word_counts(const std::string &text) {
    std::map<std::string, long> counts;
    std::string word;
    for (char c : text) {
        if (c == ' ') {
            counts[word]++;
            word.clear();
        } else {
            word += c;
        }
    }
    counts[word]++;
    return counts;
}

} // namespace shared
