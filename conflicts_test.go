package drivesync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func (d *device) conflicts() []Conflict {
	d.t.Helper()
	cs, err := d.eng.Conflicts(context.Background(), ConflictFilter{})
	if err != nil {
		d.t.Fatal(err)
	}
	return cs
}

// TestConflictLog: two devices edit one field at once; the losing side
// logs its value, the winning side logs nothing, and keeping the loser
// brings it back everywhere. Edits of other fields, and an edit made
// after seeing the other's, are not conflicts.
func TestConflictLog(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n1", `{"title":"t0","body":"b0","tags":{"x":true}}`)
	syncAll(t, a, b)

	// Both edit the title; b's write wins the tie of versions by its id.
	a.put("n1", `{"title":"from a","body":"b0","tags":{"x":true}}`)
	b.put("n1", `{"title":"from b","body":"b0","tags":{"x":true}}`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.get("n1"); !strings.Contains(got, `"from b"`) {
		t.Fatalf("a holds %s; the test expects b's write to win", got)
	}
	if cs := b.conflicts(); len(cs) != 0 {
		t.Fatalf("the winning side logged %+v", cs)
	}
	cs := a.conflicts()
	if len(cs) != 1 {
		t.Fatalf("a logged %d conflicts, want 1: %+v", len(cs), cs)
	}
	c := cs[0]
	if c.Table != "notes" || c.Record != "n1" || !slices.Equal(c.Path, []string{"title"}) || string(c.Loser) != `"from a"` || string(c.Winner) != `"from b"` ||
		c.LoserDevice != "dev-a" || c.WinnerDevice != "dev-b" || c.LoserVersion == 0 || c.WinnerVersion == 0 || c.At.IsZero() {
		t.Fatalf("logged %+v", c)
	}

	// Sequential edits, and concurrent edits of different fields or
	// members of a map, are not conflicts.
	b.put("n1", `{"title":"b after seeing a","body":"b0","tags":{"x":true}}`)
	syncAll(t, b, a)
	a.put("n1", `{"title":"b after seeing a","body":"a's body","tags":{"x":true,"ya":true}}`)
	b.put("n1", `{"title":"b's title","body":"b0","tags":{"x":true,"yb":true}}`)
	syncAll(t, a, b, a)
	assertConverged(t, a, b)
	if n := len(a.conflicts()) + len(b.conflicts()); n != 1 {
		t.Fatalf("%d conflicts logged in all, want the first one only: %+v %+v", n, a.conflicts(), b.conflicts())
	}

	// Keep the loser: a's title comes back, as a new edit that syncs.
	if err := a.eng.ResolveConflict(context.Background(), c.ID, KeepLoser); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(a.get("n1"), `"title":"from a"`) || a.pendingCount() != 1 {
		t.Fatalf("after KeepLoser a holds %s with %d pending", a.get("n1"), a.pendingCount())
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.get("n1"); !strings.Contains(got, `"title":"from a"`) || !strings.Contains(got, `"body":"a's body"`) || !strings.Contains(got, `"yb":true`) {
		t.Fatalf("b holds %s", got)
	}
	if len(a.conflicts()) != 0 || len(b.conflicts()) != 0 {
		t.Fatal("restoring the loser logged a conflict, or the resolved one stayed")
	}
	if err := a.eng.ResolveConflict(context.Background(), c.ID, KeepWinner); !errors.Is(err, ErrNoConflict) {
		t.Fatalf("resolving again: got %v, want ErrNoConflict", err)
	}
}

// TestConflictLogThreeDevices: a third device that held the overwritten
// value logs it too; the writer that won logs nothing. KeepWinner
// dismisses.
func TestConflictLogThreeDevices(t *testing.T) {
	mem := NewMemoryRemote()
	a, b, c := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem), newDevice(t, "dev-c", mem)
	a.put("n1", `{"body":"b0"}`)
	syncAll(t, a, b, c)
	a.put("n1", `{"body":"from a"}`)
	a.sync()
	c.sync()                         // c shows a's body
	b.put("n1", `{"body":"from b"}`) // not having seen a's
	syncAll(t, b, a, c)
	assertConverged(t, a, b, c)
	if !strings.Contains(c.get("n1"), "from b") {
		t.Fatalf("c holds %s; the test expects b's write to win", c.get("n1"))
	}
	for _, d := range []*device{a, c} {
		cs := d.conflicts()
		if len(cs) != 1 || string(cs[0].Loser) != `"from a"` || string(cs[0].Winner) != `"from b"` {
			t.Fatalf("%s logged %+v", d.name, cs)
		}
	}
	if cs := b.conflicts(); len(cs) != 0 {
		t.Fatalf("b logged %+v", cs)
	}
	if err := c.eng.ResolveConflict(context.Background(), c.conflicts()[0].ID, KeepWinner); err != nil {
		t.Fatal(err)
	}
	if len(c.conflicts()) != 0 || c.pendingCount() != 0 || !strings.Contains(c.get("n1"), "from b") {
		t.Fatal("KeepWinner changed the row or kept the entry")
	}
}

// TestConflictLogBounded: past MaxConflicts the oldest entries go.
func TestConflictLogBounded(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n1", `{"v":0}`)
	syncAll(t, a, b)
	a.exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
INSERT INTO sync_conflicts (table_name, record_id, path, loser, loser_version, loser_device, winner, winner_version, winner_device, detected_at)
SELECT 'notes', 'old' || i, '["v"]', '1', 1, 'x', '2', 2, 'y', '2026-01-01T00:00:00Z' FROM n`, MaxConflicts)
	a.put("n1", `{"v":"a"}`)
	b.put("n1", `{"v":"b"}`)
	syncAll(t, a, b, a)
	cs := a.conflicts()
	if len(cs) != MaxConflicts || cs[0].Record != "n1" || cs[len(cs)-1].Record != "old2" {
		t.Fatalf("%d entries, newest %s, oldest %s", len(cs), cs[0].Record, cs[len(cs)-1].Record)
	}
	if got, _ := a.eng.Conflicts(context.Background(), ConflictFilter{Record: "n1", Limit: 5}); len(got) != 1 {
		t.Fatalf("filter by record: %d", len(got))
	}
}

// TestConflictLogAppendOnly: an append-only row that another device wrote
// with another payload under the same key is logged once, on the side
// whose row is not the synced one; KeepWinner replaces the row with the
// synced one, KeepLoser keeps it. The side whose row won logs nothing:
// its row is the synced one, and nothing of it was lost.
func TestConflictLogAppendOnly(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, dotsTable)
	b := rowsDevice(t, "dev-b", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('E', 1, X'0A', 10)`)
	a.exec(`INSERT INTO dots VALUES ('F', 1, X'0C', 12)`)
	b.exec(`INSERT INTO dots VALUES ('E', 1, X'0B', 11)`)
	b.exec(`INSERT INTO dots VALUES ('F', 1, X'0D', 13)`)
	for range 3 {
		syncAll(t, a, b)
	}
	ca, cb := a.conflicts(), b.conflicts()
	if len(ca) != 2 || len(cb) != 0 {
		t.Fatalf("logged %d on a, %d on b; want two on a (one per key), however many syncs report them, and none on b: %+v", len(ca), len(cb), cb)
	}
	slices.SortFunc(ca, func(x, y Conflict) int { return strings.Compare(x.Record, y.Record) })
	if len(ca[0].Path) != 0 || !strings.Contains(string(ca[0].Loser), "10") || !strings.Contains(string(ca[0].Winner), "11") || ca[0].WinnerDevice != "dev-b" {
		t.Fatalf("a logged %+v", ca[0])
	}
	if err := a.eng.ResolveConflict(context.Background(), ca[0].ID, KeepWinner); err != nil {
		t.Fatal(err)
	}
	if err := a.eng.ResolveConflict(context.Background(), ca[1].ID, KeepLoser); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	if got, want := a.rows(`SELECT hex(pixel_data) FROM dots ORDER BY crc32_u32`), "0B\n0C\n"; got != want {
		t.Fatalf("a holds %q after KeepWinner of E and KeepLoser of F, want %q", got, want)
	}
	if got := b.rows(`SELECT hex(pixel_data) FROM dots ORDER BY crc32_u32`); got != "0B\n0D\n" {
		t.Fatalf("b holds %q", got)
	}
	if len(a.conflicts()) != 0 || len(b.conflicts()) != 0 {
		t.Fatalf("entries left: %+v %+v", a.conflicts(), b.conflicts())
	}
}

