// C++ symbolization target: a namespaced, overloaded function.
#include <cstdio>
#include <unistd.h>

namespace shapes {
__attribute__((noinline)) double area(double radius, int scale) {
    return 3.14159 * radius * radius * scale;
}
__attribute__((noinline)) double area(double side) { return side * side; }
}  // namespace shapes

int main() {
    double (*target)(double, int) = shapes::area;
    std::printf("%p\n", reinterpret_cast<void *>(target));
    std::fflush(stdout);
    volatile double sink = target(2.0, 3) + shapes::area(1.0);
    (void)sink;
    char byte;
    (void)read(0, &byte, 1);
    return 0;
}
