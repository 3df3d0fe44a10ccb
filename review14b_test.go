package drivesync

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// TestReview14bTamperedFileStopsRotatedDevice: the README's key change,
// to the end: a device changes the key, a snapshot re-encrypts
// everything, compaction removes the old files, both devices drop the
// old key ("then drop PreviousKeys"). From then on none of their keys is
// the marker's (keyring.first is false), and foreignKey (encryption.go)
// answers ErrWrongKey for every file no key opens. A file whose header's
// recipient stanza is altered by one byte, which TestTamperedFile shows
// rejected whole while the sync goes on, now stops every Sync of these
// devices with ErrWrongKey, for as long as the file stays on the remote.
func TestReview14bTamperedFileStopsRotatedDevice(t *testing.T) {
	mem, clk := clockedRemote()
	oldKey, newKey := Passphrase("old"), Passphrase("new")
	a := secretDevice(t, "dev-a", mem, oldKey)
	b := secretDevice(t, "dev-b", mem, oldKey)
	withRetention(a, time.Minute)
	a.put("n1", `{"v":"before"}`)
	syncAll(t, a, b)
	a.rekey(newKey, oldKey)
	withRetention(a, time.Minute)
	a.put("n2", `{"v":"after"}`)
	a.sync()
	b.rekey(newKey, oldKey)
	syncAll(t, b, a)
	clk.add(40 * time.Minute)
	a.snapshot()
	b.sync()
	clk.add(time.Hour)
	if r := a.snapshot(); r.Deleted == 0 {
		t.Fatalf("nothing compacted: %+v", r)
	}
	// The old files are gone: drop the old key, as the README says.
	a.rekey(newKey)
	b.rekey(newKey)
	syncAll(t, a, b)

	// a writes a note; its file's header is altered by one byte.
	clk.add(time.Minute)
	a.put("n3", `{"v":"later"}`)
	name := a.sync().Uploaded
	orig := remoteBytes(t, mem)[name]
	bad := bytes.Clone(orig)
	bad[40] ^= 1
	mem.Delete(context.Background(), name)
	if err := mem.Create(context.Background(), name, bytes.NewReader(bad)); err != nil {
		t.Fatal(err)
	}
	b.put("n4", `{"v":"b's"}`)
	for i := range 3 {
		clk.add(time.Minute)
		if _, err := b.eng.Sync(context.Background()); err != nil {
			t.Fatalf("b's sync %d with one tampered file on the remote (rejected whole before the first-key rule): %v", i, err)
		}
	}
}