// TestConflictLogOrdinaryTable: a column of an ordinary table written on
// two devices at once; KeepLoser writes the column back, typed.
func TestConflictLogOrdinaryTable(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, n INTEGER, data BLOB)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "items"})
	a.exec(`INSERT INTO items VALUES ('i1', 't0', 1, X'00')`)
	syncAll(t, a, b)
	a.exec(`UPDATE items SET data = X'AA', n = 2`)
	b.exec(`UPDATE items SET data = X'BB'`)
	syncAll(t, a, b)
	cs := a.conflicts()
	if len(cs) != 1 || !slices.Equal(cs[0].Path, []string{"data"}) {
		t.Fatalf("a logged %+v", cs)
	}
	if err := a.eng.ResolveConflict(context.Background(), cs[0].ID, KeepLoser); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		if got := d.rows(`SELECT title, n, hex(data), typeof(data) FROM items`); got != "t0 | 2 | AA | blob\n" {
			t.Fatalf("%s holds %q", d.name, got)
		}
	}
}

// TestSeenNeverKeepsAChangeBack: a change that fits in a patch file only
// without its "seen" list goes without it; it is never left unsent.
func TestSeenNeverKeepsAChangeBack(t *testing.T) {
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.cfg.Limits = Limits{MaxRecordSize: 1024, MaxExpandedSize: 1100, MaxFileSize: 1100}
	a.open()
	b := newDevice(t, "dev-b", mem)
	content := func(v string) string {
		var fields []string
		for i := range 20 {
			fields = append(fields, fmt.Sprintf(`"field%02d":"%s%02d"`, i, v, i))
		}
		return "{" + strings.Join(fields, ",") + "}"
	}
	a.put("n1", content(strings.Repeat("x", 30)))
	syncAll(t, a, b)
	a.put("n1", content(strings.Repeat("y", 30)))
	if r := a.sync(); len(r.Skipped) != 0 || r.ChangesSent != 1 {
		t.Fatalf("sent %d, skipped %v", r.ChangesSent, r.Skipped)
	}
	b.sync()
	assertConverged(t, a, b)
}
