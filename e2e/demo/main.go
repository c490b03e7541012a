// Command demo walks through resclass's scenarios and prints what happens: `make demo`.
package main

import (
	"fmt"
	"os"
)

func main() {
	// Run from the repository root, as `make demo` does.
	if err := run(os.Stdout, "."); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
