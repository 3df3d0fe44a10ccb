package drivesync

import (
	"context"
	"testing"
)

// TestBlobIDCanonicalRow: a document row whose id the app bound as
// a BLOB ([]byte, e.g. a UUID's text kept in a byte slice) and whose
// JSONB is already the engine's encoding. The plan's byte check looks the
// row up by the row's id as stored: looked up by the record's TEXT id, it
// found no row and failed every sync.
func TestBlobIDCanonicalRow(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("plain", `{"v":1}`)
	a.exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?))`, []byte("blob-id"), `{"v":2}`)
	for i := range 2 {
		if _, err := a.eng.Sync(context.Background()); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
	}
	b.sync()
	if b.get("plain") == "" {
		t.Fatal("dev-b did not get the other record")
	}
	if got := b.get("blob-id"); got != `{"v":2}` {
		t.Fatalf("dev-b holds %q for the record with a BLOB id, want {\"v\":2}", got)
	}
	var pending int
	if err := a.db.QueryRow(`SELECT count(*) FROM ` + pendingUnion).Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("%d records still pending on dev-a (%v)", pending, err)
	}
}
