package monitor

import (
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// MaxConns bounds the connections a listener of Listen holds open at once.
// The monitor shares its process's file descriptors with the relay (the
// database, the broker's connection): without a bound, slow or idle clients
// could take every descriptor, and the relay's next reconnection would fail
// with "too many open files". Connections beyond the bound wait in the
// kernel's accept queue, which costs the process no descriptor, until one
// closes; a scrape needs one, a technician's browser a few.
const MaxConns = 32

// Listen listens on addr (TCP), holding at most MaxConns connections open.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return netutil.LimitListener(ln, MaxConns), nil
}

// NewServer is the HTTP server for h: every connection gets deadlines, so
// that one that stalls gives its place back (see MaxConns), and what
// net/http logs (a failed accept, a malformed request) goes to log, in its
// format, at warn level.
func NewServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.With("listener", "monitor").Handler(), slog.LevelWarn),
	}
}
