package drivesync

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

const instancesSchema = `CREATE TABLE dot_instances (
	uuid TEXT PRIMARY KEY, current_gen INTEGER NOT NULL, title TEXT)`

var instancesTable = Table{Name: "dot_instances", Merge: map[string]MergeRule{"current_gen": MergeMax}}

func (d *device) gen(uuid string) string {
	d.t.Helper()
	return strings.TrimSpace(d.rows(`SELECT current_gen FROM dot_instances WHERE uuid = ?`, uuid))
}

// A generation pointer only moves forward: the largest value written
// wins, whichever device syncs last and in whatever order files arrive.
func TestMergeMaxKeepsTheLargest(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, instancesSchema, instancesTable)
	b := rowsDevice(t, "dev-b", remote, instancesSchema, instancesTable)
	a.exec(`INSERT INTO dot_instances VALUES ('A', 0, 'x')`)
	syncAll(t, a, b)
	a.exec(`UPDATE dot_instances SET current_gen = 5`)
	b.exec(`UPDATE dot_instances SET current_gen = 3, title = 'b'`)
	a.sync()
	r := b.sync() // later: under the last writer rule 3 would win
	if len(r.Overruled) != 0 {
		t.Errorf("b: Overruled %v: b's write was above what b had seen", r.Overruled)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	for _, d := range []*device{a, b} {
		if got := d.rows(`SELECT current_gen, title FROM dot_instances`); got != "5 | b\n" {
			t.Errorf("%s: %q, want the largest generation and b's title", d.name, got)
		}
	}
	// A local write below the value is not sent, and is reported.
	b.exec(`UPDATE dot_instances SET current_gen = 4`)
	r = b.sync()
	if len(r.Overruled) != 1 || !strings.Contains(r.Overruled[0].Err.Error(), "current_gen") {
		t.Fatalf("b: Overruled %v, want b's write of 4", r.Overruled)
	}
	if r.Uploaded != "" {
		t.Errorf("b uploaded %s for a write the rule does not take", r.Uploaded)
	}
	if got := b.gen("A"); got != "5" {
		t.Errorf("b: current_gen %s, want 5 written back", got)
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
}

// Any order, any repetition: three devices write generations at random
// and sync in random orders; each device's value never goes back, and at
// the end every device shows the largest value written.
func TestMergeMaxConvergesInAnyOrder(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			lag := &laggingRemote{Remote: NewMemoryRemote(), hidden: map[string][]string{}}
			var devs []*device
			for i := range 3 {
				name := fmt.Sprintf("dev-%d", i)
				devs = append(devs, rowsDevice(t, name, lag.as(name), instancesSchema, instancesTable))
			}
			devs[0].exec(`INSERT INTO dot_instances VALUES ('A', 0, NULL)`)
			syncAll(t, devs...)
			// largest is the largest value a sync read from a row: a value
			// the app replaced before syncing never left its device.
			largest, last, unsent := 0, map[string]int{}, map[string]int{}
			for range 40 {
				d := devs[rng.IntN(len(devs))]
				switch rng.IntN(3) {
				case 0:
					g := rng.IntN(50)
					d.exec(`UPDATE dot_instances SET current_gen = ?`, g)
					unsent[d.name] = g
					last[d.name] = -1 // its own write may go back: it is overruled
				case 1:
					var hide []string
					for _, o := range devs {
						if o != d && rng.IntN(2) == 0 {
							hide = append(hide, o.name)
						}
					}
					lag.hide(d.name, hide...)
				default:
					if g, ok := unsent[d.name]; ok {
						largest = max(largest, g)
						delete(unsent, d.name)
					}
					d.sync()
					var g int
					fmt.Sscan(d.gen("A"), &g)
					if g < last[d.name] {
						t.Fatalf("%s: current_gen went back from %d to %d", d.name, last[d.name], g)
					}
					last[d.name] = g
				}
			}
			for _, d := range devs {
				lag.hide(d.name)
				if g, ok := unsent[d.name]; ok {
					largest = max(largest, g)
				}
			}
			syncAll(t, devs...)
			assertConverged(t, devs...)
			if got := devs[0].gen("A"); got != fmt.Sprint(largest) {
				t.Errorf("current_gen = %s, want %d, the largest written", got, largest)
			}
		})
	}
}

func TestMergeRulesChecked(t *testing.T) {
	for _, tc := range []struct {
		table Table
		err   string
	}{
		{Table{Name: "dot_instances", Merge: map[string]MergeRule{"nope": MergeMax}}, `names column "nope"`},
		{Table{Name: "dot_instances", Merge: map[string]MergeRule{"uuid": MergeMax}}, `names column "uuid"`},
		{Table{Name: "dot_instances", Merge: map[string]MergeRule{"title": 7}}, "unknown merge rule"},
		{Table{Name: "notes", AppendOnly: true}, "AppendOnly and Merge apply to ordinary tables"},
	} {
		d := rowsDevice(t, "dev-a", NewMemoryRemote(), instancesSchema+";"+notesSchema, Table{Name: "dot_instances"})
		cfg := d.cfg
		cfg.Tables = []Table{tc.table}
		if _, err := Open(t.Context(), d.db, cfg); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: Open = %v, want %q", tc.table, err, tc.err)
		}
	}
}
