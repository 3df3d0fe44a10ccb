package drivesync

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A device joins a store whose record limit is smaller than its own
// store's, holding a record with a single value over that limit: no
// merge file can carry it. The join must still go through with every
// other record, the record too large reported and kept locally, and
// later syncs must not fail for it.
func TestJoinStoreWithSmallerRecordLimit(t *testing.T) {
	home, other := NewMemoryRemote(), NewMemoryRemote()
	other.SetClock(func() time.Time { return time.Now().Add(time.Hour) })
	a := newDevice(t, "dev-a", home)
	big := strings.Repeat("x", 4<<10)
	a.put("big", `{"v":"`+big+`"}`)
	a.put("small", `{"v":"a"}`)
	a.sync()
	x := storeDevice(t, "dev-x", other, Limits{MaxRecordSize: 2 << 10})
	x.put("theirs", `{"v":"x"}`)
	x.sync()

	a.cfg.Remote = other
	a.open()
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("setup: no ErrRemoteChanged")
	}
	if err := a.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, err := a.eng.Sync(context.Background())
		if err != nil {
			t.Fatalf("sync %d after the join: %v", i+1, err)
		}
		if len(r.Skipped) != 1 || r.Skipped[0].Record != "big" || !strings.Contains(r.Skipped[0].Err.Error(), "MaxRecordSize") {
			t.Errorf("sync %d: skipped %v, want big reported as over the store's record limit", i+1, r.Skipped)
		}
	}
	if _, err := a.eng.Snapshot(context.Background()); err != nil {
		t.Errorf("a snapshot after the join: %v", err)
	}
	x.sync()
	if got := x.get("big"); got != "{}" {
		t.Errorf("x: big = %q, want the record without its value", got)
	}
	if got := x.get("small"); got != `{"v":"a"}` {
		t.Errorf("x: small = %q, want a's record", got)
	}
	if got := a.get("theirs"); got != `{"v":"x"}` {
		t.Errorf("a: theirs = %q, want x's record", got)
	}
	if got := a.get("big"); got != `{"v":"`+big+`"}` {
		t.Errorf("a: big was lost locally")
	}
	// Made to fit, it syncs.
	a.put("big", `{"v":"fits now"}`)
	a.sync()
	x.sync()
	if got := x.get("big"); got != `{"v":"fits now"}` {
		t.Errorf("x: big = %q once it fits", got)
	}
	assertConverged(t, a, x)
}

// The record too large for the joined store also exists there: its
// fields from the store must not be sent back with their old values once
// the record fits, over an edit the store made to them meanwhile.
func TestJoinUnfitRecordKeepsStoreEdits(t *testing.T) {
	home, other := NewMemoryRemote(), NewMemoryRemote()
	other.SetClock(func() time.Time { return time.Now().Add(time.Hour) })
	a := newDevice(t, "dev-a", home)
	a.put("both", `{"big":"`+strings.Repeat("x", 4<<10)+`"}`)
	a.sync()
	x := storeDevice(t, "dev-x", other, Limits{MaxRecordSize: 2 << 10})
	x.put("both", `{"title":"x1"}`)
	x.sync()

	a.cfg.Remote = other
	a.open()
	a.eng.Sync(context.Background())
	if err := a.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.sync()
	a.sync()
	x.exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'x2') WHERE id = 'both'`)
	x.sync()
	a.sync()
	a.exec(`UPDATE notes SET content = jsonb_set(content, '$.big', 'small') WHERE id = 'both'`)
	a.sync()
	x.sync()
	for _, d := range []*device{a, x} {
		if got := d.get("both"); got != `{"big":"small","title":"x2"}` {
			t.Errorf("%s: both = %s, want x's later title and a's field", d.name, got)
		}
	}
	assertConverged(t, a, x)
}
