// The Go program of tests/go_labels.rs: one goroutine works in turns
// under pprof.Do with route=/cart (3 units), route=/checkout (1 unit),
// then without labels (1 unit), then under 15 labels (1 unit: more than
// hostprof keeps, a key over its cap, a value cut inside a character),
// in leaf functions of their own so the test
// can tell each sample's turn; runs until the file given as
// its first argument exists, or for the seconds given as its second.
// Built with cgo, the /checkout work runs in C (cgo_on.go): a thread in
// a cgo call runs the scheduler's g0, its labels are its m's curg's.
// cgo_on.go and cgo_off.go keep `// +build` lines beside `//go:build`:
// Go 1.15, which the test builds with too, reads only those.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

// Iterations of one unit of work.
const unit = 2_000_000

var sink uint64

// One spinning function per turn, each a leaf: the test tells a
// sample's turn by its leaf.

//go:noinline
func cartSpin(n int) uint64 {
	x := uint64(n)
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

//go:noinline
func bulkSpin(n int) uint64 {
	x := uint64(n)
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// The bulk turn's labels: 12 short ones, a 70-byte key, a value of 81
// bytes (cut at 64, inside its 32nd two-byte character), and route.
func bulkLabels() pprof.LabelSet {
	pairs := []string{"route", "/bulk", strings.Repeat("k", 70), "long key", "long", "x" + strings.Repeat("é", 40)}
	for i := 0; i < 12; i++ {
		pairs = append(pairs, fmt.Sprintf("k%02d", i), fmt.Sprintf("v%02d", i))
	}
	return pprof.Labels(pairs...)
}

//go:noinline
func plainSpin(n int) uint64 {
	x := uint64(n)
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

func main() {
	stop := os.Args[1]
	seconds, _ := strconv.Atoi(os.Args[2])
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	fmt.Println("cgo", cgoUsed)
	ctx := context.Background()
	bulk := bulkLabels()
	for round := 0; time.Now().Before(deadline); round++ {
		pprof.Do(ctx, pprof.Labels("route", "/cart"), func(context.Context) { sink += cartSpin(3 * unit) })
		pprof.Do(ctx, pprof.Labels("route", "/checkout"), func(context.Context) { sink += checkoutSpin(unit) })
		sink += plainSpin(unit)
		pprof.Do(ctx, bulk, func(context.Context) { sink += bulkSpin(unit) })
		if round%16 == 0 {
			if _, err := os.Stat(stop); err == nil {
				return
			}
		}
	}
}
