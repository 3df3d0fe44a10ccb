package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
)

// episodeGroupsSchema is a table of grouped episodes with NOT NULL
// projection columns that every record must fill.
const episodeGroupsSchema = `CREATE TABLE IF NOT EXISTS episode_groups (
	id TEXT PRIMARY KEY,
	parent_group_id TEXT,
	content JSONB NOT NULL,
	display_order INTEGER NOT NULL,
	group_type TEXT NOT NULL,
	updated_at TEXT NOT NULL,
	deleted_at TEXT DEFAULT NULL
)`

func newGroupsDevice(t *testing.T, name string, remote Remote) *device {
	t.Helper()
	d := newDevice(t, name, remote, notesSchema, episodeGroupsSchema)
	d.cfg.Tables = []Table{{Name: "episode_groups"}}
	d.open()
	return d
}

func (d *device) putGroup(id, content string) {
	d.t.Helper()
	d.exec(`INSERT INTO episode_groups (id, content, display_order, group_type, updated_at)
VALUES (?1, jsonb(?2), ?2 ->> '$.display_order', ?2 ->> '$.group_type', ?2 ->> '$.updated_at')
ON CONFLICT (id) DO UPDATE SET content = excluded.content, display_order = excluded.display_order,
	group_type = excluded.group_type, updated_at = excluded.updated_at`, id, content)
}

func (d *device) group(id string) string {
	d.t.Helper()
	var s string
	err := d.db.QueryRow(`SELECT json(content) FROM episode_groups WHERE id = ?`, id).Scan(&s)
	if err != nil {
		return ""
	}
	return s
}

func (d *device) groupsDump() string {
	d.t.Helper()
	var b []byte
	rows, err := d.db.Query(`SELECT id, quote(parent_group_id), hex(content), display_order, group_type, updated_at, quote(deleted_at) FROM episode_groups ORDER BY id`)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, parent, content, typ, updated, deleted string
		var order int64
		if err := rows.Scan(&id, &parent, &content, &order, &typ, &updated, &deleted); err != nil {
			d.t.Fatal(err)
		}
		b = append(b, id+" "+parent+" "+content+" "+typ+" "+updated+" "+deleted+"\n"...)
	}
	states := d.dump()
	return string(b) + states
}

func syncGroups(t *testing.T, devs ...*device) {
	t.Helper()
	for range 3 {
		for _, d := range devs {
			if r := d.sync(); len(r.Unwritten) > 0 {
				t.Fatalf("%s: rows the table refused: %v", d.name, r.Unwritten)
			}
		}
	}
	want := devs[0].groupsDump()
	for _, d := range devs[1:] {
		if got := d.groupsDump(); got != want {
			t.Fatalf("%s differs from %s:\n%s\nvs\n%s", d.name, devs[0].name, got, want)
		}
	}
}

const group1 = `{"parent_group_id":null,"name":"Season 1","display_order":1,"group_type":"folder","updated_at":"2024-06-01T12:00:00Z","deleted_at":null}`

// Device 1 physically deletes a group while device 2 renames it, on a
// table with NOT NULL projections. The rename is stamped later (device 2
// syncs after device 1), so the group comes back on every device whole,
// with the new name; before, it came back holding only the name, every
// device reported it unwritten (NOT NULL display_order), and device 2
// kept its old row while the others had none.
func TestDeleteAgainstRenameNeverPartial(t *testing.T) {
	remote := NewMemoryRemote()
	d1, d2, d3 := newGroupsDevice(t, "dev-1", remote), newGroupsDevice(t, "dev-2", remote), newGroupsDevice(t, "dev-3", remote)
	d1.putGroup("g1", group1)
	syncGroups(t, d1, d2, d3)

	d1.exec(`DELETE FROM episode_groups WHERE id = 'g1'`)
	d2.exec(`UPDATE episode_groups SET content = jsonb_set(content, '$.name', 'Season One') WHERE id = 'g1'`)
	d1.sync()
	d2.sync()
	syncGroups(t, d1, d2, d3)
	want := `{"display_order":1,"group_type":"folder","name":"Season One","updated_at":"2024-06-01T12:00:00Z"}`
	for _, d := range []*device{d1, d2, d3} {
		if got := d.group("g1"); got != want {
			t.Fatalf("%s: g1 = %q, want the whole group back with the new name %s", d.name, got, want)
		}
	}
}

