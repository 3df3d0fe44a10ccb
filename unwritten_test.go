package drivesync

import (
	"context"
	"testing"
)

const (
	slugSchema  = `CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, slug TEXT)`
	uniqueSlugs = `CREATE UNIQUE INDEX notes_slug ON notes (slug)`
)

func unwrittenIDs(r Report) []string {
	var ids []string
	for _, u := range r.Unwritten {
		ids = append(ids, u.Table+"/"+u.Record)
	}
	return ids
}

// TestUnwrittenFixedInSameSync: a row the app's UNIQUE refused is written
// once a later file of the same sync makes it acceptable, and is not
// reported: whether the later file changes the refused record itself or
// the record that held its value.
func TestUnwrittenFixedInSameSync(t *testing.T) {
	for _, tc := range []struct {
		name, fixID, fixContent string
		want                    map[string]string
	}{
		{"refused record changed", "n2", `{"slug":"other"}`, map[string]string{"n1": `{"slug":"same"}`, "n2": `{"slug":"other"}`}},
		{"conflicting record changed", "n1", `{"slug":"moved"}`, map[string]string{"n1": `{"slug":"moved"}`, "n2": `{"slug":"same"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			remote := NewMemoryRemote()
			a := newDevice(t, "dev-a", remote, slugSchema)
			o := newDevice(t, "dev-o", remote, slugSchema, uniqueSlugs)
			a.put("n1", `{"slug":"same"}`)
			a.sync()
			a.put("n2", `{"slug":"same"}`)
			a.sync()
			a.put(tc.fixID, tc.fixContent)
			a.sync()
			r := o.sync()
			if len(r.Downloaded) != 3 {
				t.Fatalf("downloaded %v, want the 3 files in one sync", r.Downloaded)
			}
			if len(r.Unwritten) != 0 {
				t.Errorf("unwritten %v, want none: every row was written in the end", unwrittenIDs(r))
			}
			for id, want := range tc.want {
				if got := o.get(id); got != want {
					t.Errorf("%s = %q, want %s", id, got, want)
				}
			}
		})
	}
}

// TestUnwrittenRetriedLater: a refused row is written at a later sync once
// it can be, though no change of that record arrives: when another
// device's change, or the app's own, frees its value, or when the app
// drops the constraint.
func TestUnwrittenRetriedLater(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote, slugSchema)
	o := newDevice(t, "dev-o", remote, slugSchema, uniqueSlugs)
	a.put("n1", `{"slug":"same"}`)
	a.put("n2", `{"slug":"same"}`)
	a.put("n3", `{"slug":"dup"}`)
	a.put("n4", `{"slug":"dup"}`)
	a.put("n5", `{"slug":"kept"}`)
	a.put("n6", `{"slug":"kept"}`)
	a.sync()
	if r := o.sync(); len(r.Unwritten) != 3 {
		t.Fatalf("unwritten %v, want one of each pair", unwrittenIDs(r))
	}
	if o.get("n2") != "" || o.get("n4") != "" || o.get("n6") != "" {
		t.Fatal("a refused row was written")
	}

	// Another device frees "same".
	a.put("n1", `{"slug":"moved"}`)
	a.sync()
	r := o.sync()
	if got, want := o.get("n2"), `{"slug":"same"}`; got != want {
		t.Errorf("n2 = %q, want %s once n1 moved", got, want)
	}
	if ids := unwrittenIDs(r); len(ids) != 2 {
		t.Errorf("unwritten %v, want the two still refused", ids)
	}

	// The app itself frees "dup".
	o.exec(`DELETE FROM notes WHERE id = 'n3'`)
	r = o.sync()
	if got, want := o.get("n4"), `{"slug":"dup"}`; got != want {
		t.Errorf("n4 = %q, want %s once the app deleted n3", got, want)
	}
	if ids := unwrittenIDs(r); len(ids) != 1 || ids[0] != "notes/n6" {
		t.Errorf("unwritten %v, want notes/n6", ids)
	}

	// The app drops the constraint: an idle sync writes the last one.
	o.exec(`DROP INDEX notes_slug`)
	if r := o.sync(); len(r.Unwritten) != 0 || o.get("n6") != `{"slug":"kept"}` {
		t.Errorf("unwritten %v, n6 = %q; want n6 written", unwrittenIDs(r), o.get("n6"))
	}
	syncAll(t, a, o)
	for _, id := range []string{"n1", "n2", "n4", "n5", "n6"} {
		if got, want := o.get(id), a.get(id); got != want {
			t.Errorf("%s: o has %q, a has %q", id, got, want)
		}
	}
	if _, err := o.eng.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestUnwrittenWhenTableRegistered: a synced record that a newly
// registered table refuses is tried again by later syncs, as one a sync
// refused.
func TestUnwrittenWhenTableRegistered(t *testing.T) {
	const tags = `CREATE TABLE tags (id TEXT PRIMARY KEY, content JSONB NOT NULL, slug TEXT)`
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote, notesSchema, tags)
	a.cfg.Tables = []Table{{Name: "notes"}, {Name: "tags"}}
	a.eng.Close()
	a.open()
	a.exec(`INSERT INTO tags (id, content) VALUES ('t1', jsonb('{"slug":"x"}')), ('t2', jsonb('{"slug":"x"}'))`)
	a.sync()

	o := newDevice(t, "dev-o", remote)
	if r := o.sync(); r.Unregistered != 2 {
		t.Fatalf("report %+v, want the two tags kept for later", r)
	}
	o.exec(tags)
	o.exec(`CREATE UNIQUE INDEX tags_slug ON tags (slug)`)
	o.cfg.Tables = []Table{{Name: "notes"}, {Name: "tags"}}
	o.eng.Close()
	o.open()
	if r := o.sync(); len(r.Unwritten) != 1 || r.Unwritten[0].Record != "t2" {
		t.Fatalf("unwritten %v, want tags/t2", unwrittenIDs(r))
	}
	o.exec(`DROP INDEX tags_slug`)
	if r := o.sync(); len(r.Unwritten) != 0 {
		t.Fatalf("unwritten %v after the index was dropped", unwrittenIDs(r))
	}
	var n int
	if err := o.db.QueryRow(`SELECT count(*) FROM tags`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d tags, %v; want both", n, err)
	}
}

// TestEditOfRefusedRow: the app edits a row its own constraint kept from
// being updated; the row still shows the older content. Only the app's
// edit may go out: diffing the stale row against the newer synced state
// would send back the old values of the fields another device changed.
func TestEditOfRefusedRow(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote, slugSchema, uniqueSlugs)
	b := newDevice(t, "dev-b", remote, slugSchema)
	a.put("n1", `{"slug":"s1","x":1,"y":1}`)
	syncAll(t, a, b)
	a.put("n3", `{"slug":"dup"}`) // not yet synced
	b.put("n1", `{"slug":"dup","x":1,"y":2}`)
	b.sync()
	if r := a.sync(); len(r.Unwritten) != 1 {
		t.Fatalf("a: unwritten %v, want n1 refused by the UNIQUE slug", unwrittenIDs(r))
	}
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.x', 5) WHERE id = 'n1'`)
	a.sync()
	b.sync()
	if got, want := b.get("n1"), `{"slug":"dup","x":5,"y":2}`; got != want {
		t.Fatalf("b: n1 = %s, want %s (a's edit of x on top of b's edits)", got, want)
	}
}

// A row the app's table refused still shows its old content
// (sync_unwritten.base); planRecord knows that the app's edits are the
// difference from that base. But when the app writes such a record again
// while the sync that sends its first edit runs, rebasePending takes the
// merged synced state as the row's base, so the old values the row still
// showed count as the app's edits: the row is written with them, and the
// next sync sends them, overwriting another device's newer values
// everywhere. Now the app's edits during the sync are taken from what its
// row held when the plan read it.

const checkedNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content JSONB NOT NULL,
	title TEXT,
	display_order INTEGER CHECK (display_order IS NULL OR display_order < 100)
)`

// refusedOnB returns device a, which accepts any display_order, and
// device b, an app version whose table checks it, after a set r's
// display_order to 500: b synced it and its table refused the row, which
// still shows display_order 1.
func refusedOnB(t *testing.T) (a, b *device) {
	t.Helper()
	remote := NewMemoryRemote()
	a = newDevice(t, "dev-a", remote)
	b = newDevice(t, "dev-b", remote, checkedNotesSchema)
	a.put("r", `{"title":"t","display_order":1,"body":"1"}`)
	syncAll(t, a, b)
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.display_order', 500), display_order = 500 WHERE id = 'r'`)
	a.sync()
	if r := b.sync(); len(r.Unwritten) != 1 {
		t.Fatalf("setup: b should refuse r, got %v", r.Unwritten)
	}
	return a, b
}

