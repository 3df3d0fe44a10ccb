package drivesync

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// TestFreshWriteState: for a record with no state, the state and row the
// engine stores straight from a fresh write (see freshWrite) are exactly
// those of merging the write into an empty record, for random patches:
// nested and empty objects, arrays holding nulls, strings holding
// ":null" and patches with null members (which must take the long way).
func TestFreshWriteState(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var value func(depth int) string
	value = func(depth int) string {
		switch k := rng.IntN(9); {
		case k == 0 && depth < 3:
			var ms []string
			for i := range rng.IntN(4) {
				ms = append(ms, fmt.Sprintf("%q:%s", fmt.Sprint("k", i, rng.IntN(3)), value(depth+1)))
			}
			return "{" + strings.Join(ms, ",") + "}"
		case k == 1:
			return `[1,null,{"a":null}]`
		case k == 2:
			return `"a\":null"`
		case k == 3:
			return "null"
		case k == 4:
			return "true"
		case k == 5:
			return "-1.5e3"
		default:
			return fmt.Sprintf("%q", fmt.Sprint("v", rng.IntN(100)))
		}
	}
	fresh, long := 0, 0
	for i := range 5000 {
		var ms []string
		for j := range rng.IntN(5) {
			ms = append(ms, fmt.Sprintf("%q:%s", fmt.Sprint("f", j), value(0)))
		}
		p, err := jsonv.ParseObject([]byte("{"+strings.Join(ms, ",")+"}"), jsonv.Options{KeepNulls: true})
		if err != nil {
			t.Fatal(err)
		}
		c := fileChange{table: "notes", record: "r", version: int64(i + 1), patch: jsonv.Encode(p)}
		n := &merge.Node{}
		if err := applyChange(n, c, "dev-a"); err != nil {
			t.Fatal(err)
		}
		data, clock := merge.EncodeState(n)
		if !freshWrite(c) {
			long++
			continue
		}
		fresh++
		at := merge.Stamp{Version: c.version, Device: "dev-a"}
		if want := string(merge.EncodeClock(&merge.Node{Kind: merge.ObjectNode, Stamp: at})); merge.FreshClock(at) != want {
			t.Fatalf("FreshClock %s, EncodeClock %s", merge.FreshClock(at), want)
		}
		if string(c.patch) != data || merge.FreshClock(at) != clock || string(jsonv.Encode(n.Value())) != data || n.Newest() != at || !n.Exists() {
			t.Fatalf("patch %s: merged state %s %s (newest %v), fresh %s %s", c.patch, data, clock, n.Newest(), c.patch, merge.FreshClock(at))
		}
	}
	if fresh < 1000 || long < 1000 {
		t.Fatalf("%d fresh writes and %d the long way: the generator must make both", fresh, long)
	}
}
