package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// size builds outboxctl, a minimal program using the library, and the
// floor (a program that links only SQLite, paho and backoff) stripped, for
// each target, and reports their sizes.
func (r *runner) size(ctx context.Context) error {
	if !r.sz.sizeBuild {
		r.rep.missing[6] = "skipped in " + string(r.cfg.Mode) + " mode (three programs × three targets to build)"
		return nil
	}
	goBin, _ := exec.LookPath("go")
	if goBin == "" {
		if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
			goBin = "/usr/local/go/bin/go"
		}
	}
	if goBin == "" {
		r.rep.missing[6] = "no Go toolchain in PATH"
		return nil
	}
	src := r.cfg.SrcDir
	if src == "" {
		src, _ = os.Getwd()
	}
	cmd := exec.CommandContext(ctx, goBin, "list", "-m")
	cmd.Dir = src
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "github.com/edgeoutbox/outbox" {
		r.rep.missing[6] = fmt.Sprintf("%s is not the outbox module's root (run from the repository, or pass --src)", src)
		return nil
	}
	targets := []struct{ key, goarch, goarm string }{{"amd64", "amd64", ""}, {"arm64", "arm64", ""}, {"armv7", "arm", "7"}}
	progs := []struct{ key, pkg string }{{"outboxctl", "./cmd/outboxctl"}, {"library", "./internal/sizeprobe/library"}, {"floor", "./internal/sizeprobe/floor"}}
	var building time.Duration
	for _, t := range targets {
		if r.cfg.Mode != Full && t.key != "amd64" && building > 40*time.Second {
			// A cold build cache (the first cross-build of SQLite takes about
			// a minute per target here) would break the quick mode's budget.
			r.rep.note(6, "%s: not built, the build cache was cold (%.0f s already spent building); run again, or with --full.", t.key, building.Seconds())
			continue
		}
		for _, p := range progs {
			bin := filepath.Join(r.dir, "size-"+p.key+"-"+t.key)
			start := time.Now()
			cmd := exec.CommandContext(ctx, goBin, "build", "-ldflags=-s -w", "-o", bin, p.pkg)
			cmd.Dir = src
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+t.goarch, "GOARM="+t.goarm)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go build %s for %s: %v\n%s", p.pkg, t.key, err, out)
			}
			fi, err := os.Stat(bin)
			if err != nil {
				return err
			}
			os.Remove(bin)
			r.rep.set(fmt.Sprintf("size_%s_%s_bytes", p.key, t.key), fi.Size())
			building += time.Since(start)
			r.progress("  %s %s: %d bytes (built in %.1f s)", p.key, t.key, fi.Size(), time.Since(start).Seconds())
		}
	}
	r.rep.note(6, "`CGO_ENABLED=0 go build -ldflags='-s -w'` for linux/amd64, linux/arm64 and linux/arm GOARM=7. "+
		"Library: [internal/sizeprobe/library](internal/sizeprobe/library/main.go), an app that opens an outbox, enqueues in its transaction and runs the MQTT relay. "+
		"Floor: [internal/sizeprobe/floor](internal/sizeprobe/floor/main.go), which uses only the library's three runtime dependencies (modernc.org/sqlite, paho, cenkalti/backoff). "+
		"outboxctl also carries cobra and, for `demo` and `bench`, the mochi broker.")
	return nil
}
