package drivesync

import (
	"errors"
	"strings"
	"testing"
)

const dotsSchema = `CREATE TABLE dots (
	uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixel_data BLOB NOT NULL, crc32_u32 INTEGER NOT NULL,
	PRIMARY KEY (uuid, gen))`

var dotsTable = Table{Name: "dots", AppendOnly: true}

func conflicts(r Report) []string {
	var out []string
	for _, u := range r.Unwritten {
		if errors.Is(u.Err, ErrImmutableConflict) {
			out = append(out, u.Table+" "+u.Record)
		}
	}
	return out
}

func TestAppendOnlyRefusesChanges(t *testing.T) {
	d := rowsDevice(t, "dev-a", NewMemoryRemote(), dotsSchema, dotsTable)
	d.exec(`INSERT INTO dots VALUES ('A', 0, X'01', 1)`)
	d.sync()
	for _, stmt := range []string{`UPDATE dots SET crc32_u32 = 2`, `DELETE FROM dots`} {
		if _, err := d.db.Exec(stmt); err == nil || !strings.Contains(err.Error(), "table dots is append-only") {
			t.Errorf("%s: err = %v, want the trigger's refusal naming the table", stmt, err)
		}
	}
	// REPLACE deletes without the delete trigger, so nothing refuses it:
	// the row it wrote is the app's, never sent, and the sync reports it
	// as unlike the synced record.
	d.exec(`INSERT OR REPLACE INTO dots VALUES ('A', 0, X'02', 2)`)
	r := d.sync()
	if got := conflicts(r); len(got) != 1 || r.Uploaded != "" {
		t.Errorf("after REPLACE: conflicts %v, uploaded %q; want the row reported and nothing sent", got, r.Uploaded)
	}
	if got := d.rows(`SELECT hex(pixel_data), crc32_u32 FROM dots`); got != "02 | 2\n" {
		t.Errorf("row %q, want the app's REPLACEd row kept", got)
	}
}

// The same payload under one key from two devices is one record; different
// payloads are a conflict each device reports at every sync, keeping its
// own row, until the app deletes its row of that key.
func TestAppendOnlyConflict(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, dotsTable)
	b := rowsDevice(t, "dev-b", remote, dotsSchema, dotsTable)
	c := rowsDevice(t, "dev-c", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('S', 5, X'AA', 7)`)
	b.exec(`INSERT INTO dots VALUES ('S', 5, X'AA', 7)`)
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)

	a.exec(`INSERT INTO dots VALUES ('E', 1, X'0A', 10)`)
	b.exec(`INSERT INTO dots VALUES ('E', 1, X'0B', 11)`)
	a.sync()
	b.sync()
	a.sync()
	c.sync()
	for range 3 { // at every sync
		for _, d := range []*device{a, b} {
			r := d.sync()
			if got := conflicts(r); len(got) != 1 || got[0] != "dots 'E',1" {
				t.Fatalf("%s: conflicts %v (Unwritten %v), want dots 'E',1", d.name, got, r.Unwritten)
			}
			if r.Uploaded != "" {
				t.Errorf("%s uploaded %s: a conflict sends nothing", d.name, r.Uploaded)
			}
		}
	}
	if got := a.rows(`SELECT hex(pixel_data) FROM dots WHERE uuid = 'E'`); got != "0A\n" {
		t.Errorf("a: %q, want its own row", got)
	}
	if got := b.rows(`SELECT hex(pixel_data) FROM dots WHERE uuid = 'E'`); got != "0B\n" {
		t.Errorf("b: %q, want its own row", got)
	}
	var u Report
	if u = c.sync(); len(conflicts(u)) != 0 {
		t.Errorf("c: conflicts %v: c wrote nothing of its own", conflicts(u))
	}
	want := c.rows(`SELECT hex(pixel_data), crc32_u32 FROM dots WHERE uuid = 'E'`)
	states := `SELECT record_id, record_data FROM sync_states ORDER BY record_id`
	for _, d := range []*device{a, b} {
		if got, w := d.rows(states), c.rows(states); got != w {
			t.Errorf("%s: synced state %q, want %q (the same on every device)", d.name, got, w)
		}
	}
	// a takes the synced payload: it deletes its row, which the trigger
	// allows for a record in conflict, and nothing is deleted elsewhere.
	a.exec(`DELETE FROM dots WHERE uuid = 'E'`)
	if _, err := a.db.Exec(`DELETE FROM dots WHERE uuid = 'S'`); err == nil {
		t.Error("a deleted a row in no conflict")
	}
	if r := a.sync(); len(conflicts(r)) != 0 || r.Uploaded != "" {
		t.Errorf("a after deleting its row: conflicts %v, uploaded %q", conflicts(r), r.Uploaded)
	}
	if got := a.rows(`SELECT hex(pixel_data), crc32_u32 FROM dots WHERE uuid = 'E'`); got != want {
		t.Errorf("a: %q, want the synced payload %q", got, want)
	}
	if got := conflicts(b.sync()); len(got) != 1 {
		t.Errorf("b: conflicts %v, want its own until it resolves too", got)
	}
	b.exec(`DELETE FROM dots WHERE uuid = 'E'`)
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
}
