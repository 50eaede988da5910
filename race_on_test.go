//go:build race

package outbox

// raceEnabled: this test binary was built with -race.
const raceEnabled = true
