// C++ unwinding target without frame pointers: virtual dispatch into a hot
// member function, through a std::function. Usage: unwind_cpp SECONDS (of
// its own CPU time: a busy machine makes it run longer, not give fewer samples)
#include <cstdlib>
#include <ctime>
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

static double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void drive(const std::function<void()> &step, double seconds) {
    double end = cpu_now() + seconds;
    while (cpu_now() < end) step();
    sink++;
}

int main(int argc, char **argv) {
    std::unique_ptr<shapes::Shape> shape = std::make_unique<shapes::Square>();
    drive([&] { shape->work(); }, argc > 1 ? std::atof(argv[1]) : 2.0);
    return 0;
}