// The other way round: the rename syncs first, the delete is stamped after
// it, and the group is gone everywhere.
func TestRenameThenDelete(t *testing.T) {
	remote := NewMemoryRemote()
	d1, d2, d3 := newGroupsDevice(t, "dev-1", remote), newGroupsDevice(t, "dev-2", remote), newGroupsDevice(t, "dev-3", remote)
	d1.putGroup("g1", group1)
	syncGroups(t, d1, d2, d3)

	d1.exec(`DELETE FROM episode_groups WHERE id = 'g1'`)
	d2.exec(`UPDATE episode_groups SET content = jsonb_set(content, '$.name', 'Season One') WHERE id = 'g1'`)
	d2.sync()
	d1.sync()
	syncGroups(t, d1, d2, d3)
	for _, d := range []*device{d1, d2, d3} {
		if got := d.group("g1"); got != "" {
			t.Fatalf("%s: g1 = %s, want it deleted (the delete is newer)", d.name, got)
		}
	}
}

// A device deletes a group and creates one with the same id again: the
// group is exactly the new row on every device, whether the delete was
// synced in between or not; no field of the old group returns.
func TestDeleteThenReinsert(t *testing.T) {
	const group2 = `{"name":"Extras","display_order":7,"group_type":"list","updated_at":"2024-07-01T00:00:00Z","color":"red"}`
	for _, syncBetween := range []bool{false, true} {
		remote := NewMemoryRemote()
		d1, d2 := newGroupsDevice(t, "dev-1", remote), newGroupsDevice(t, "dev-2", remote)
		d1.putGroup("g1", group1)
		syncGroups(t, d1, d2)
		d1.exec(`DELETE FROM episode_groups WHERE id = 'g1'`)
		if syncBetween {
			syncGroups(t, d1, d2)
		}
		d1.putGroup("g1", group2)
		syncGroups(t, d1, d2)
		want := `{"color":"red","display_order":7,"group_type":"list","name":"Extras","updated_at":"2024-07-01T00:00:00Z"}`
		for _, d := range []*device{d1, d2} {
			if got := d.group("g1"); got != want {
				t.Fatalf("sync between %v: %s: g1 = %s, want exactly the new row %s", syncBetween, d.name, got, want)
			}
		}
	}
}

// A device that never had the group, and sees it only as deleted (a
// snapshot or a file carrying the tombstone), creates a group of the same
// id: exactly its row, no hidden field of the old group returns.
func TestCreateOverTombstoneOfAnotherDevice(t *testing.T) {
	remote := NewMemoryRemote()
	d1 := newGroupsDevice(t, "dev-1", remote)
	d1.putGroup("g1", group1)
	d1.sync()
	d1.exec(`DELETE FROM episode_groups WHERE id = 'g1'`)
	d1.sync()
	d2 := newGroupsDevice(t, "dev-2", remote)
	d2.sync()
	d2.putGroup("g1", `{"name":"New","display_order":2,"group_type":"folder","updated_at":"2025-01-01T00:00:00Z"}`)
	syncGroups(t, d1, d2)
	want := `{"display_order":2,"group_type":"folder","name":"New","updated_at":"2025-01-01T00:00:00Z"}`
	if got := d1.group("g1"); got != want {
		t.Fatalf("g1 = %s, want %s", got, want)
	}
}

