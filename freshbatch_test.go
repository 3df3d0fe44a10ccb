package drivesync

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A received write to a record the device already has, in the middle of
// new records, goes in a batch of new states that SQLite refuses whole;
// every record of it must still be applied the usual way: the write
// merged with the fields the device had, the new records stored. The
// records after it go one at a time, then in batches again.
func TestFreshBatchReceivedWriteToKnownRecord(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	b := newDevice(t, "dev-b", remote)
	a.put("m50", `{"title":"known","x":1,"y":1}`)
	a.sync()
	b.sync()
	b.exec(`UPDATE notes SET content = jsonb('{"title":"known","x":1,"y":2}') WHERE id = 'm50'`)
	b.sync()
	// a has not seen b's y = 2: its write of x is a patch of x alone.
	for i := range 300 {
		if i == 50 {
			a.exec(`UPDATE notes SET content = jsonb('{"title":"known","x":5,"y":1}') WHERE id = 'm50'`)
			continue
		}
		a.put(fmt.Sprintf("m%02d", i), fmt.Sprintf(`{"title":"new %d"}`, i))
	}
	if r := a.sync(); r.ChangesSent != 300 {
		t.Fatalf("a sent %d changes, want 300", r.ChangesSent)
	}
	if r := b.sync(); r.ChangesReceived != 300 {
		t.Fatalf("b received %d changes, want 300", r.ChangesReceived)
	}
	if got, want := b.get("m50"), `{"title":"known","x":5,"y":2}`; got != want {
		t.Fatalf("b's m50 = %s, want %s", got, want)
	}
	a.sync()
	assertConverged(t, a, b)
	var n int
	if err := b.db.QueryRow(`SELECT count(*) FROM notes`).Scan(&n); err != nil || n != 300 {
		t.Fatalf("b has %d notes (err %v), want 300", n, err)
	}
}

// A file that holds one new record twice: the batch that holds both
// fails, and the two writes merge as when they came one at a time.
func TestFreshBatchRecordTwiceInOneFile(t *testing.T) {
	remote := NewMemoryRemote()
	b := newDevice(t, "dev-b", remote)
	b.sync()
	var changes []string
	for i := range 5 {
		changes = append(changes, fmt.Sprintf(`{"table_name":"notes","record_id":"n%d","patch":{"title":"t%d"},"is_deleted":false,"sync_version":%d}`, i, i, 40+i))
	}
	changes = append(changes,
		`{"table_name":"notes","record_id":"dup","patch":{"n":1,"title":"one"},"is_deleted":false,"sync_version":50}`,
		`{"table_name":"notes","record_id":"dup","patch":{"title":"two"},"is_deleted":false,"sync_version":51}`)
	name := patchFileName(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), "dev-c")
	writeRaw(t, remote, name, true, `{"format":1,"device":"dev-c","changes":[`+strings.Join(changes, ",")+`]}`)
	if r := b.sync(); r.ChangesReceived != 7 {
		t.Fatalf("b received %d changes, want 7", r.ChangesReceived)
	}
	if got, want := b.get("dup"), `{"n":1,"title":"two"}`; got != want {
		t.Fatalf("dup = %s, want %s", got, want)
	}
	for i := range 5 {
		if got, want := b.get(fmt.Sprintf("n%d", i)), fmt.Sprintf(`{"title":"t%d"}`, i); got != want {
			t.Fatalf("n%d = %s, want %s", i, got, want)
		}
	}
	var states int
	if err := b.db.QueryRow(`SELECT count(*) FROM sync_states`).Scan(&states); err != nil || states != 6 {
		t.Fatalf("%d states (err %v), want 6", states, err)
	}
}

// A document table that refuses one of many new records it receives,
// whose states go in one batch: the refused one is reported, every other
// one written. A trigger that skips the row (RAISE(IGNORE)) or fails it
// (RAISE(FAIL)) sees each row written by a statement of its own: no row
// is written twice.
func TestFreshBatchDocRowsRefused(t *testing.T) {
	for _, tc := range []struct{ name, schema string }{
		{"check", `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT CHECK (title IS NOT 'bad'), display_order INTEGER)`},
		{"app trigger ignores", notesSchema + `; CREATE TRIGGER skip_bad BEFORE INSERT ON notes WHEN NEW.title = 'bad' BEGIN SELECT RAISE(IGNORE); END`},
		// A statement of many rows would keep those before the one the
		// trigger fails, and write them again one by one: updates the
		// app's log would count.
		{"app trigger fails", notesSchema + `; CREATE TRIGGER fail_bad BEFORE INSERT ON notes WHEN NEW.title = 'bad' BEGIN SELECT RAISE(FAIL, 'bad title'); END;
CREATE TABLE updates (id TEXT); CREATE TRIGGER log_update AFTER UPDATE ON notes BEGIN INSERT INTO updates VALUES (NEW.id); END`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := newDevice(t, "dev-a", remote)
			b := newDevice(t, "dev-b", remote, tc.schema)
			putTitled(a, 40, 10)
			a.sync()
			r := b.sync()
			if ids := unwrittenIDs(r); len(ids) != 1 || ids[0] != "notes/n10" {
				t.Fatalf("unwritten %v, want notes/n10", ids)
			}
			var rows, states int
			if err := b.db.QueryRow(`SELECT (SELECT count(*) FROM notes), (SELECT count(*) FROM sync_states)`).Scan(&rows, &states); err != nil {
				t.Fatal(err)
			}
			if rows != 39 || states != 40 || b.get("n10") != "" || b.get("n11") != `{"title":"t11"}` {
				t.Fatalf("b has %d rows and %d states, n10 %q, n11 %q; want 39, 40, none and t11", rows, states, b.get("n10"), b.get("n11"))
			}
			if strings.Contains(tc.schema, "updates") {
				if got := b.rows(`SELECT id FROM updates`); got != "" {
					t.Fatalf("new rows updated after they were written: %q", got)
				}
			}
		})
	}
}

// putTitled writes n new notes n00, n01, ... titled t0, t1, ..., but for
// note bad, titled "bad".
func putTitled(d *device, n, bad int) {
	d.t.Helper()
	for i := range n {
		title := fmt.Sprintf("t%d", i)
		if i == bad {
			title = "bad"
		}
		d.exec(`INSERT INTO notes (id, content, title) VALUES (?, jsonb(?), ?)`, fmt.Sprintf("n%02d", i), fmt.Sprintf(`{"title":%q}`, title), title)
	}
}

func init() {
	freshHook = func(n int, inserted bool) {
		switch {
		case !inserted:
			count("new states: batches refused, applied one by one")
		case n == freshBatchRows:
			count("new states: full batches inserted")
		default:
			count("new states: partial batches inserted")
		}
	}
}
