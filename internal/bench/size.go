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

// sizePrograms are the programs section 6 builds, floor last: the ratios
// divide by it.
var sizePrograms = []struct {
	key, name, pkg string
	arm64Max       float64 // the target of its ratio to the floor on arm64; 0: none
}{
	{"outboxctl", "outboxctl (what a till runs)", "./cmd/outboxctl", 1.50},
	{"outboxlab", "outboxlab (demo, bench, fleet)", "./cmd/outboxlab", 0},
	{"library", "a minimal program using the library", "./internal/sizeprobe/library", 1.10},
	{"floor", "floor: SQLite + paho + backoff only", "./internal/sizeprobe/floor", 0},
}

// sizeTargets are the platforms section 6 builds for.
var sizeTargets = []struct{ key, goarch, goarm string }{{"amd64", "amd64", ""}, {"arm64", "arm64", ""}, {"armv7", "arm", "7"}}

// size builds outboxctl (what a till runs), outboxlab (what a developer
// runs), a minimal program using the library, and the floor (a program
// that links only SQLite, paho and backoff) stripped, for each target, and
// reports their sizes and each one's ratio to the floor.
func (r *runner) size(ctx context.Context) error {
	if !r.sz.sizeBuild {
		r.rep.missing[6] = "skipped in " + string(r.cfg.Mode) + " mode (four programs × three targets to build)"
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
	var building time.Duration
	for _, t := range sizeTargets {
		if r.cfg.Mode != Full && t.key != "amd64" && building > 40*time.Second {
			// A cold build cache (the first cross-build of SQLite takes about
			// a minute per target here) would break the quick mode's budget.
			r.rep.note(6, "%s: not built, the build cache was cold (%.0f s already spent building); run again, or with --full.", t.key, building.Seconds())
			continue
		}
		built := map[string]int64{}
		for _, p := range sizePrograms {
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
			built[p.key] = fi.Size()
			r.rep.set(fmt.Sprintf("size_%s_%s_bytes", p.key, t.key), fi.Size())
			building += time.Since(start)
			r.progress("  %s %s: %d bytes (built in %.1f s)", p.key, t.key, fi.Size(), time.Since(start).Seconds())
		}
		for _, p := range sizePrograms[:len(sizePrograms)-1] {
			key := fmt.Sprintf("size_%s_%s_vs_floor", p.key, t.key)
			ratio := float64(built[p.key]) / float64(built["floor"])
			r.rep.set(key, ratio)
			if p.arm64Max > 0 && t.key == "arm64" {
				r.rep.check(key, ratio <= p.arm64Max)
			}
		}
	}
	r.rep.note(6, "`CGO_ENABLED=0 go build -ldflags='-s -w'` for linux/amd64, linux/arm64 and linux/arm GOARM=7. "+
		"outboxctl is what ships to a till: the relay with its metrics and status page (internal/monitor, its /metrics written without Prometheus's client), init, status, list, requeue, purge, on cobra. "+
		"outboxlab is what a developer runs: the demo with its embedded broker (mochi), bench and fleet. "+
		"Library: [internal/sizeprobe/library](internal/sizeprobe/library/main.go), an app that opens an outbox, enqueues in its transaction and runs the MQTT relay. "+
		"Floor: [internal/sizeprobe/floor](internal/sizeprobe/floor/main.go), which uses only the library's three runtime dependencies (modernc.org/sqlite, paho, cenkalti/backoff).")
	return nil
}
