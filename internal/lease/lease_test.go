package lease

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/edgeoutbox/outbox/internal/sqlconn"
)

// TestHolderDeadTo: a holder is judged dead only where that is certain.
func TestHolderDeadTo(t *testing.T) {
	self := Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 100, PIDStart: 5000, PIDNS: "PID:[1]"}
	running := func(pid int64) (ProcInfo, bool) {
		switch pid {
		case 100:
			return ProcInfo{Exists: true, Start: 5000}, true
		case 200:
			return ProcInfo{Exists: true, Start: 7000}, true // alive, started at 7000
		case 400:
			return ProcInfo{}, false // /proc cannot be trusted for it
		}
		return ProcInfo{}, true // no such process
	}
	for _, c := range []struct {
		name string
		h    Holder
		dead bool
	}{
		{"an earlier boot of this host", Holder{Host: "till-7", MachineID: "m1", BootID: "b0", PID: 200, PIDStart: 7000, PIDNS: "PID:[1]"}, true},
		{"a process of this boot that is gone", Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 300, PIDStart: 900, PIDNS: "PID:[1]"}, true},
		{"its pid reused by a later process", Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 200, PIDStart: 6999, PIDNS: "PID:[1]"}, true},
		{"a live process", Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 200, PIDStart: 7000, PIDNS: "PID:[1]"}, false},
		{"this very process", self, false},
		{"this very process, /proc saying otherwise", Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 100, PIDStart: 4999, PIDNS: "PID:[1]"}, false},
		{"a process /proc cannot tell of", Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 400, PIDStart: 900, PIDNS: "PID:[1]"}, false},
		{"another PID namespace", Holder{Host: "till-7", MachineID: "m1", BootID: "b1", PID: 300, PIDStart: 900, PIDNS: "PID:[2]"}, false},
		{"another host", Holder{Host: "till-8", MachineID: "m2", BootID: "b0", PID: 300, PIDStart: 900, PIDNS: "PID:[1]"}, false},
		{"another machine of the same name", Holder{Host: "till-7", MachineID: "m2", BootID: "b0", PID: 300, PIDStart: 900, PIDNS: "PID:[1]"}, false},
		{"written by an older version", Holder{}, false},
		{"no boot id", Holder{Host: "till-7", MachineID: "m1", PID: 300, PIDStart: 900, PIDNS: "PID:[1]"}, false},
	} {
		require.Equal(t, c.dead, c.h.DeadTo(self, running), c.name)
	}
	me := ThisHolder()
	if me.BootID == "" {
		t.Skip("not Linux: no boot id, a holder is never judged dead")
	}
	require.NotEmpty(t, me.Host)
	require.NotEmpty(t, me.PIDNS)
	require.False(t, me.DeadTo(me, ReadProc), "this process is alive")
	p, known := ReadProc(me.PID)
	if known {
		require.True(t, p.Exists)
		require.Equal(t, me.PIDStart, p.Start)
	}
}

// TestHeld: HeldSQL holds while the lease row names this relay in this
// process, and not once another relay, or a process started with the same
// owner, took it over.
func TestHeld(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "till.db")+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE TABLE outbox_lease (name TEXT PRIMARY KEY, owner TEXT NOT NULL DEFAULT '', token INTEGER NOT NULL DEFAULT 0,
		expires_at INTEGER NOT NULL DEFAULT 0, host TEXT NOT NULL DEFAULT '', machine_id TEXT NOT NULL DEFAULT '', boot_id TEXT NOT NULL DEFAULT '',
		pid INTEGER NOT NULL DEFAULT 0, pid_start INTEGER NOT NULL DEFAULT 0, pid_ns TEXT NOT NULL DEFAULT '', protocol TEXT)`)
	require.NoError(t, err)
	conn, err := sqlconn.Open(ctx, db)
	require.NoError(t, err)
	defer conn.Close()
	l := New(conn, "till", time.Minute, time.Now)
	require.NoError(t, l.Acquire(ctx, nil, nil))
	held := func() bool {
		var ok bool
		require.NoError(t, conn.Do(func(c *sql.Conn) error {
			var err error
			ok, err = l.Held(ctx, c)
			return err
		}))
		return ok
	}
	require.True(t, held())
	require.True(t, l.Valid())
	_, err = db.Exec(`UPDATE outbox_lease SET pid = pid + 1`) // the same owner, another process
	require.NoError(t, err)
	require.False(t, held())
	_, err = db.Exec(`UPDATE outbox_lease SET pid = pid - 1, owner = 'other'`)
	require.NoError(t, err)
	require.False(t, held())
	l.Lose() // what the relay does then: publish nothing more
	require.False(t, l.Valid())
	<-l.Lost()
}
