// C++ naming target, built with -O2 -g: templates, namespaces, methods and
// standard containers, most of it inlined into a few functions.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace inventory {

class Stock {
  public:
    void add(const std::string &name, int count) { items_[name] += count; }
    __attribute__((noinline)) int total() const {
        int sum = 0;
        for (const auto &item : items_) sum += item.second;
        return sum;
    }

  private:
    std::map<std::string, int> items_;
};

template <typename T> __attribute__((noinline)) T largest(std::vector<T> values) {
    std::sort(values.begin(), values.end());
    return values.empty() ? T() : values.back();
}

}  // namespace inventory

int main(int argc, char **argv) {
    inventory::Stock stock;
    std::vector<int> counts;
    for (int i = 0; i < 100 + argc; i++) {
        stock.add("item" + std::to_string(i % 13), i);
        counts.push_back((i * 7919) % 101);
    }
    std::printf("%d %d %s\n", stock.total(), inventory::largest(counts), argv[0]);
    return 0;
}
