package drivesync

import (
	"testing"
)

func TestTwoDevicesBasic(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	b := newDevice(t, "dev-b", remote)
	a.put("n1", `{"title":"hello","display_order":3,"deleted_at":null}`)
	r := a.sync()
	if r.Uploaded == "" || r.ChangesSent != 1 {
		t.Fatalf("a: report %+v, want one change uploaded", r)
	}
	r = b.sync()
	if len(r.Downloaded) != 1 || r.ChangesReceived != 1 {
		t.Fatalf("b: report %+v, want one file applied", r)
	}
	if got, want := b.get("n1"), `{"display_order":3,"title":"hello"}`; got != want {
		t.Fatalf("b sees %s, want %s", got, want)
	}
	var title string
	var order int
	if err := b.db.QueryRow(`SELECT title, display_order FROM notes WHERE id = 'n1'`).Scan(&title, &order); err != nil || title != "hello" || order != 3 {
		t.Fatalf("projection columns: %q %d %v", title, order, err)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}
