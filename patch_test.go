package drivesync

import (
	"fmt"
	"slices"
	"testing"

	"github.com/drivesync/drivesync/internal/merge"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"pgregory.net/rapid"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// tb is the part of testing.TB that rapid.T also has.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustObject(t tb, s string, keepNulls bool) jsonv.Value {
	t.Helper()
	v, err := jsonv.ParseObject([]byte(s), jsonv.Options{KeepNulls: keepNulls})
	if err != nil {
		t.Fatalf("parse %s: %v", s, err)
	}
	return v
}

// change is one stamped merge patch or delete, as a file carries it.
type change struct {
	patch   string // merge patch; ignored when deleted
	deleted bool
	at      merge.Stamp
	// reset, for a replacing write: every write up to it is gone before
	// the patch applies (zero: an ordinary write).
	reset merge.Stamp
}

func applyAll(t tb, changes []change) *merge.Node {
	t.Helper()
	n := &merge.Node{}
	for _, c := range changes {
		c.applyTo(t, n)
	}
	return n
}

func (c change) applyTo(t tb, n *merge.Node) {
	switch {
	case c.deleted:
		n.ApplyDelete(c.at)
	default:
		if c.reset.Version > 0 {
			n.Reset(merge.AbsentNode, nil, c.reset)
		}
		n.ApplyPatch(mustObject(t, c.patch, true), c.at)
	}
}

// stateBytes is what sync_states would store for the record: its content
// (shown, or hidden under a tombstone), whether it is deleted, its clock.
func stateBytes(n *merge.Node) string {
	data, clock := merge.EncodeState(n)
	return fmt.Sprintf("%s deleted=%v %s", data, !n.Exists(), clock)
}

// oracle is the model every device must reach: the patches applied in
// stamp order with the reference RFC 7396 implementation, ignoring the
// deletes, give the record's content, where a replacing write's reset
// empties the record at the reset's stamp (after any write of that same
// stamp); the record is shown exactly when its newest change is a patch,
// not a delete.
func oracle(t tb, changes []change) (content string, deleted bool) {
	t.Helper()
	type event struct {
		change
		reset bool // the reset of a replacing write, at c.reset
	}
	var events []event
	for _, c := range changes {
		events = append(events, event{change: c})
		if c.reset.Version > 0 {
			events = append(events, event{change: c, reset: true})
		}
	}
	at := func(e event) merge.Stamp {
		if e.reset {
			return e.change.reset
		}
		return e.at
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := at(a).Compare(at(b)); c != 0 {
			return c
		}
		switch {
		case a.reset == b.reset:
			return 0
		case a.reset:
			return 1
		}
		return -1
	})
	events = slices.CompactFunc(events, func(a, b event) bool { return at(a) == at(b) && a.reset == b.reset })
	doc := []byte(`{}`)
	deleted = true
	for _, c := range events {
		if c.reset {
			doc = []byte(`{}`)
			continue
		}
		deleted = c.deleted
		if c.deleted {
			continue
		}
		out, err := jsonpatch.MergePatch(doc, []byte(c.patch))
		if err != nil {
			t.Fatalf("MergePatch(%s, %s): %v", doc, c.patch, err)
		}
		doc = out
	}
	return string(jsonv.Encode(mustObject(t, string(doc), false))), deleted
}

func TestSeedTitleDesc(t *testing.T) {
	// Device 1 changes title, Device 2 changes desc and syncs
	// first. Both edits must survive on every device.
	base := change{patch: `{"title":"A","desc":"A"}`, at: merge.Stamp{Version: 1, Device: "dev0"}}
	d2 := change{patch: `{"desc":"B"}`, at: merge.Stamp{Version: 2, Device: "dev2"}}
	d1 := change{patch: `{"title":"B"}`, at: merge.Stamp{Version: 3, Device: "dev1"}}
	want := `{"desc":"B","title":"B"}`
	for _, order := range [][]change{{base, d2, d1}, {base, d1, d2}, {d1, d2, base}} {
		n := applyAll(t, order)
		if got := string(jsonv.Encode(n.Value())); got != want {
			t.Errorf("order %v: got %s, want %s", order, got, want)
		}
	}
}

