package bench

import (
	"fmt"
	"os"
)

// sectionTB lets a section start the harness's servers that only tests
// start (NATS, PostgreSQL): their functions take a test's TB, which this
// is for the length of a section. Fatalf and Skipf end the function run by
// do, as they would end a test; the cleanups run at close, last first.
type sectionTB struct {
	dir      string
	cleanups []func()
	failed   bool
}

// tbAbort is what Fatalf and Skipf panic with, for do to recover.
type tbAbort struct {
	msg  string
	skip bool
}

func newSectionTB(dir string) *sectionTB { return &sectionTB{dir: dir} }

func (t *sectionTB) Helper()                   {}
func (t *sectionTB) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *sectionTB) Logf(string, ...any)       {}
func (t *sectionTB) Failed() bool              { return t.failed }
func (t *sectionTB) Errorf(f string, a ...any) { t.failed = true }

func (t *sectionTB) Fatalf(f string, a ...any) {
	t.failed = true
	panic(tbAbort{msg: fmt.Sprintf(f, a...)})
}

func (t *sectionTB) Skipf(f string, a ...any) {
	panic(tbAbort{msg: fmt.Sprintf(f, a...), skip: true})
}

func (t *sectionTB) TempDir() string {
	d, err := os.MkdirTemp(t.dir, "tb-")
	if err != nil {
		t.Fatalf("temporary directory: %v", err)
	}
	return d
}

// do runs f on this goroutine; a Fatalf in it returns as err, a Skipf as
// skipped (why).
func (t *sectionTB) do(f func()) (skipped string, err error) {
	defer func() {
		if v := recover(); v != nil {
			a, ok := v.(tbAbort)
			if !ok {
				panic(v)
			}
			if a.skip {
				skipped = a.msg
			} else {
				err = fmt.Errorf("%s", a.msg)
			}
		}
	}()
	f()
	return "", nil
}

// close runs the cleanups, last first.
func (t *sectionTB) close() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.do(t.cleanups[i]) // a cleanup's Fatalf ends that cleanup only
	}
	t.cleanups = nil
}