// A record the app deletes, then creates again while the sync that sends
// the delete runs, is exactly the new row: no field of the deleted record
// returns. Before, the row written at the end of that sync laid the new
// row over the fields hidden under the delete.
func TestReinsertDuringSyncOfDelete(t *testing.T) {
	for _, at := range []string{"fetched", "planned", "uploaded"} {
		remote := NewMemoryRemote()
		a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
		a.put("r", `{"title":"old","extra":1}`)
		syncAll(t, a, b)
		a.exec(`DELETE FROM notes WHERE id = 'r'`)
		hooks(a.eng).step = func(p string) error {
			if p == at {
				a.put("r", `{"title":"new"}`)
			}
			return nil
		}
		a.sync()
		hooks(a.eng).step = nil
		syncAll(t, a, b)
		assertConverged(t, a, b)
		for _, d := range []*device{a, b} {
			if got := d.get("r"); got != `{"title":"new"}` {
				t.Errorf("written at %s: %s has %s, want exactly the new row", at, d.name, got)
			}
		}
	}
}

// A device that edits a record during the sync that receives another
// device's delete of it brings the record back with its edit, as an edit:
// a third device's edit made after the delete survives too. (Sent as a
// new record replacing the old, the edit would have wiped it.)
func TestEditDuringSyncReceivingDelete(t *testing.T) {
	remote := NewMemoryRemote()
	a, b, c := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote), newDevice(t, "dev-c", remote)
	a.put("r", `{"x":1,"y":1,"z":1}`)
	syncAll(t, a, b, c)
	b.exec(`DELETE FROM notes WHERE id = 'r'`)
	b.sync()
	hooks(a.eng).step = func(p string) error {
		if p == "planned" {
			a.exec(`UPDATE notes SET content = jsonb_set(content, '$.z', 3) WHERE id = 'r'`)
		}
		return nil
	}
	a.sync() // receives the delete; the edit lands during it
	hooks(a.eng).step = nil
	c.exec(`UPDATE notes SET content = jsonb_set(content, '$.y', 2) WHERE id = 'r'`)
	c.sync() // stamped after the delete: brings the record back
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got := b.get("r"); got != `{"x":1,"y":2,"z":3}` {
		t.Fatalf("r = %s, want the record back with both edits", got)
	}
}

// A device creates a record it never saw, over one another device
// created and deleted: the new row is a new record, and no field of the
// deleted one comes back (before, the create went out as an edit, and an
// edit of a deleted record brings it back whole). The device may have
// synced before the record existed, or be new.
func TestCreateOverUnseenDelete(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		remote := NewMemoryRemote()
		a := newDevice(t, "dev-a", remote)
		var c *device
		if !fresh {
			c = newDevice(t, "dev-c", remote)
			syncAll(t, a, c)
		}
		a.put("r", `{"title":"old","secret":"s"}`)
		a.sync()
		a.exec(`DELETE FROM notes WHERE id = 'r'`)
		a.sync()
		if fresh {
			c = newDevice(t, "dev-c", remote)
		}
		c.put("r", `{"title":"new"}`) // before c downloaded anything of r
		syncAll(t, a, c)
		assertConverged(t, a, c)
		for _, d := range []*device{a, c} {
			if got := d.get("r"); got != `{"title":"new"}` {
				t.Errorf("fresh=%v: %s: r = %s, want exactly the new row", fresh, d.name, got)
			}
		}
	}
}

// Two devices create the same record at once, neither having seen the
// other's, and one of them also received a delete of an older version:
// only a record the downloads leave deleted is replaced; one they leave
// shown merges with the create.
func TestCreateOverUnseenRecreation(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	c := newDevice(t, "dev-c", remote)
	syncAll(t, a, c)
	a.put("r", `{"title":"old","secret":"s"}`)
	a.sync()
	a.exec(`DELETE FROM notes WHERE id = 'r'`)
	a.sync()
	a.put("r", `{"title":"again","kept":"k"}`) // created again over the delete a saw
	a.sync()
	c.put("r", `{"body":"mine"}`) // c saw none of it
	syncAll(t, a, c)
	assertConverged(t, a, c)
	if got := a.get("r"); got != `{"body":"mine","kept":"k","title":"again"}` {
		t.Errorf("r = %s, want the two creates merged, and no field of the deleted record", got)
	}
}