func TestDesignDivergence(t *testing.T) {
	// Per-record versions diverge: A and C both saw version 5. A writes x at 7, C writes y at
	// 6, neither saw the other. Every arrival order must agree.
	v5 := change{patch: `{"x":0,"y":0}`, at: merge.Stamp{Version: 5, Device: "b"}}
	a := change{patch: `{"x":1}`, at: merge.Stamp{Version: 7, Device: "a"}}
	c := change{patch: `{"y":1}`, at: merge.Stamp{Version: 6, Device: "c"}}
	want := applyAll(t, []change{v5, a, c})
	for _, order := range [][]change{{v5, c, a}, {a, v5, c}, {c, a, v5}, {a, c, v5, a, c}} {
		if got := applyAll(t, order); stateBytes(got) != stateBytes(want) {
			t.Errorf("got %s, want %s", stateBytes(got), stateBytes(want))
		}
	}
	if got := string(jsonv.Encode(want.Value())); got != `{"x":1,"y":1}` {
		t.Errorf("got %s, want both edits", got)
	}
}

func TestTieBrokenByDevice(t *testing.T) {
	a := change{patch: `{"x":"a"}`, at: merge.Stamp{Version: 7, Device: "aaaa"}}
	b := change{patch: `{"x":"b"}`, at: merge.Stamp{Version: 7, Device: "bbbb"}}
	for _, order := range [][]change{{a, b}, {b, a}} {
		if got := string(jsonv.Encode(applyAll(t, order).Value())); got != `{"x":"b"}` {
			t.Errorf("got %s, want the larger device id to win", got)
		}
	}
}

// A physical delete hides a record without dropping its fields: an edit
// stamped after it, by a device that had not seen it, brings the whole
// record back with the edit on top; an edit stamped before it stays
// hidden. Before, the record came back holding only the newer edit, which
// a table with NOT NULL projections could never store.
func TestDeleteAgainstConcurrentEdit(t *testing.T) {
	create := change{patch: `{"a":1,"b":1}`, at: merge.Stamp{Version: 1, Device: "d1"}}
	del := change{deleted: true, at: merge.Stamp{Version: 3, Device: "d1"}}
	older := change{patch: `{"a":2}`, at: merge.Stamp{Version: 2, Device: "d2"}}
	newer := change{patch: `{"b":2}`, at: merge.Stamp{Version: 4, Device: "d2"}}
	want := applyAll(t, []change{create, older, del, newer})
	if s := string(jsonv.Encode(want.Value())); !want.Exists() || s != `{"a":2,"b":2}` {
		t.Fatalf("got %s (exists %v), want the whole record back with the newer edit on top", s, want.Exists())
	}
	for _, order := range [][]change{{create, del, older, newer}, {newer, older, del, create}, {older, newer, create, del}, {del, newer, create, older}} {
		if got := applyAll(t, order); stateBytes(got) != stateBytes(want) {
			t.Errorf("order-dependent: got %s, want %s", stateBytes(got), stateBytes(want))
		}
	}
	hidden := applyAll(t, []change{create, older, del})
	if hidden.Exists() {
		t.Errorf("record exists after a newer delete: %s", stateBytes(hidden))
	}
	if s := string(jsonv.Encode(hidden.Value())); s != `{"a":2,"b":1}` {
		t.Errorf("hidden fields %s, want the record as it was when deleted", s)
	}
	// A device that saw the delete re-creates the record by diffing the
	// new row against the hidden fields: exactly the new row comes back.
	reinsert := change{patch: string(jsonv.Encode(merge.Diff(hidden.Value(), mustObject(t, `{"c":3}`, false)))), at: merge.Stamp{Version: 5, Device: "d1"}}
	got := applyAll(t, []change{reinsert, del, create, older})
	if s := string(jsonv.Encode(got.Value())); !got.Exists() || s != `{"c":3}` {
		t.Errorf("re-insert after delete: got %s (exists %v), want exactly the new row", s, got.Exists())
	}
}

