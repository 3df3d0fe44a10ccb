package drivesync

import (
	"testing"
)

// Review 23: deleteOne / rowThere, fillDefaults, renew_id with
// Config.DeviceID, and tryTogether dropping every refused row of a try.

// tryTogether now drops every row refused in a try. But a row can be
// refused only because another row of the same try was refused before
// it: with foreign keys on, the first row's delete succeeded and its
// write failed, so it is missing from the savepoint when a later row
// whose new value references it is written. Both leave the group, and
// the swap partner of the second is left alone (< 2 rows): the swap,
// which the table takes once the first row is left out (as the previous
// one-refusal-per-try loop found), is never written. b shows and
// reports the swapped rows unwritten at every sync, and differs from a
// for as long as the first row is refused.
//
// Rows: r1 (its new parent does not exist on b: a writes with foreign
// keys off), r2 and r3 swap their UNIQUE positions, and r2's new parent
// is r1. Sequence: a sets r1.parent = 'ghost', swaps r2 and r3 and sets
// r2.parent = 'r1'; a syncs; b (foreign keys on) syncs twice.
//
// Now only rows a UNIQUE constraint refused one at a time are written
// together, and a try stops at the first refusal.
func TestReview23RefusedParentDropsSwap(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, parent TEXT REFERENCES items (id))`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b := rowsDeviceOn(t, fkDSN, "dev-b", remote, schema, Table{Name: "items"})
	a.exec(`INSERT INTO items VALUES ('r1', 1, NULL), ('r2', 2, NULL), ('r3', 3, NULL)`)
	syncAll(t, a, b)
	tx, err := a.db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE items SET parent = 'ghost' WHERE id = 'r1'`,
		`UPDATE items SET pos = -1 WHERE id = 'r2'`,
		`UPDATE items SET pos = 2 WHERE id = 'r3'`,
		`UPDATE items SET pos = 3, parent = 'r1' WHERE id = 'r2'`,
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	a.sync()
	b.sync()
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 1 {
		t.Errorf("b: unwritten %v, want r1 alone", ids)
	}
	q := `SELECT id, pos, parent FROM items WHERE id <> 'r1' ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("r2 and r3 diverge for good: b %q, a %q", got, want)
	}
}

// Reviews 21 and 22 made a row the table refuses for a reason of its
// own leave the group, so that the swap beside it is written. That
// works only when the row sorts after the swapped rows (i3, j1..j8).
// Named a3, it is written first in the try, while i1, whose title it
// takes, is deleted: a3 succeeds and i1 is the one refused and dropped.
// i2 then has no partner (its position is held by i1), and in the next
// try a3 and i2 are both refused: the swap is never written, b reports
// a3, i1 and i2 unwritten at every sync, and b's positions differ from
// a's for as long as a3 is refused. It is review 21's
// UnrelatedRefusalBlocksSwap with the unrelated row renamed.
//
// Sequence: b adds a UNIQUE index on title; a adds a3; all sync; a swaps
// i1 and i2 and sets a3's title to 'first'; all sync.
//
// Now a row refused in a try over another value than on its own goes
// first in the next try; the row that took its value is then refused.
func TestReview23RefusedRowSortedFirstBlocksSwap(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE UNIQUE INDEX items_title ON items (title)`, "")
	a.exec(`INSERT INTO items VALUES ('a3', 30, 'third of a')`)
	syncAll(t, a, b)
	swap(t, a)
	a.exec(`UPDATE items SET title = 'first' WHERE id = 'a3'`)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 1 {
		t.Errorf("b: unwritten %v, want a3 alone", ids)
	}
	q := `SELECT id, pos FROM items WHERE id LIKE 'i%' ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("positions diverge for good: b %q, a %q", got, want)
	}
}
