//go:build !race

package outbox

// raceEnabled: this test binary was built without -race.
const raceEnabled = false
