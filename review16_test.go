package drivesync

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A record the sync cannot send (over the store's MaxRecordSize) that the
// app wrote twice leaves two marks in the log. A sync with nothing else to
// do is idle and never folds the log, so pendingCount (2) stays above
// len(Report.Skipped) (1) after every sync, and AutoSync syncs again a
// debounce later, for ever: a remote listing every Debounce, with nothing
// to send. Before the change the set held one mark: 1 == len(Skipped).
func TestReview16AutoSyncSkippedLoops(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.Limits = Limits{MaxRecordSize: 2048}
	a.open()
	a.sync() // creates the store with a 2048-byte record limit
	big := strings.Repeat("x", 3000)
	a.put("big", fmt.Sprintf(`{"t":%q}`, big))
	a.put("big", fmt.Sprintf(`{"t":%q,"u":1}`, big))
	results, stop := autoSync(t, a, AutoSyncOptions{Debounce: 30 * time.Millisecond, Interval: time.Hour, Poll: 5 * time.Millisecond})
	first := next(t, results, 5*time.Second)
	if first.err != nil || len(first.r.Skipped) != 1 {
		t.Fatalf("first sync: skipped %v, err %v", first.r.Skipped, first.err)
	}
	n := 0
	deadline := time.After(800 * time.Millisecond)
loop:
	for {
		select {
		case <-results:
			n++
		case <-deadline:
			break loop
		}
	}
	stop()
	if n > 1 {
		t.Fatalf("AutoSync ran %d more syncs in 800 ms with nothing to send (%d pending marks, skipped 1)", n, mustPendingCount(t, a))
	}
}

func mustPendingCount(t *testing.T, d *device) int {
	n, err := d.eng.pendingMarks(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// rollbackDevices are two devices whose notes.title is unique, kept so by
// an app trigger that raises ROLLBACK. (A constraint declared ON CONFLICT
// ROLLBACK did the same until the engine's writes said OR ABORT, which
// overrides it: see TestReview20RollbackConstraintRefusesRow.)
func rollbackDevices(t *testing.T) (a, b *device) {
	const schema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content JSONB NOT NULL,
	title TEXT,
	display_order INTEGER
)`
	const insert = `CREATE TRIGGER IF NOT EXISTS notes_title_insert BEFORE INSERT ON notes
WHEN EXISTS (SELECT 1 FROM notes WHERE title = NEW.title AND id <> NEW.id)
BEGIN SELECT RAISE(ROLLBACK, 'title taken'); END`
	const update = `CREATE TRIGGER IF NOT EXISTS notes_title_update BEFORE UPDATE OF title ON notes
WHEN EXISTS (SELECT 1 FROM notes WHERE title = NEW.title AND id <> NEW.id)
BEGIN SELECT RAISE(ROLLBACK, 'title taken'); END`
	remote := NewMemoryRemote()
	return newDevice(t, "dev-a", remote, schema, insert, update), newDevice(t, "dev-b", remote, schema, insert, update)
}

// A table whose trigger raises ROLLBACK refuses a received row by rolling
// the whole apply transaction back: fold, settle and quiet window
// included. The engine takes the refusal for a statement's and
// goes on in autocommit mode, where the quiet window's end deletes every
// mark of the log: the ones the rollback put back, among them an edit the
// app made during the sync, which no sync ever sends.
func TestReview16RollbackConflictDeletesAppMarks(t *testing.T) {
	a, b := rollbackDevices(t)
	a.sync()
	b.sync()
	b.put("n1", `{"title":"x"}`)
	b.sync()
	a.put("loc", `{"title":"x"}`)
	hooks(a.eng).step = func(point string) error {
		if point == "uploaded" {
			hooks(a.eng).step = nil
			a.put("late", `{"by":"a","during":"sync"}`)
		}
		return nil
	}
	_, err := a.eng.Sync(t.Context())
	if err == nil || !strings.Contains(err.Error(), "RAISE(ROLLBACK)") {
		t.Errorf("dev-a: the sync during which the table rolled back returned %v, want the error that says so", err)
	}
	var pending int
	if err := a.db.QueryRow(`SELECT count(*) FROM ` + pendingUnion + ` WHERE record_id = 'late'`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending == 0 {
		t.Fatalf("dev-a: the app's edit of late, made during the sync and never sent, is no longer pending (log %d rows, set %v)", a.logged(), a.rows(`SELECT table_name, record_id FROM sync_pending_changes`))
	}
}

// The same rollback in a sync that dropped the capture triggers: the
// rollback puts them back, the engine's next writes (in autocommit) are
// logged as the app's edits, and the window's end fails to create
// triggers that exist, so nothing deletes those marks.
func TestReview16RollbackConflictEngineWritesLogged(t *testing.T) {
	a, b := rollbackDevices(t)
	a.eng.quietDropAt = 1
	a.sync()
	b.sync()
	b.put("n1", `{"title":"x"}`)
	b.put("n2", `{"v":"from b"}`)
	b.sync()
	a.put("loc", `{"title":"x"}`)
	if _, err := a.eng.Sync(t.Context()); err == nil || !strings.Contains(err.Error(), "RAISE(ROLLBACK)") {
		t.Errorf("dev-a: the sync during which the table rolled back returned %v, want the error that says so", err)
	}
	a.checkTriggers()
	if got := a.rows(`SELECT record_id FROM sync_pending_log WHERE record_id = 'n2'`); got != "" {
		t.Fatalf("dev-a: b's record n2, written by the engine, is logged as the app's edit: %q", got)
	}
}
