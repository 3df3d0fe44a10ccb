package drivesync

import (
	"context"
	"strings"
	"testing"
)

// Review 29: the triggers writeTogether lets through.

// TestReview29SyncOnlyTriggerMissesSwap: deletesStayInTable lets a table
// with an UPDATE trigger through when the trigger's text mentions
// is_syncing, taking that for the README's guard that skips the engine's
// writes. A trigger guarded the other way, WHEN (SELECT is_syncing FROM
// sync_control) = 1 (it fires for the engine's writes only: an app that
// logs the moves other devices made, to show them), is let through too:
// writeTogether writes the swap as deletes and inserts, the trigger
// never fires, and b's log misses both moves, although the rows moved.
// Expected, as for review 25's unguarded trigger: the table is left
// alone (the swap reported), or the trigger sees the moves.
//
// Sequence: b has the sync-only trigger; a swaps i1 and i2; all sync.
func TestReview29SyncOnlyTriggerMissesSwap(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE TABLE moves (id TEXT, pos INTEGER);
CREATE TRIGGER items_moved AFTER UPDATE OF pos ON items WHEN (SELECT is_syncing FROM sync_control) = 1
BEGIN INSERT INTO moves VALUES (NEW.id, NEW.pos); END`, "")
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	moved := b.rows(`SELECT id, pos FROM items WHERE id IN ('i1', 'i2') ORDER BY id`)
	logged := b.rows(`SELECT id, pos FROM moves ORDER BY id`)
	t.Logf("b unwritten %v; items %q; moves %q", unwrittenIDs(r), moved, logged)
	if moved == "i1 | 2\ni2 | 1\n" && logged != moved {
		t.Errorf("b's rows swapped, but its trigger on the engine's updates logged %q: the engine wrote the swap as deletes and inserts", logged)
	}
}

// A trigger guarded exactly as the README asks never fires for the
// engine's writes, whatever its event: a table with one that logs
// deletes still gets its swaps written together, and the log stays empty.
func TestReview29GuardedDeleteTriggerAllowsSwap(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE TABLE gone (id TEXT);
CREATE TRIGGER items_gone AFTER DELETE ON items WHEN (SELECT is_syncing FROM sync_control) = 0
BEGIN INSERT INTO gone VALUES (OLD.id); END`, "")
	swap(t, a)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 0 {
		t.Errorf("b: unwritten %v", ids)
	}
	q := `SELECT id, pos FROM items ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("b %q, a %q", got, want)
	}
	if got := b.rows(`SELECT id FROM gone`); got != "" {
		t.Errorf("b's guarded trigger logged %q", got)
	}
}

// Through a sync server, ids "server" and "server-…" are the server's own
// stamps. Open refused them as the id it returned, but a new id the app
// gives while the outbox holds an upload is only owed (renew_id), and the
// next sync would have taken it unchecked. Open refuses it as well.
func TestReview29OwedServerID(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	d.exec(`INSERT INTO sync_outbox (name, seq, data) VALUES ('waiting', 0, x'00')`)
	_, err := Open(context.Background(), d.db, Config{Server: recordsOnly{}, DeviceID: "server-2", Tables: []Table{{Name: "notes"}}})
	if err == nil || !strings.Contains(err.Error(), "server's own stamps") {
		t.Fatalf("Open with Config.DeviceID server-2 and an upload waiting: %v", err)
	}
}
