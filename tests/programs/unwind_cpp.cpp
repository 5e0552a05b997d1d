// C++ unwinding target without frame pointers: virtual dispatch into a hot
// member function, through a std::function. Usage: unwind_cpp SECONDS
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>

volatile unsigned long sink;

namespace shapes {
struct Shape {
    virtual ~Shape() = default;
    virtual void work() = 0;
};
struct Square : Shape {
    __attribute__((noinline)) void work() override {
        for (unsigned long i = 0; i < 300000; i++) sink += i ^ (i >> 5);
    }
};
}  // namespace shapes

__attribute__((noinline)) void drive(const std::function<void()> &step, double seconds) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) step();
    sink++;
}

int main(int argc, char **argv) {
    std::unique_ptr<shapes::Shape> shape = std::make_unique<shapes::Square>();
    drive([&] { shape->work(); }, argc > 1 ? std::atof(argv[1]) : 2.0);
    return 0;
}
