package drivesync

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// Joining a store whose record limit is below some of this database's
// values (its old store allowed more).

// joinSetup: a (home store, default limits) bumps its versions, then x
// creates a store with a 2 KiB record limit; a's records are set by
// homeOps, x's by otherOps; a joins x and syncs twice.
func joinSetup(t *testing.T, remote func(Remote) Remote, homeOps func(a *device), otherOps func(x *device)) (a, x *device) {
	t.Helper()
	home, other := NewMemoryRemote(), NewMemoryRemote()
	other.SetClock(func() time.Time { return time.Now().Add(time.Hour) })
	a = newDevice(t, "dev-a", home)
	for i := range 4 { // a's stamps end above x's
		a.put("bump", `{"i":`+string(rune('0'+i))+`}`)
		a.sync()
	}
	homeOps(a)
	x = storeDevice(t, "dev-x", other, Limits{MaxRecordSize: 2 << 10})
	otherOps(x)
	x.sync()
	a.cfg.Remote = other
	if remote != nil {
		a.cfg.Remote = remote(other)
	}
	a.open()
	a.eng.Sync(context.Background())
	if err := a.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a, x
}

var large = strings.Repeat("L", 4<<10)

// No merge file can carry a single value over the store's limit. The join
// goes through with everything else, the value stays in the app's row,
// reported each sync, later syncs and snapshots do not fail for it, and
// once it fits it syncs. (Before, every sync after the join failed.)
func TestJoinStoreWithSmallerRecordLimit(t *testing.T) {
	a, x := joinSetup(t, nil, func(a *device) {
		a.put("big", `{"v":"`+large+`"}`)
		a.put("small", `{"v":"a"}`)
		a.sync()
	}, func(x *device) { x.put("theirs", `{"v":"x"}`) })
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
	for _, c := range []struct {
		d        *device
		id, want string
	}{{x, "big", "{}"}, {x, "small", `{"v":"a"}`}, {a, "theirs", `{"v":"x"}`}, {a, "big", `{"v":"` + large + `"}`}} {
		if got := c.d.get(c.id); got != c.want {
			t.Errorf("%s: %s = %.40q, want %.40q", c.d.name, c.id, got, c.want)
		}
	}
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
	a, x := joinSetup(t, nil, func(a *device) {
		a.put("both", `{"big":"`+large+`"}`)
		a.sync()
	}, func(x *device) { x.put("both", `{"title":"x1"}`) })
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

// A value too large for the joined store still ends x's older value of
// its field, as a's newer write did: it goes out as a removal with that
// write's stamp. (Pruned with no stamp, x kept its old value for good.)
func TestJoinUnfitPrunedFieldStaleOnStore(t *testing.T) {
	a, x := joinSetup(t, nil, func(a *device) {
		a.put("r", `{"big":"`+large+`","t":"a"}`)
		a.sync()
	}, func(x *device) { x.put("r", `{"big":"small-x","t":"x"}`) })
	a.sync()
	a.sync()
	x.sync()
	a.put("r", `{"t":"a"}`) // the app drops the field too large to sync
	syncAll(t, a, x)
	for _, d := range []*device{a, x} {
		if got := d.get("r"); got != `{"t":"a"}` {
			t.Errorf("%s: r = %s, want {\"t\":\"a\"}", d.name, got)
		}
	}
	assertConverged(t, a, x)
}

// A deleted record whose only hidden field is too large keeps its
// tombstone: a's delete reaches the store. (Dropped whole, it never did.)
func TestJoinUnfitTombstoneDropped(t *testing.T) {
	a, x := joinSetup(t, nil, func(a *device) {
		a.put("r", `{"big":"`+large+`"}`)
		a.sync()
		a.exec(`DELETE FROM notes WHERE id = 'r'`)
		a.sync()
	}, func(x *device) { x.put("r", `{"big":"small-x"}`) })
	syncAll(t, a, x)
	for _, d := range []*device{a, x} {
		if got := d.get("r"); got != "" {
			t.Errorf("%s: r = %s, want none: a deleted it after x's write", d.name, got)
		}
	}
	assertConverged(t, a, x)
}

// A record re-created on a (a replacing write, whose floor ends x's older
// fields) keeps its floor when its only field is too large: x's field,
// which a's re-creation replaced, goes on x too.
func TestJoinUnfitFloorDropped(t *testing.T) {
	a, x := joinSetup(t, nil, func(a *device) {
		a.put("r", `{"old":1}`)
		a.sync()
		a.exec(`DELETE FROM notes WHERE id = 'r'`)
		a.sync()
		a.put("r", `{"big":"`+large+`"}`)
		a.sync()
	}, func(x *device) { x.put("r", `{"t":"x"}`) })
	a.sync()
	a.sync()
	x.sync()
	if got := a.get("r"); got != `{"big":"`+large+`"}` {
		t.Fatalf("setup: a: r = %.60s", got)
	}
	a.put("r", `{"big":"small"}`)
	syncAll(t, a, x)
	for _, d := range []*device{a, x} {
		if got := d.get("r"); got != `{"big":"small"}` {
			t.Errorf("%s: r = %s, want {\"big\":\"small\"}: a's re-creation replaced x's record", d.name, got)
		}
	}
	assertConverged(t, a, x)
}

// A key too long for any part goes with its object; the record's other
// fields, x's among them, stay, and x's later edit of its field is not
// reverted when a drops the key.
func TestJoinUnfitHugeKeyRevertsStoreEdit(t *testing.T) {
	key := strings.Repeat("k", 3<<10)
	a, x := joinSetup(t, nil, func(a *device) {
		a.put("r", `{"`+key+`":{"a":1}}`)
		a.sync()
	}, func(x *device) { x.put("r", `{"title":"x1"}`) })
	a.sync()
	a.sync()
	x.exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'x2') WHERE id = 'r'`)
	x.sync()
	a.sync()
	a.exec(`UPDATE notes SET content = jsonb_remove(content, '$.` + key + `') WHERE id = 'r'`)
	syncAll(t, a, x)
	for _, d := range []*device{a, x} {
		if got := d.get("r"); got != `{"title":"x2"}` {
			t.Errorf("%s: r = %s, want x's later title", d.name, got)
		}
	}
	assertConverged(t, a, x)
}

// A record already pending at join time with an over-limit edit is
// reported once in the join sync's Report.Skipped.
func TestJoinUnfitSkippedOnce(t *testing.T) {
	a, _ := joinSetup(t, nil, func(a *device) {
		a.put("r", `{"big":"`+large+`"}`)
		a.sync()
		a.put("r", `{"big":"`+large+`2"}`)
	}, func(x *device) {})
	r := a.sync()
	if len(r.Skipped) != 1 {
		t.Errorf("join sync: skipped %d times: %v", len(r.Skipped), r.Skipped)
	}
}

type failMergeRemote struct {
	Remote
	fail bool
}

func (f *failMergeRemote) Create(ctx context.Context, name string, r io.Reader) error {
	if f.fail && strings.Contains(name, "/merge_") {
		return errInjected
	}
	return f.Remote.Create(ctx, name, r)
}

// The merge file's upload fails after pruneUnfit committed; the next
// sync retries. Everyone converges once a shrinks the value.
func TestJoinUnfitMergeUploadFails(t *testing.T) {
	var fr *failMergeRemote
	a, x := joinSetup(t, func(r Remote) Remote { fr = &failMergeRemote{Remote: r, fail: true}; return fr }, func(a *device) {
		a.put("r", `{"big":"`+large+`","t":"a"}`)
		a.put("s", `{"v":"a"}`)
		a.sync()
	}, func(x *device) { x.put("r", `{"t":"x","u":"x"}`) })
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("setup: the merge upload did not fail")
	}
	fr.fail = false
	a.sync()
	a.sync()
	x.sync()
	a.put("r", `{"big":"fits","t":"a","u":"x"}`)
	syncAll(t, a, x)
	for _, d := range []*device{a, x} {
		if got := d.get("r"); got != `{"big":"fits","t":"a","u":"x"}` {
			t.Errorf("%s: r = %s", d.name, got)
		}
		if got := d.get("s"); got != `{"v":"a"}` {
			t.Errorf("%s: s = %s", d.name, got)
		}
	}
	assertConverged(t, a, x)
}
