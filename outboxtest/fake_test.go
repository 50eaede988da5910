package outboxtest_test

import (
	"testing"

	"github.com/edgeoutbox/outbox/outboxtest"
)

// TestFake runs the suite against the FakeBroker, once for each way it can
// refuse a publish.
func TestFake(t *testing.T) {
	for _, mode := range []outboxtest.RefusalMode{outboxtest.RefusedForGood, outboxtest.RefusedForNow,
		outboxtest.RefusedByClosing, outboxtest.AckedAndDropped} {
		t.Run(mode.String(), func(t *testing.T) { outboxtest.Run(t, fakeTransport(mode)) })
	}
}
