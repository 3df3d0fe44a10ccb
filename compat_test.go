package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"testing"
	"time"
)

// Files and states written by the previous engine version (patch and state
// format 1, schema 2) keep their meaning: a physical delete there ended
// every write stamped before it, fields included, and a record created
// again afterwards held only what was written after the delete. A device
// on this engine applies such files with that rule, so that it stores,
// byte for byte, what a device that applied them under the previous
// engine and then upgraded stores.

// A format 1 patch file (written by a device still on the
// previous engine) that creates a record again after a delete carries the
// whole new row and no removals: the old engine diffed a re-created row
// against nothing. The current engine reads the delete of that same store
// as hiding the old fields, and the format 1 re-creation as a write after
// the delete, so it shows the old fields again, merged into the new row:
// deleted data comes back, and devices that applied the same files under
// the old engine (and, migrated, under the new one) show only the new row.

// writeFormat1 stores a hand-written format 1 patch file from device dev,
// exactly as the previous engine wrote them.
func writeFormat1(t *testing.T, remote Remote, at time.Time, dev string, changes ...string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	fmt.Fprintf(gz, `{"format":1,"device":%q,"changes":[`, dev)
	for i, c := range changes {
		if i > 0 {
			gz.Write([]byte(","))
		}
		gz.Write([]byte("\n" + c))
	}
	gz.Write([]byte("\n]}\n"))
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	name := patchFileName(at, dev)
	if err := remote.Create(context.Background(), name, &buf); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestFormat1RecreationKeepsItsMeaning(t *testing.T) {
	mem := NewMemoryRemote()
	clk := &reproClock{t: time.Now().UTC().Add(-time.Hour)}
	mem.SetClock(clk.now)
	// dev-2 is a device on the old engine: bound to the store before the
	// files below exist.
	old := newDevice(t, "dev-2", mem)
	old.sync()
	clk.add(time.Minute)

	// dev-0, on the old engine, creates r, deletes it, and creates it
	// again as {"x":1}: three format 1 files.
	f1 := writeFormat1(t, mem, clk.now(), "dev-0", `{"table_name":"notes","record_id":"r","patch":{"a":1,"b":2},"is_deleted":false,"sync_version":1}`)
	clk.add(time.Second)
	f2 := writeFormat1(t, mem, clk.now(), "dev-0", `{"table_name":"notes","record_id":"r","patch":{},"is_deleted":true,"sync_version":2}`)
	clk.add(time.Second)
	f3 := writeFormat1(t, mem, clk.now(), "dev-0", `{"table_name":"notes","record_id":"r","patch":{"x":1},"is_deleted":false,"sync_version":3}`)
	clk.add(time.Second)

	// dev-2 applied them with the old engine: the row is {"x":1}, and the
	// state keeps the delete as the root's floor (schema 2). It then
	// upgrades: Open migrates the clock.
	old.exec(`UPDATE sync_control SET is_syncing = 1`)
	old.exec(`INSERT INTO notes (id, content) VALUES ('r', jsonb('{"x":1}'))`)
	old.exec(`UPDATE sync_control SET is_syncing = 0`)
	old.exec(`INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
		VALUES ('notes', 'r', '{"x":1}', '{"d":["dev-0"],"n":[3,0,{},2,0]}', 3, 'dev-0', 0)`)
	for _, f := range []string{f1, f2, f3} {
		old.exec(`INSERT INTO sync_files (name, status, size) VALUES (?, 'applied', 0)`, f)
	}
	old.exec(`UPDATE sync_meta SET value = '3' WHERE key = 'max_version'`)
	old.exec(`UPDATE sync_meta SET value = '2' WHERE key = 'schema_version'`)
	old.open()
	if got := old.get("r"); got != `{"x":1}` {
		t.Fatalf("old device: r = %s", got)
	}

	// A device on the new engine receives the same three files.
	n := newDevice(t, "dev-3", mem)
	n.sync()
	if got := n.get("r"); got != `{"x":1}` {
		t.Errorf("new device: r = %s, want {\"x\":1} (the re-created row, as its writer and every old device have it)", got)
	}
	syncAll(t, old, n)
	assertConverged(t, old, n)
}

// A device that applied a format 1 create and delete under the previous
// engine, and upgraded, stores what a device on this engine stores for the
// same files; an edit stamped after the delete, from a device that had the
// record, then shows the same record on every device.
func TestFormat1DeleteSameAfterUpgrade(t *testing.T) {
	mem := NewMemoryRemote()
	clk := &reproClock{t: time.Now().UTC().Add(-time.Hour)}
	mem.SetClock(clk.now)
	old := newDevice(t, "dev-2", mem) // applies the files under the previous engine
	old.sync()
	edit := newDevice(t, "dev-4", mem) // had the record, never saw the delete
	edit.sync()
	clk.add(time.Minute)
	f1 := writeFormat1(t, mem, clk.now(), "dev-0", `{"table_name":"notes","record_id":"r","patch":{"a":1,"b":2},"is_deleted":false,"sync_version":1}`)
	clk.add(time.Second)
	edit.sync()
	if got := edit.get("r"); got != `{"a":1,"b":2}` {
		t.Fatalf("setup: r = %s", got)
	}
	f2 := writeFormat1(t, mem, clk.now(), "dev-0", `{"table_name":"notes","record_id":"r","patch":{},"is_deleted":true,"sync_version":2}`)
	clk.add(time.Second)

	// What the previous engine stored after both files: the delete's stamp
	// alone, no row.
	old.exec(`INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
		VALUES ('notes', 'r', '{}', '{"d":["dev-0"],"n":[2,0]}', 2, 'dev-0', 1)`)
	for _, f := range []string{f1, f2} {
		old.exec(`INSERT INTO sync_files (name, status, size) VALUES (?, 'applied', 0)`, f)
	}
	old.exec(`UPDATE sync_meta SET value = '2' WHERE key = 'max_version'`)
	old.exec(`UPDATE sync_meta SET value = '2' WHERE key = 'schema_version'`)
	old.open()
	n := newDevice(t, "dev-3", mem)
	n.sync()
	if o, nd := old.dump(), n.dump(); o != nd {
		t.Fatalf("the same files, different states:\nupgraded:\n%s\nnew:\n%s", o, nd)
	}
	edit.exec(`UPDATE notes SET content = jsonb_set(content, '$.c', 3) WHERE id = 'r'`)
	syncAll(t, edit, old, n)
	assertConverged(t, edit, old, n)
}
