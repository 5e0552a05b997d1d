//go:build !cgo
// +build !cgo

package main

const cgoUsed = false

//go:noinline
func checkoutSpin(n int) uint64 {
	x := uint64(n)
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}
