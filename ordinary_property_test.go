package drivesync

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The convergence property for ordinary tables, end to end: three devices
// write typed values (TEXT, INTEGER, REAL, BLOB, NULL) under composite
// keys, delete and create rows again, and raise a MergeMax column, each
// sync a patch file. Two new devices then take the same files in
// different orders, a random part of them visible at each sync, and some
// delivered again: every device ends with the same bytes, sync_states and
// rows.

const propertySchema = `CREATE TABLE items (
	grp TEXT NOT NULL, num INTEGER NOT NULL, tag BLOB NOT NULL,
	s TEXT, n INTEGER, r REAL, b BLOB, g INTEGER,
	PRIMARY KEY (grp, num, tag)
) WITHOUT ROWID`

var propertyTable = Table{Name: "items", Merge: map[string]MergeRule{"g": MergeMax}}

// revealingRemote lists only the files a test has revealed to it.
type revealingRemote struct {
	Remote
	mu      sync.Mutex
	visible map[string]bool
}

func (r *revealingRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	files, err := r.Remote.List(ctx, since)
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.DeleteFunc(files, func(f RemoteFile) bool { return !r.visible[f.Name] }), err
}

func TestOrdinaryFilesInAnyOrder(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			mem := NewMemoryRemote()
			var writers []*device
			for i := range 3 {
				writers = append(writers, rowsDevice(t, fmt.Sprintf("dev-%d", i), mem, propertySchema, propertyTable))
			}
			keys := []string{`'a', 1, X'00'`, `'a', 1, X'01'`, `'b', -2, X''`}
			value := func(col string) string {
				switch rng.IntN(6) {
				case 0:
					return "NULL"
				case 1:
					return fmt.Sprintf("%d", rng.Int64N(1<<62)-1<<61)
				case 2: // every bit of the float matters
					f := strconv.FormatFloat(rng.NormFloat64()*math.Pow(10, float64(rng.IntN(40)-20)), 'g', -1, 64)
					if !strings.ContainsAny(f, ".e") {
						f += ".0"
					}
					return f
				case 3:
					return fmt.Sprintf("X'%02X%02X'", rng.IntN(256), rng.IntN(256))
				case 4:
					return fmt.Sprintf("'%s ✓ %d'", col, rng.IntN(1000))
				}
				return "''"
			}
			for range 60 {
				d := writers[rng.IntN(len(writers))]
				key := keys[rng.IntN(len(keys))]
				where := fmt.Sprintf("(grp, num, tag) = (%s)", key)
				switch rng.IntN(6) {
				case 0:
					d.exec(`DELETE FROM items WHERE ` + where)
				case 1:
					d.exec(fmt.Sprintf(`INSERT OR REPLACE INTO items VALUES (%s, %s, %s, %s, %s, %d)`, key, value("s"), value("n"), value("r"), value("b"), rng.IntN(100)))
				case 2:
					d.exec(fmt.Sprintf(`UPDATE items SET g = %d WHERE %s`, rng.IntN(100), where))
				case 3:
					d.sync()
				default:
					col := []string{"s", "n", "r", "b"}[rng.IntN(4)]
					d.exec(fmt.Sprintf(`INSERT INTO items (grp, num, tag, %[1]s) VALUES (%[2]s, %[3]s) ON CONFLICT DO UPDATE SET %[1]s = excluded.%[1]s`, col, key, value(col)))
				}
			}
			syncAll(t, writers...)
			assertConverged(t, writers...)
			files, err := mem.List(context.Background(), time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			if len(files) < 5 {
				t.Fatalf("%d files: too few to take in different orders", len(files))
			}
			for i := range 2 {
				r := &revealingRemote{Remote: mem, visible: map[string]bool{}}
				d := rowsDevice(t, fmt.Sprintf("new-%d", i), r, propertySchema, propertyTable)
				for len(r.visible) < len(files) {
					for range 2 {
						f := files[rng.IntN(len(files))]
						r.mu.Lock()
						r.visible[f.Name] = true
						r.mu.Unlock()
					}
					d.sync()
					if rng.IntN(3) == 0 { // a file delivered again
						d.exec(`DELETE FROM sync_files WHERE name = (SELECT name FROM sync_files ORDER BY random() LIMIT 1)`)
					}
				}
				d.sync()
				assertConverged(t, writers[0], d)
			}
		})
	}
}
