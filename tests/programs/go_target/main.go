// Go symbolization target: prints the entry address of busyWork, then waits
// for stdin to close.
package main

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
)

//go:noinline
func busyWork(n int) int {
	sum := 0
	for i := 0; i < n; i++ {
		sum += i * i
	}
	return sum
}

func main() {
	fmt.Printf("0x%x\n", reflect.ValueOf(busyWork).Pointer())
	busyWork(10)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}
