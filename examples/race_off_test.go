//go:build !race

package examples_test

// raceEnabled: this test binary was built without -race.
const raceEnabled = false
