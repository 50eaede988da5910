package monitor

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox"
)

// TestStatusPageEscapes: every string the page shows comes from the outbox,
// the relay, a broker or the request, and none of it can add markup.
func TestStatusPageEscapes(t *testing.T) {
	const evil = `<i>"x'&+`
	d := statusData{
		Source: evil, Version: evil, HasRelay: true, Since: evil, Protocol: evil, Ready: evil,
		Pending: 1, Oldest: evil, LastError: evil, LastErrorAt: evil, BrokerSays: evil, NoSubscribers: evil, DeadCount: 2, Notice: evil, Now: evil, Err: evil,
		Dead: []outbox.Record{{ID: evil, Topic: evil, LastError: evil}},
	}
	var b strings.Builder
	require.NoError(t, writeStatus(&b, d))
	page := b.String()
	require.NotContains(t, page, "<i>")
	require.Equal(t, 16, strings.Count(page, "&lt;i&gt;&#34;x&#39;&amp;&#43;"), "every field shown, escaped:\n%s", page)
}
