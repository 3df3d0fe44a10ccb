package drivesync

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// Review 22: renew_id, overridesConflicts, writeTogether's bounded tries,
// and writeOne.

// A copy opened while its outbox held an upload keeps the old id and
// owes a new one (sync_meta renew_id). The app then sets Config.DeviceID
// itself, to the id the database syncs as (what DeviceID() returned),
// and Open accepts it: the README says that with Config.DeviceID set
// the engine never changes the id (a copy's sync fails instead). But
// renew_id stays set, and the next sync's renewMovedID takes a new id
// regardless of Config.DeviceID. The id the app configured is then not
// the stored one, and every later Open with that same Config fails
// ("Config.DeviceID ... differs from the id ... this database already
// syncs as"): the device is stuck at Open.
//
// Sequence: a (stored id zz-old, Config.DeviceID empty) is killed after
// an upload; its file is copied and opened (renew owed); the copy is
// reopened with Config.DeviceID = zz-old; it syncs; it is reopened.
//
// Open then dropped the owed id when the app set Config.DeviceID. Now
// (review 26) it refuses the copy under the id it owes a change of, and
// takes the new id the app gives it instead, after the outbox's upload
// goes out under the old one; later Opens with that Config work.
func TestReview22RenewIgnoresConfiguredDeviceID(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "zz-old", remote)
	a.cfg.DeviceID = ""
	a.open()
	x := newDevice(t, "x-dev", remote)
	killedAfterUpload(t, a, x)
	cfg := a.cfg
	cfg.TempDir = t.TempDir()
	c := copyFileDevice(t, a, "copy", cfg)
	if id := c.eng.DeviceID(); id != "zz-old" {
		t.Fatalf("setup: the copy opened as %s, want zz-old (renew owed)", id)
	}
	c.eng.Close()
	c.cfg.DeviceID = "zz-old" // the app now sets the id it syncs as
	if _, err := Open(context.Background(), c.db, c.cfg); err == nil || !strings.Contains(err.Error(), "give this one its own Config.DeviceID") {
		t.Fatalf("the copy opens under the original's id: %v", err)
	}
	c.cfg.DeviceID = "zz-copy"
	c.open()
	if _, err := c.eng.Sync(context.Background()); err != nil {
		t.Logf("copy's sync: %v", err)
	}
	if id := c.eng.DeviceID(); id != "zz-copy" {
		t.Errorf("the copy now syncs as %s though Config.DeviceID is zz-copy", id)
	}
	c.eng.Close()
	if _, err := Open(context.Background(), c.db, c.cfg); err != nil {
		t.Errorf("every later Open with the app's Config fails: %v", err)
	}
}

// keyOnlyDevices are two devices of a table whose only column is its key
// (a set of tags), b with a trigger that skips inserts of blocked tags.
func keyOnlyDevices(t *testing.T, schema string) (a, b *device) {
	remote := NewMemoryRemote()
	a = rowsDevice(t, "dev-a", remote, schema, Table{Name: "tags"})
	b = rowsDevice(t, "dev-b", remote, schema, Table{Name: "tags"})
	b.exec(`CREATE TABLE blocked (name TEXT PRIMARY KEY)`)
	b.exec(`CREATE TRIGGER tags_blocked BEFORE INSERT ON tags WHEN NEW.name IN (SELECT name FROM blocked) BEGIN SELECT RAISE(IGNORE); END`)
	return a, b
}

// writeOne makes a write that an app trigger skips with RAISE(IGNORE) a
// refusal (README: "reported as refused too, and tried again at every
// sync"), but upsertColumns leaves out the write of a row whose record
// has no non-key column (a key-only table: tags, a set): its INSERT ...
// DO NOTHING runs with exec, whose zero changed rows read as "the row
// exists". b's trigger skips the insert: the row is missing, its synced
// state says it exists, nothing is reported and nothing is tried again.
// Once b unblocks the tag, b still never gets it: the devices differ
// for good, in silence.
//
// Sequence: b blocks tag x; a inserts x; a syncs; b syncs; b unblocks
// x; b syncs.
//
// Now a DO NOTHING upsert that leaves no row is a refusal.
func TestReview22KeyOnlyRowIgnoredSilently(t *testing.T) {
	for _, schema := range []string{
		`CREATE TABLE tags (name TEXT PRIMARY KEY)`,
		`CREATE TABLE tags (name TEXT PRIMARY KEY) WITHOUT ROWID`,
	} {
		t.Run(schema, func(t *testing.T) {
			a, b := keyOnlyDevices(t, schema)
			b.exec(`INSERT INTO blocked VALUES ('x')`)
			a.exec(`INSERT INTO tags VALUES ('x')`)
			a.sync()
			r := b.sync()
			if got := b.rows(`SELECT name FROM tags`); got != "" {
				t.Fatalf("setup: b holds %q", got)
			}
			if ids := unwrittenIDs(r); len(ids) != 1 {
				t.Errorf("b: the row its trigger skipped is not reported (unwritten %v)", ids)
			}
			b.exec(`DELETE FROM blocked`)
			b.sync()
			if got, want := b.rows(`SELECT name FROM tags`), a.rows(`SELECT name FROM tags`); got != want {
				t.Errorf("tags diverge for good: b %q, a %q", got, want)
			}
		})
	}
}

