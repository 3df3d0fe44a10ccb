package drivesync

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Review 35: the batched apply of new records (freshbatch.go).

// Review 35 found that the rows of new received records of a document
// table, then written by one multi-row upsert when no trigger of the
// database watched the table, missed a TEMP trigger (sqlite_temp_schema)
// on the engine's connection, here an app with one connection
// (SetMaxOpenConns(1), as in review 24). Such a trigger tells one
// statement of many rows from many statements:
//
//   - RAISE(IGNORE) skipped one row of the statement, the engine found
//     fewer rows written than it wrote and failed the whole sync ("internal
//     error: 31 rows written of 32"), at every sync, for good: the device
//     was stuck. One row at a time, the skipped row is reported unwritten
//     and every other row is written.
//   - RAISE(FAIL) kept the rows the statement wrote before the failing
//     one; each row was then written again alone, as an update of the row
//     just inserted, which the app's TEMP update trigger logs.
//
// The rows are written one at a time again (see freshbatch.go); this
// test keeps them so.
func TestReview35TempTriggerSeesRowsOneAtATime(t *testing.T) {
	for _, tc := range []struct{ name, triggers string }{
		{"ignore", `CREATE TEMP TRIGGER skip_bad BEFORE INSERT ON main.notes WHEN NEW.title = 'bad' BEGIN SELECT RAISE(IGNORE); END`},
		{"fail", `CREATE TEMP TRIGGER fail_bad BEFORE INSERT ON main.notes WHEN NEW.title = 'bad' BEGIN SELECT RAISE(FAIL, 'bad title'); END;
CREATE TEMP TRIGGER log_update AFTER UPDATE ON main.notes BEGIN INSERT INTO updates VALUES (NEW.id); END`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := newDevice(t, "dev-a", remote)
			b := newDevice(t, "dev-b", remote, notesSchema, `CREATE TABLE updates (id TEXT)`)
			b.db.SetMaxOpenConns(1) // the app's connection, with its TEMP triggers, is the engine's
			b.exec(tc.triggers)
			putTitled(a, 40, 10)
			a.sync()
			for round := range 2 {
				r, err := b.eng.Sync(context.Background())
				if err != nil {
					_, again := b.eng.Sync(context.Background())
					t.Fatalf("b: sync %d fails: %v; and again: %v", round+1, err, again)
				}
				if round == 0 {
					if ids := unwrittenIDs(r); len(ids) != 1 || ids[0] != "notes/n10" {
						t.Fatalf("unwritten %v, want notes/n10", ids)
					}
				}
			}
			if got := b.get("n11"); got != `{"title":"t11"}` {
				t.Fatalf("b: n11 = %q, want t11", got)
			}
			if got := b.rows(`SELECT id FROM updates`); got != "" {
				t.Fatalf("b's TEMP update trigger saw new rows updated right after they were inserted: %q", strings.ReplaceAll(got, "\n", " "))
			}
		})
	}
}

// The batch moves a queued record's write after the changes that follow
// it in its file and are not queued (a delete, a patch with a null, a
// replacing write, an append-only or unregistered table's record). The
// merge orders writes by their stamps, so the order is moot, except for
// two writes of one record under one stamp whose paths overlap: the first
// applied wins (Reset and writeObject take only a newer stamp). No
// correct writer makes such a file (the parts of one change write
// disjoint members), but the decoder accepts it, and before the change
// every device applied it in file order and agreed. Now the order depends
// on whether the record was queued: on whether the app wrote during the
// sync (s.dirty: one at a time), or on which files one sync took together
// (a refused batch makes the next records go one at a time). The devices
// then hold different states under the same stamps, for good.
//
// Here b applies the file as a batch; c, whose app writes an unrelated
// table during the sync, applies it one at a time. Both should show
// {"a":0,"b":2} (the file's first write of a wins, as before).
func TestReview35SameStampWritesReorderedDiverge(t *testing.T) {
	remote := NewMemoryRemote()
	b := newDevice(t, "dev-b", remote)
	c := newDevice(t, "dev-c", remote, notesSchema, `CREATE TABLE other (x)`)
	b.sync()
	c.sync()
	name := patchFileName(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), "dev-d")
	writeRaw(t, remote, name, true, `{"format":2,"device":"dev-d","changes":[`+
		`{"table_name":"notes","record_id":"x","patch":{"a":0},"is_deleted":false,"sync_version":67},`+
		`{"table_name":"notes","record_id":"x","patch":{"a":null,"b":2},"is_deleted":false,"sync_version":67}]}`)
	b.sync()
	hooks(c.eng).step = func(p string) error {
		if p == "planned" {
			c.exec(`INSERT INTO other VALUES (1)`)
		}
		return nil
	}
	c.sync()
	hooks(c.eng).step = nil
	b.sync()
	c.sync()
	if gb, gc := b.get("x"), c.get("x"); gb != gc || gb != `{"a":0,"b":2}` {
		t.Fatalf("x diverges for good: b (batched) %s, c (one at a time) %s; want both {\"a\":0,\"b\":2}", gb, gc)
	}
}