func TestDiffApply(t *testing.T) {
	tests := []struct{ old, new, patch string }{
		{`{"a":1}`, `{"a":1}`, `{}`},
		{`{"a":1}`, `{"a":2}`, `{"a":2}`},
		{`{"a":1,"b":2}`, `{"a":1}`, `{"b":null}`},
		{`{"a":{"x":1,"y":2}}`, `{"a":{"x":1,"y":3}}`, `{"a":{"y":3}}`},
		{`{"a":{"x":1}}`, `{"a":5}`, `{"a":5}`},
		{`{"a":5}`, `{"a":{"x":1}}`, `{"a":{"x":1}}`},
		{`{"a":5}`, `{"a":{}}`, `{"a":{}}`},
		{`{}`, `{"n":12345678901234567890123}`, `{"n":12345678901234567890123}`},
		{`{"n":9007199254740993}`, `{"n":9007199254740992}`, `{"n":9007199254740992}`},
		{`{"t":{"u1":{"n":"x"}}}`, `{"t":{"u1":{"n":"x"},"u2":{"n":"y"}}}`, `{"t":{"u2":{"n":"y"}}}`},
	}
	for _, tt := range tests {
		old, new := mustObject(t, tt.old, false), mustObject(t, tt.new, false)
		p := merge.Diff(old, new)
		if got := string(jsonv.Encode(p)); got != tt.patch {
			t.Errorf("diff(%s, %s) = %s, want %s", tt.old, tt.new, got, tt.patch)
		}
		n := merge.NewRecordState(old, merge.Stamp{Version: 1, Device: "d"})
		n.ApplyPatch(p, merge.Stamp{Version: 2, Device: "d"})
		if got := string(jsonv.Encode(n.Value())); got != tt.new {
			t.Errorf("apply(%s, diff) = %s, want %s", tt.old, got, tt.new)
		}
	}
}

// genValue draws a small JSON value over a tiny key space, so that
// patches collide on paths, nest, replace objects by scalars and back.
func genValue(t *rapid.T, depth int, label string) string {
	choices := 5
	if depth >= 3 {
		choices = 3
	}
	switch rapid.IntRange(0, choices-1).Draw(t, label) {
	case 0:
		return fmt.Sprint(rapid.IntRange(-3, 3).Draw(t, label+"i"))
	case 1:
		return rapid.SampledFrom([]string{`"s"`, `"t"`, `[1,null]`, `[]`, `true`, `9007199254740993`}).Draw(t, label+"s")
	case 2:
		return `null`
	default:
		return genObject(t, depth+1, label)
	}
}

func genObject(t *rapid.T, depth int, label string) string {
	keys := rapid.SliceOfNDistinct(rapid.SampledFrom([]string{"a", "b", "c"}), 0, 3, rapid.ID[string]).Draw(t, label+"k")
	s := "{"
	for i, k := range keys {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf("%q:%s", k, genValue(t, depth, label+k))
	}
	return s + "}"
}

func genChanges(t *rapid.T) []change {
	n := rapid.IntRange(1, 8).Draw(t, "n")
	var changes []change
	used := map[merge.Stamp]bool{}
	for i := range n {
		at := merge.Stamp{Version: rapid.Int64Range(1, 6).Draw(t, "v"), Device: rapid.SampledFrom([]string{"d1", "d2", "d3"}).Draw(t, "dev")}
		if used[at] {
			continue // a stamp names one write
		}
		used[at] = true
		c := change{at: at}
		switch rapid.IntRange(0, 7).Draw(t, "kind") {
		case 0:
			c.deleted = true
		case 1:
			if at.Version > 1 { // a replacing write: any reset below it
				c.reset = merge.Stamp{Version: rapid.Int64Range(1, at.Version-1).Draw(t, "resetv"), Device: rapid.SampledFrom([]string{"d1", "d2", "d3"}).Draw(t, "resetdev")}
			}
			fallthrough
		default:
			c.patch = genObject(t, 0, fmt.Sprint("p", i))
		}
		changes = append(changes, c)
	}
	return changes
}