// The engine's delete of a row is a write of the app's row too, but
// deleteRow runs it with exec: a BEFORE DELETE trigger of the app that
// raises IGNORE keeps the row in silence, while its synced state says it
// is deleted. Nothing is reported or tried again, and once b unlocks the
// row it still shows it: a and b differ for good.
//
// Sequence: b locks r; a deletes r; a syncs; b syncs; b unlocks r; b
// syncs.
//
// Now a delete that leaves the row is a refusal (deleteOne).
func TestReview22DeleteIgnoredSilently(t *testing.T) {
	for _, shape := range []struct{ name, schema, insert string }{
		{"ordinary", `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`, `INSERT INTO items VALUES ('r', 'open')`},
		{"document", `CREATE TABLE items (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT)`, `INSERT INTO items (id, content, title) VALUES ('r', jsonb('{"title":"open"}'), 'open')`},
	} {
		t.Run(shape.name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := rowsDevice(t, "dev-a", remote, shape.schema, Table{Name: "items"})
			b := rowsDevice(t, "dev-b", remote, shape.schema, Table{Name: "items"})
			b.exec(`CREATE TABLE locked (id TEXT PRIMARY KEY)`)
			b.exec(`CREATE TRIGGER items_locked BEFORE DELETE ON items WHEN OLD.id IN (SELECT id FROM locked) BEGIN SELECT RAISE(IGNORE); END`)
			a.exec(shape.insert)
			syncAll(t, a, b)
			b.exec(`INSERT INTO locked VALUES ('r')`)
			a.exec(`DELETE FROM items`)
			a.sync()
			r := b.sync()
			if ids := unwrittenIDs(r); len(ids) != 1 {
				t.Errorf("b: the delete its trigger skipped is not reported (unwritten %v)", ids)
			}
			b.exec(`DELETE FROM locked`)
			b.sync()
			if got, want := b.rows(`SELECT id FROM items`), a.rows(`SELECT id FROM items`); got != want {
				t.Errorf("items diverge for good: b %q, a %q", got, want)
			}
		})
	}
}

// writeTogether drops one refused row per try and gives up after
// togetherTries (8). With eight rows the table refuses for their own
// reason (b's UNIQUE index on title: a gave them i1's title) beside a
// swap of i1 and i2, every try is spent removing one of them, and the
// swap, which the table takes on its own, is never tried clean: b's
// positions differ from a's and from its own sync_states for as long as
// those rows are refused, at every sync (the group is the same, in the
// same order, each time). It is review21's UnrelatedRefusalBlocksSwap
// with eight unrelated rows instead of one.
//
// Sequence: a has i1..i3 and j1..j8; b adds a UNIQUE index on title; a
// swaps i1 and i2 and sets j1..j8's titles to 'first'; all sync.
//
// Now the tries are bounded at 64 per table and sync, and rows refused
// over a CHECK, NOT NULL or foreign key never join the group (see
// writeTogether; review 23 replaced a first fix that dropped every row
// refused in a try at once).
func TestReview22EightRefusalsBlockSwap(t *testing.T) {
	a, b := swapDevices(t, testDSN, `CREATE UNIQUE INDEX items_title ON items (title)`, "")
	for i := 1; i <= 8; i++ {
		a.exec(fmt.Sprintf(`INSERT INTO items VALUES ('j%d', %d, 'title %d')`, i, 100+i, i))
	}
	syncAll(t, a, b)
	swap(t, a)
	a.exec(`UPDATE items SET title = 'first' WHERE id LIKE 'j%'`)
	syncAll(t, a, b)
	r := b.sync()
	if ids := unwrittenIDs(r); len(ids) != 8 {
		t.Errorf("b: unwritten %v, want j1..j8 alone", ids)
	}
	q := `SELECT id, pos FROM items WHERE id LIKE 'i%' ORDER BY id`
	if got, want := b.rows(q), a.rows(q); got != want {
		t.Errorf("positions diverge for good: b %q, a %q", got, want)
	}
}
