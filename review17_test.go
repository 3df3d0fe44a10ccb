package drivesync

import (
	"fmt"
	"strings"
	"testing"
)

// kvDevices are two devices syncing kv, whose key column k has no
// declared type (no affinity: an INTEGER stays an INTEGER, a REAL a REAL).
func kvDevices(t *testing.T) (a, b *device) {
	const schema = `CREATE TABLE kv (k, v, PRIMARY KEY (k)) WITHOUT ROWID`
	remote := NewMemoryRemote()
	a = rowsDevice(t, "dev-a", remote, schema, Table{Name: "kv"})
	b = rowsDevice(t, "dev-b", remote, schema, Table{Name: "kv"})
	return a, b
}

// An UPDATE that writes the key back as the REAL 1.0 where it held the
// INTEGER 1 (an app or binding that handles numbers as float64, an ORM that
// sets every column) changes the key to a value with no record id, and
// OLD.k IS NOT NEW.k is false (1 = 1.0): the rekey trigger, which alone
// checks the key now, does not fire. The update trigger, which no longer
// checks, logs the mark '1.0'; decodeKey cannot read it, the plan settles
// it as a no-op, and the edit of v is never sent: dev-b keeps the old
// value for ever. Before 2206052 the update trigger's check refused the
// statement.
func TestReview17RealKeyUpdateEscapesCheck(t *testing.T) {
	a, b := kvDevices(t)
	a.exec(`INSERT INTO kv (k, v) VALUES (1, 'old')`)
	syncAll(t, a, b)
	_, err := a.db.Exec(`UPDATE kv SET k = ?, v = ? WHERE k = ?`, 1.0, "new", 1)
	if err == nil || !strings.Contains(err.Error(), "drivesync: table kv: key column k") {
		t.Errorf("the update of key 1 to 1.0 returned %v, want the trigger's refusal", err)
	}
	syncAll(t, a, b)
	if got, want := b.rows(`SELECT v FROM kv`), a.rows(`SELECT v FROM kv`); got != want {
		t.Fatalf("the app's UPDATE (key 1 -> 1.0, v -> 'new') was accepted and never sent: dev-a shows %q, dev-b %q, pending on dev-a %d", want, got, a.pendingCount())
	}
}

// (Older than these commits.) The key of a table whose key is its rowid
// (id INTEGER PRIMARY KEY, Table.UniqueIntegerKey) also changes through
// the rowid's other names: UPDATE t SET rowid = ... does not name id, so
// the rekey trigger (AFTER UPDATE OF id) does not fire and the old record
// is never deleted. The update trigger marks the new key: dev-b ends with
// both rows, dev-a with one.
func TestReview17RowidAliasRekeyEscapesCapture(t *testing.T) {
	const schema = `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`
	remote := NewMemoryRemote()
	tables := Table{Name: "t", UniqueIntegerKey: true}
	a := rowsDevice(t, "dev-a", remote, schema, tables)
	b := rowsDevice(t, "dev-b", remote, schema, tables)
	a.exec(`INSERT INTO t (id, v) VALUES (5, 'x')`)
	syncAll(t, a, b)
	cur := 5
	for _, name := range []string{"rowid", "oid", "_rowid_"} {
		a.exec(`UPDATE t SET `+name+` = ? WHERE id = ?`, cur+2, cur)
		syncAll(t, a, b)
		if got, want := b.rows(`SELECT id, v FROM t ORDER BY id`), fmt.Sprintf("%d | x\n", cur+2); got != want || a.rows(`SELECT id, v FROM t ORDER BY id`) != want {
			t.Fatalf("dev-a moved row %d to %d with SET %s: dev-a has %q, dev-b %q, want %q", cur, cur+2, name, a.rows(`SELECT id, v FROM t ORDER BY id`), got, want)
		}
		cur += 2
	}
}
