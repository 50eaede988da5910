//go:build race

package examples_test

// raceEnabled: this test binary was built with -race, so the examples are
// built with it too.
const raceEnabled = true