func TestRefusedRowWrittenDuringSyncKeepsOthersValues(t *testing.T) {
	a, b := refusedOnB(t)

	// The user of b edits the body (the row still shows display_order 1),
	// and edits it again while the sync that sends the first edit runs.
	b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', '2') WHERE id = 'r'`)
	hooks(b.eng).step = func(point string) error {
		if point == "planned" {
			b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', '3') WHERE id = 'r'`)
		}
		return nil
	}
	b.sync()
	hooks(b.eng).step = nil
	b.sync()
	a.sync()
	if got := a.get("r"); got != `{"body":"3","display_order":500,"title":"t"}` {
		t.Errorf("a: r = %s: b never changed display_order, yet a's 500 was overwritten by the old value b's row still showed", got)
	}
}

// The same through applyReceived: the record is not pending when the sync
// plans, another device's change to it arrives, and the app edits the row
// during the sync. pendingEdit.base is the synced state from before the
// change, not what the refused row shows.
func TestRefusedRowWrittenWhileReceivingKeepsOthersValues(t *testing.T) {
	a, b := refusedOnB(t)
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'u') WHERE id = 'r'`)
	a.sync()
	hooks(b.eng).step = func(point string) error {
		if point == "planned" {
			b.exec(`UPDATE notes SET content = jsonb_set(content, '$.body', '3') WHERE id = 'r'`)
		}
		return nil
	}
	b.sync()
	hooks(b.eng).step = nil
	b.sync()
	a.sync()
	if got := a.get("r"); got != `{"body":"3","display_order":500,"title":"u"}` {
		t.Errorf("a: r = %s: b only edited the body, yet a's display_order 500 was overwritten by the old value b's refused row showed", got)
	}
}
