package httpremote_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
)

func (d *device) conflicts() []drivesync.Conflict {
	d.t.Helper()
	cs, err := d.eng.Conflicts(context.Background(), drivesync.ConflictFilter{})
	if err != nil {
		d.t.Fatal(err)
	}
	return cs
}

func (d *device) note(id string) string {
	d.t.Helper()
	var s string
	if err := d.db.QueryRow(`SELECT content FROM notes WHERE id = ?`, id).Scan(&s); err != nil {
		d.t.Fatal(err)
	}
	return s
}

// TestConflictLogThroughServer: two devices edit one field at once
// through the server; the side whose value lost logs it, the winner logs
// nothing, and keeping the loser brings it back on both. A sequential
// edit, and concurrent edits of other fields, log nothing. A third
// device that showed the lost value logs it too.
func TestConflictLogThroughServer(t *testing.T) {
	eachKind(t, func(t *testing.T, kind string) {
		url, _ := startServer(t, kind)
		srv := func() drivesync.Server { return httpremote.New(url, aliceToken, httpremote.Options{Store: "notes"}) }
		a, b, c := openDevice(t, "dev-a", srv()), openDevice(t, "dev-b", srv()), openDevice(t, "dev-c", srv())
		a.exec(`INSERT INTO notes VALUES ('n1', '{"title":"t0","body":"b0"}')`)
		a.sync()
		b.sync()
		c.sync()

		a.exec(`UPDATE notes SET content = '{"title":"from a","body":"b0"}' WHERE id = 'n1'`)
		a.sync()
		c.sync() // c shows a's title
		b.exec(`UPDATE notes SET content = '{"title":"from b","body":"b0"}' WHERE id = 'n1'`)
		b.sync() // b's edit, made without seeing a's, wins
		a.sync()
		c.sync()
		for _, d := range []*device{a, b, c} {
			if got := d.note("n1"); !strings.Contains(got, `"from b"`) {
				t.Fatalf("%s holds %s; the test expects b's write to win", d.eng.DeviceID(), got)
			}
		}
		if cs := b.conflicts(); len(cs) != 0 {
			t.Fatalf("the winning side logged %+v", cs)
		}
		for _, d := range []*device{a, c} {
			cs := d.conflicts()
			if len(cs) != 1 {
				t.Fatalf("%s logged %d conflicts, want 1: %+v", d.eng.DeviceID(), len(cs), cs)
			}
			x := cs[0]
			if x.Table != "notes" || x.Record != "n1" || !slices.Equal(x.Path, []string{"title"}) || string(x.Loser) != `"from a"` || string(x.Winner) != `"from b"` ||
				x.LoserDevice != "dev-a" || x.WinnerDevice != "dev-b" || x.LoserVersion == 0 || x.WinnerVersion <= x.LoserVersion {
				t.Fatalf("%s logged %+v", d.eng.DeviceID(), x)
			}
		}

		// Sequential edits, and concurrent edits of other fields.
		b.exec(`UPDATE notes SET content = '{"title":"b after seeing a","body":"b0"}' WHERE id = 'n1'`)
		b.sync()
		a.sync()
		a.exec(`UPDATE notes SET content = '{"title":"b after seeing a","body":"a''s body"}' WHERE id = 'n1'`)
		b.exec(`UPDATE notes SET content = '{"title":"b''s title","body":"b0"}' WHERE id = 'n1'`)
		a.sync()
		b.sync()
		a.sync()
		c.sync()
		if n := len(a.conflicts()) + len(b.conflicts()) + len(c.conflicts()); n != 2 {
			t.Fatalf("%d conflicts logged in all, want the first two only: %+v %+v %+v", n, a.conflicts(), b.conflicts(), c.conflicts())
		}

		// Keep the loser on a: its title comes back everywhere.
		if err := a.eng.ResolveConflict(context.Background(), a.conflicts()[0].ID, drivesync.KeepLoser); err != nil {
			t.Fatal(err)
		}
		a.sync()
		b.sync()
		for _, d := range []*device{a, b} {
			if got := d.note("n1"); !strings.Contains(got, `"title":"from a"`) || !strings.Contains(got, `"body":"a's body"`) {
				t.Fatalf("after KeepLoser %s holds %s", d.eng.DeviceID(), got)
			}
		}
		if len(a.conflicts()) != 0 || len(b.conflicts()) != 0 {
			t.Fatalf("restoring the loser logged a conflict, or the resolved one stayed: %+v %+v", a.conflicts(), b.conflicts())
		}
	})
}
