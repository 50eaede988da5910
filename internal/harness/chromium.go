package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// ChromiumBinary finds Debian's chromium; "" if it is not installed.
func ChromiumBinary() string { return findBinary("chromium") }

// Chromium runs a headless Chromium, one process per call, each with a user
// data directory of its own in the test's directory, and with JavaScript as
// the page allows it.
type Chromium struct {
	tb  TB
	bin string
}

// NewChromium returns a headless Chromium for tb, skipping tb if chromium
// is not installed.
func NewChromium(tb TB) *Chromium {
	tb.Helper()
	bin := ChromiumBinary()
	if bin == "" {
		tb.Skipf("chromium is not installed: apt-get install -y chromium")
	}
	return &Chromium{tb: tb, bin: bin}
}

func (c *Chromium) run(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--user-data-dir=" + c.tb.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, c.bin, argv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("chromium %v: %w\n%s", args, err, tailBytes(errb.Bytes(), 2000))
	}
	return out.Bytes(), nil
}

// DumpDOM loads url and returns the DOM after load, serialised.
func (c *Chromium) DumpDOM(url string, extra ...string) string {
	c.tb.Helper()
	out, err := c.run(30*time.Second, append(extra, "--dump-dom", url)...)
	must(c.tb, err, "chromium --dump-dom")
	return string(out)
}

// Screenshot loads url in a 1200x900 window and writes a PNG to file.
func (c *Chromium) Screenshot(url, file string, extra ...string) {
	c.tb.Helper()
	_, err := c.run(30*time.Second, append(extra, "--hide-scrollbars", "--window-size=1200,900", "--screenshot="+file, url)...)
	must(c.tb, err, "chromium --screenshot")
	fi, err := os.Stat(file)
	must(c.tb, err, "chromium screenshot")
	if fi.Size() == 0 {
		c.tb.Fatalf("chromium wrote an empty screenshot %s", file)
	}
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
