//go:build !linux || arm

// Command powerfs serves the power-loss file system for tests; it runs only
// on Linux other than arm (go-fuse does not build for GOARCH=arm).
package main

import (
	"fmt"
	"os"
	"runtime"
)

func main() {
	fmt.Printf("error powerfs does not run on %s/%s\n", runtime.GOOS, runtime.GOARCH)
	os.Exit(2)
}
