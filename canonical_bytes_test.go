package drivesync

import (
	"testing"
)

// TestJSONBRowRewrittenToCanonicalBytes: a JSONB row whose text is
// already canonical but whose bytes are not the engine's encoding of it
// (jsonb_set, shrinking a value, keeps the object's larger header)
// is rewritten by the sync that sends it, so that both devices end with
// the same bytes; a row already in the engine's bytes is left alone.
func TestJSONBRowRewrittenToCanonicalBytes(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.exec(`INSERT INTO notes (id, content, title) VALUES ('other', jsonb_set(jsonb('{"title":"x","z":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}'), '$.z', 'b'), 'x')`)
	a.exec(`INSERT INTO notes (id, content, title) VALUES ('engine', jsonb('{"title":"y"}'), 'y')`)
	raw := func(d *device, id string) (hex string, same bool) {
		t.Helper()
		if err := d.db.QueryRow(`SELECT hex(content), content = jsonb(json(content)) FROM notes WHERE id = ?`, id).Scan(&hex, &same); err != nil {
			t.Fatal(err)
		}
		return hex, same
	}
	before, same := raw(a, "other")
	if same {
		t.Fatalf("jsonb_set wrote the engine's bytes (%s): the test needs a row that differs", before)
	}
	var text string
	if err := a.db.QueryRow(`SELECT json(content) FROM notes WHERE id = 'other'`).Scan(&text); err != nil || text != `{"title":"x","z":"b"}` {
		t.Fatalf("text %s, %v: the row's text must be canonical", text, err)
	}
	a.sync()
	b.sync()
	for _, id := range []string{"other", "engine"} {
		ha, sa := raw(a, id)
		hb, _ := raw(b, id)
		if !sa || ha != hb {
			t.Errorf("%s: dev-a holds %s (the engine's bytes: %v), dev-b %s", id, ha, sa, hb)
		}
	}
	if after, _ := raw(a, "other"); after == before {
		t.Errorf("the row kept its bytes %s", before)
	}
}
