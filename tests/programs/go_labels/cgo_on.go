//go:build cgo
// +build cgo

package main

// #include <stdint.h>
// __attribute__((noinline)) static uint64_t checkout_spin_c(long n) {
//     uint64_t x = (uint64_t)n;
//     for (long i = 0; i < n; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
//     return x;
// }
import "C"

const cgoUsed = true

func checkoutSpin(n int) uint64 { return uint64(C.checkout_spin_c(C.long(n))) }
