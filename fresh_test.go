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

// TestFreshStateEntry: a snapshot's record whose clock is in FreshClock's
// form is validated and stored without building its tree, exactly as the
// long way (DecodeState, CheckRecordClock, EncodeState) would, errors
// included: random contents with nulls and empty objects, stamps in and
// out of range, device ids valid and not, and clocks that are almost in
// that form.
func TestFreshStateEntry(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	contents := []string{`{}`, `{"a":1}`, `{"a":null,"b":{"c":null}}`, `{"z":{},"a":[null]}`, `{"b":"x:null","a":{"b":{"c":true}}}`, `{"é":"\u00e9"}`}
	devices := []string{"dev-a", "dev-é", `de"v`, "", "dev a", strings.Repeat("d", 200)}
	versions := []int64{1, 7, merge.MaxVersion, 0, -1, merge.MaxVersion + 1}
	fast := 0
	for i := range 3000 {
		content := contents[rng.IntN(len(contents))]
		at := merge.Stamp{Version: versions[rng.IntN(len(versions))], Device: devices[rng.IntN(len(devices))]}
		clock := merge.FreshClock(at)
		switch rng.IntN(6) {
		case 0:
			clock = strings.Replace(clock, `"n":[`, `"n": [`, 1)
		case 1:
			clock = strings.Replace(clock, `,0,{}]}`, `,0,{},1,2]}`, 1)
		case 2:
			clock = strings.Replace(clock, `,0,{}]}`, `,0,{"a":[1,0]}]}`, 1)
		}
		e := stateEntry{Table: "notes", Record: fmt.Sprint("r", i), State: []byte(content), Clock: []byte(clock), Deleted: rng.IntN(8) == 0}
		got, gotErr := validateStateEntry(e, 1<<20, map[string]bool{})

		// The long way.
		var want fileChange
		p, err := jsonv.ParseObject(e.State, jsonv.Options{})
		if err != nil {
			t.Fatal(err)
		}
		n, wantErr := merge.DecodeState(p, e.Clock, e.Deleted)
		if wantErr == nil {
			wantErr = merge.CheckRecordClock(n, map[string]bool{})
		}
		if wantErr == nil {
			data, clock := merge.EncodeState(n)
			want = fileChange{table: e.Table, record: e.Record, patch: []byte(data), clock: []byte(clock),
				deleted: !n.Exists(), version: n.Newest().Version, device: n.Newest().Device, oldest: n.Oldest()}
		}
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("state %s clock %s deleted %v: error %v, the long way %v", e.State, e.Clock, e.Deleted, gotErr, wantErr)
		}
		if gotErr == nil && fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Fatalf("state %s clock %s deleted %v:\n got %+v\nwant %+v", e.State, e.Clock, e.Deleted, got, want)
		}
		if _, ok := merge.ParseFreshClock(e.Clock); ok && !e.Deleted {
			fast++
		}
	}
	if fast < 500 {
		t.Fatalf("only %d entries took the short way", fast)
	}
}
