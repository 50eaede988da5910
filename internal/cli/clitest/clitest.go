// Package clitest runs a command's tests against its built binary, so that
// every subcommand is exercised as an operator runs it: flags, output, exit
// status.
package clitest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Main is a command's TestMain: it builds the command in the test's
// directory to *binary, runs the tests, removes the binary and returns the
// exit status for os.Exit.
func Main(m *testing.M, binary *string) int {
	dir, err := os.MkdirTemp("", "clitest-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	wd, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	*binary = filepath.Join(dir, filepath.Base(wd))
	out, err := exec.Command("go", "build", "-o", *binary, ".").CombinedOutput()
	if err != nil {
		panic(fmt.Sprintf("go build: %v\n%s", err, out))
	}
	return m.Run()
}

// Result is what a run of the binary printed and its exit status.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Run runs binary with args, for at most a minute, and returns what it
// printed and its exit status.
func Run(t testing.TB, binary string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return Result{stdout.String(), stderr.String(), code}
}