// A device re-creates a record over a delete it saw, while another device
// creates the same record without having seen anything of it, stamped
// after the delete: the two creates merge, as they do when nobody deleted
// the record before, and no field of the deleted record comes back.
// (Before, the replacing write's reset was stamped just below its own
// version, above the other create, which vanished on every device.)
func TestRecreateKeepsUnseenConcurrentCreate(t *testing.T) {
	for _, history := range []bool{false, true} {
		lag := &laggingRemote{Remote: NewMemoryRemote(), hidden: map[string][]string{}}
		a, b, c := newDevice(t, "dev-a", lag.as("dev-a")), newDevice(t, "dev-b", lag.as("dev-b")), newDevice(t, "dev-c", lag.as("dev-c"))
		syncAll(t, a, b, c)
		lag.hide("dev-c", "dev-b") // c sees nothing of b's
		if history {
			b.put("x", `{"old":"o"}`)
			b.sync()
			b.exec(`DELETE FROM notes WHERE id = 'x'`)
			b.sync()
		}
		for i := range 3 { // c's clock passes b's delete
			c.put("y", fmt.Sprintf(`{"n":%d}`, i))
			c.sync()
		}
		lag.hide("dev-a", "dev-c") // a sees nothing of c's
		c.put("x", `{"c":"mine"}`)
		c.sync()
		for i := range 5 { // b's, and so a's, clock passes c's create
			b.put("z", fmt.Sprintf(`{"n":%d}`, i))
			b.sync()
		}
		a.put("x", `{"a":"mine"}`) // over the delete a received, if any
		r := a.sync()
		if f, _ := patchFileHead(t, lag.Remote, r.Uploaded); history && f != 3 {
			t.Errorf("a's replacing write went out in a file of format %d, want 3", f)
		}
		lag.hide("dev-a")
		lag.hide("dev-c")
		syncAll(t, a, b, c)
		assertConverged(t, a, b, c)
		if got := a.get("x"); got != `{"a":"mine","c":"mine"}` {
			t.Errorf("history=%v: x = %s, want both creates merged", history, got)
		}
	}
}

// A sync's changes go in files of the oldest format that holds them:
// devices on an older app version read every file but the one with a
// replacing write.
func TestReplacingWriteAloneInNewerFormat(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("r", `{"title":"old"}`)
	a.sync()
	a.exec(`DELETE FROM notes WHERE id = 'r'`)
	a.sync()
	a.put("p", `{"title":"plain"}`) // planned before r
	a.put("r", `{"title":"new"}`)   // created again over the delete
	a.put("s", `{"title":"plain too"}`)
	before := len(remoteFiles(t, remote, kindPatch))
	a.sync()
	names := remoteFiles(t, remote, kindPatch) // a's, the only writer
	slices.Sort(names)
	var files []string
	for _, name := range names[before:] {
		format, n := patchFileHead(t, remote, name)
		files = append(files, fmt.Sprintf("format %d with %d changes", format, n))
	}
	if want := []string{"format 2 with 2 changes", "format 3 with 1 changes"}; !slices.Equal(files, want) {
		t.Fatalf("the sync uploaded %q, want %q: p and s in format 2, r alone in format 3", files, want)
	}
	b.sync()
	assertConverged(t, a, b)
	if got := b.get("r"); got != `{"title":"new"}` {
		t.Fatalf("r = %s, want exactly the new row", got)
	}
}

// patchFileHead returns the format a patch file on remote says it has,
// and the number of its changes.
func patchFileHead(t *testing.T, remote Remote, name string) (format, changes int) {
	t.Helper()
	rc, err := remote.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Format  int               `json:"format"`
		Changes []json.RawMessage `json:"changes"`
	}
	if err := json.NewDecoder(zr).Decode(&head); err != nil {
		t.Fatal(err)
	}
	return head.Format, len(head.Changes)
}

