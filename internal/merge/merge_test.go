package merge

import (
	"maps"
	"slices"
	"testing"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// ClockStamps gives every stamp a record's clock holds, and no other: its
// writes' (a child's stamp its clock leaves implicit is its parent's), a
// floor and a delete; Oldest the lowest of their versions.
func TestClockStamps(t *testing.T) {
	w := func(v int64, d, patch string) Write {
		p, err := jsonv.ParseObject([]byte(patch), jsonv.Options{KeepNulls: true})
		if err != nil {
			t.Fatal(err)
		}
		return Write{At: Stamp{v, d}, Patch: p}
	}
	for _, tc := range []struct {
		name   string
		writes []Write
		want   []Stamp
	}{
		{"one write", []Write{w(3, "a", `{"x":1,"m":{"k":true}}`)}, []Stamp{{3, "a"}}},
		{"edits below", []Write{w(3, "a", `{"x":1,"m":{"k":true}}`), w(5, "b", `{"m":{"j":2}}`), w(4, "c", `{"x":null}`)},
			[]Stamp{{3, "a"}, {4, "c"}, {5, "b"}}},
		// b's value ended a's write below m, which leaves nothing.
		{"a floor", []Write{w(3, "a", `{"m":{"k":true}}`), w(6, "b", `{"m":7}`), w(8, "c", `{"m":{"j":2}}`)},
			[]Stamp{{6, "b"}, {8, "c"}}},
		{"a delete", []Write{w(3, "a", `{"x":1}`), {At: Stamp{9, "d"}, Deleted: true}},
			[]Stamp{{3, "a"}, {9, "d"}}},
	} {
		n := &Node{}
		for _, w := range tc.writes {
			n.Apply(w)
		}
		_, clock := EncodeState(n)
		got := map[Stamp]bool{}
		if err := ClockStamps([]byte(clock), func(s Stamp) { got[s] = true }); err != nil {
			t.Fatalf("%s: ClockStamps(%s): %v", tc.name, clock, err)
		}
		if keys := slices.SortedFunc(maps.Keys(got), Stamp.Compare); !slices.Equal(keys, tc.want) {
			t.Errorf("%s: ClockStamps(%s) gave %v, want %v", tc.name, clock, keys, tc.want)
		}
		if got, want := n.Oldest(), tc.want[0].Version; got != want {
			t.Errorf("%s: Oldest() = %d, want %d", tc.name, got, want)
		}
	}
	for _, clock := range []string{``, `{}`, `{"d":["a"],"n":[1,1,{}]}`, `{"d":["a"],"n":[1]}`} {
		if err := ClockStamps([]byte(clock), func(Stamp) {}); err == nil {
			t.Errorf("ClockStamps(%s) read a malformed clock", clock)
		}
	}
}