// TestMergeConverges is the convergence property: any arrival order of any
// set of stamped patches, with repeats, gives byte-identical state equal
// to applying them in stamp order with RFC 7396; the stored clock
// round-trips.
func TestMergeConverges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		changes := genChanges(t)
		want, wantDeleted := oracle(t, changes)
		ref := applyAll(t, changes)
		order := rapid.Permutation(changes).Draw(t, "order")
		order = append(order, rapid.SliceOfN(rapid.SampledFrom(changes), 0, 3).Draw(t, "repeats")...)
		got := applyAll(t, order)
		if stateBytes(got) != stateBytes(ref) {
			t.Fatalf("order-dependent state:\n got %s\nwant %s", stateBytes(got), stateBytes(ref))
		}
		if g, gone := string(jsonv.Encode(valueOrEmpty(got))), !got.Exists(); g != want || gone != wantDeleted {
			t.Fatalf("got %s (deleted %v), want RFC 7396 in stamp order %s (deleted %v)", g, gone, want, wantDeleted)
		}
		// Store and reload half way, then finish: same state.
		k := rapid.IntRange(0, len(order)).Draw(t, "split")
		mid := applyAll(t, order[:k])
		reloaded, err := merge.DecodeState(mid.Value(), merge.EncodeClock(mid), !mid.Exists())
		if err != nil {
			t.Fatalf("decodeState(%s): %v", stateBytes(mid), err)
		}
		if stateBytes(reloaded) != stateBytes(mid) {
			t.Fatalf("clock round trip:\n got %s\nwant %s", stateBytes(reloaded), stateBytes(mid))
		}
		for _, c := range order[k:] {
			c.applyTo(t, reloaded)
		}
		if stateBytes(reloaded) != stateBytes(ref) {
			t.Fatalf("after reload:\n got %s\nwant %s", stateBytes(reloaded), stateBytes(ref))
		}
	})
}

// TestMergePatchKeepsNumbersExact guards the rebase of writes made during
// a sync, which applies the app's edits with the reference RFC 7396
// implementation.
func TestMergePatchKeepsNumbersExact(t *testing.T) {
	out, err := jsonpatch.MergePatch([]byte(`{"n":9007199254740993,"d":0.1000000000000000055511151231257827,"x":1}`), []byte(`{"x":12345678901234567890123}`))
	if err != nil {
		t.Fatal(err)
	}
	v := mustObject(t, string(out), false)
	if got, want := string(jsonv.Encode(v)), `{"d":0.1000000000000000055511151231257827,"n":9007199254740993,"x":12345678901234567890123}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestStateMergeIsUnion is the property snapshots rely on: merging the
// state of one set of writes into the state of another gives, byte for
// byte, the state of their union, whatever the overlap, and through the
// stored form (content and clock) as sync_states and snapshots keep it.
func TestStateMergeIsUnion(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		changes := genChanges(t)
		var a, b []change
		for i, c := range changes {
			switch rapid.IntRange(0, 2).Draw(t, fmt.Sprint("side", i)) {
			case 0:
				a = append(a, c)
			case 1:
				b = append(b, c)
			default:
				a, b = append(a, c), append(b, c)
			}
		}
		want := stateBytes(applyAll(t, changes))
		sa, sb := applyAll(t, a), applyAll(t, b)
		stored, err := merge.DecodeState(valueOrEmpty(sb), merge.EncodeClock(sb), !sb.Exists())
		if err != nil {
			t.Fatalf("decodeState: %v", err)
		}
		sa.Merge(stored)
		if got := stateBytes(sa); got != want {
			t.Fatalf("merge of\n  %s\n  %s\n got %s\nwant %s", stateBytes(applyAll(t, a)), stateBytes(sb), got, want)
		}
		// And the other way round.
		sb.Merge(applyAll(t, a))
		if got := stateBytes(sb); got != want {
			t.Fatalf("reverse merge: got %s, want %s", got, want)
		}
	})
}

func valueOrEmpty(n *merge.Node) jsonv.Value {
	if !n.HasContent() {
		return jsonv.Value{Members: []jsonv.Member{}}
	}
	return n.Value()
}