// A replacing write of format 2 (an older app version) ends every write
// stamped before its own version; one of format 3 only those up to its
// reset. Both read alike on every device.
func TestReplacingWriteFormats(t *testing.T) {
	for _, tt := range []struct {
		format int
		reset  string
		want   string
	}{
		{2, ``, `{"a":1}`},
		{3, `,"reset":{"sync_version":2,"device":"dev-b"}`, `{"a":1,"c":1}`},
	} {
		remote := NewMemoryRemote()
		at := time.Now().Add(-time.Minute)
		put := func(device, body string) {
			at = at.Add(time.Second)
			if err := remote.Create(context.Background(), patchFileName(at, device), bytes.NewReader(gzipBytes([]byte(body)))); err != nil {
				t.Fatal(err)
			}
		}
		put("dev-c", `{"format":2,"device":"dev-c","changes":[{"table_name":"notes","record_id":"x","patch":{"c":1},"is_deleted":false,"sync_version":3}]}`)
		put("dev-a", fmt.Sprintf(`{"format":%d,"device":"dev-a","changes":[{"table_name":"notes","record_id":"x","patch":{"a":1},"is_deleted":false,"sync_version":10,"replaces":true%s}]}`, tt.format, tt.reset))
		d := newDevice(t, "dev-d", remote)
		if r := d.sync(); len(r.Rejected) > 0 {
			t.Fatalf("format %d: rejected %v", tt.format, r.Rejected)
		}
		if got := d.get("x"); got != tt.want {
			t.Errorf("format %d: x = %s, want %s", tt.format, got, tt.want)
		}
	}
}

// A device re-creates a record over a delete it saw, in a sync whose
// downloads bring a later re-creation of the record by another device
// and that device's delete of it. The replacing write is stamped after
// those downloads (its version is above everything the sync saw); with
// its reset at the synced state's newest stamp from before them, the
// other device's re-created record, which its own delete hid, came back
// merged into the new row. The reset must be the newest stamp once the
// downloads are applied, as it is when the device synced once before
// writing.
func TestRecreateOverDeleteReceivedInSameSync(t *testing.T) {
	for _, syncedFirst := range []bool{true, false} {
		remote := NewMemoryRemote()
		a, b, c := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote), newDevice(t, "dev-c", remote)
		b.put("x", `{"old":"o"}`)
		syncAll(t, b, a, c)
		b.exec(`DELETE FROM notes WHERE id = 'x'`)
		syncAll(t, b, a, c)                 // every device has x deleted
		c.put("x", `{"c":"deleted later"}`) // created again over the delete...
		c.sync()
		c.exec(`DELETE FROM notes WHERE id = 'x'`) // ...and deleted again
		c.sync()
		if syncedFirst {
			a.sync() // a's state has c's delete
		}
		a.put("x", `{"a":"mine"}`) // over the delete a saw
		a.sync()
		syncAll(t, a, b, c)
		assertConverged(t, a, b, c)
		if got := a.get("x"); got != `{"a":"mine"}` {
			t.Errorf("syncedFirst=%v: x = %s, want {\"a\":\"mine\"}: c's deleted record came back", syncedFirst, got)
		}
	}
}

// Two devices that both saw a record deleted create it again at once:
// the two creates merge, as creates of a record nobody deleted do, also
// when one device receives the other's in the sync that sends its own.
func TestTwoRecreationsMerge(t *testing.T) {
	remote := NewMemoryRemote()
	a, b, c := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote), newDevice(t, "dev-c", remote)
	b.put("x", `{"old":"o"}`)
	syncAll(t, b, a, c)
	b.exec(`DELETE FROM notes WHERE id = 'x'`)
	syncAll(t, b, a, c)
	c.put("x", `{"c":"mine"}`)
	c.sync()
	a.put("x", `{"a":"mine"}`) // before a received c's
	a.sync()
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	if got := a.get("x"); got != `{"a":"mine","c":"mine"}` {
		t.Errorf("x = %s, want both creates merged and nothing of the deleted record", got)
	}
}
