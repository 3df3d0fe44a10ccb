package drivesync

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestReview14AutoSyncLoopsOnUnsendablePending: a record left pending by
// a table the app no longer registers (an app version without it) is
// never sent and never reported in Report.Skipped. Since AutoSync takes
// "pending > len(Skipped)" after a successful sync for edits made during
// it, it syncs again a Debounce after every sync, forever: a remote
// request burst every 2 s instead of every Interval.
func TestReview14AutoSyncLoopsOnUnsendablePending(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote, notesSchema, miscSchema)
	a.sync()
	a.put("r0", `{"x":1}`)
	a.cfg.Tables = []Table{{Name: "misc"}}
	a.open()
	a.sync()
	if n := a.pendingCount(); n != 1 {
		t.Fatalf("pending %d, want the unregistered table's record", n)
	}
	results, stop := autoSync(t, a, AutoSyncOptions{Debounce: 50 * time.Millisecond, Interval: time.Hour, Poll: 10 * time.Millisecond})
	time.Sleep(1500 * time.Millisecond)
	stop()
	n := len(results)
	for range n {
		if r := <-results; r.err != nil {
			t.Fatalf("sync: %v", r.err)
		}
	}
	// One sync at start; nothing else is due within the hour.
	if n > 2 {
		t.Fatalf("AutoSync ran %d syncs in 1.5 s with no change and an Interval of an hour", n)
	}
}

// TestReview14DroppedMarkerKeyUnnoticed: the store was created with key
// old (its check is in the marker only); a changes the key to new. Device
// c, not yet told, writes a note under old. A device b given only the new
// key (the user typed the new passphrase, not the old one) verifies it
// through a's key check, then meets files it cannot open: the store's
// marker key is one it lacks, but foreignKey only looks under keys/, so
// b's Sync succeeds, rejecting the files, without the store's notes. The
// README says such a device stops with ErrWrongKey "until it gets the new
// key (and the old ones)", and foreignKey's own message names "this
// device dropped an old key before the files encrypted with it were
// compacted".
func TestReview14DroppedMarkerKeyUnnoticed(t *testing.T) {
	mem := NewMemoryRemote()
	oldKey, newKey := Passphrase("old"), Passphrase("new")
	a := secretDevice(t, "dev-a", mem, oldKey)
	a.put("n0", `{"v":"a, old key"}`)
	a.sync()
	c := secretDevice(t, "dev-c", mem, oldKey)
	c.sync()
	a.rekey(newKey, oldKey)
	a.sync()
	c.put("n1", `{"v":"c, old key"}`)
	c.sync()

	b := secretDevice(t, "dev-b", mem, newKey)
	b.put("mine", `{"v":"b"}`)
	r, err := b.eng.Sync(context.Background())
	if errors.Is(err, ErrWrongKey) {
		return // told to get the old key: fine
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("b (new key only) synced without error: rejected %d files, sent %d, n0=%q n1=%q: it lacks the store's notes and is not told", len(r.Rejected), r.ChangesSent, b.get("n0"), b.get("n1"))
}

// TestReview14AppendOnlyKeepWinnerOnLaterWriter: a and b write different
// payloads under one key of an append-only table; b syncs later, so b's
// payload is the synced one. b's log named a's payload as the winner
// ("theirs"), and KeepWinner then deleted b's row "so that the next Sync
// writes the other one": the next sync wrote b's own payload back, the
// one the user had dismissed. b's row won: b logs nothing; a, whose row
// is not the synced one, logs b's payload as the winner.
func TestReview14AppendOnlyKeepWinnerOnLaterWriter(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, dotsTable)
	b := rowsDevice(t, "dev-b", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('E', 1, X'0A', 10)`)
	b.exec(`INSERT INTO dots VALUES ('E', 1, X'0B', 11)`)
	a.sync()
	b.sync() // b's payload, stamped after a's, is the synced one
	if cb := b.conflicts(); len(cb) != 0 {
		t.Fatalf("b, whose row is the synced one, logged %+v: its winner is not what a sync would write", cb)
	}
	a.sync()
	ca := a.conflicts()
	if len(ca) != 1 || !strings.Contains(string(ca[0].Winner), "11") || !strings.Contains(string(ca[0].Loser), "10") {
		t.Fatalf("a logged %+v, want its payload lost to b's", ca)
	}
	if err := a.eng.ResolveConflict(context.Background(), ca[0].ID, KeepWinner); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	if got := a.rows(`SELECT hex(pixel_data), crc32_u32 FROM dots`); got != "0B | 11\n" {
		t.Fatalf("a kept theirs and holds %q, want b's payload", got)
	}
}
