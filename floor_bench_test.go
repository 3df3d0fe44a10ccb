package drivesync

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
	"github.com/google/uuid"
)

// BenchmarkSyncFloor measures how close a sync that sends 100k new
// records comes to the least work any sync of this design must do, in
// the same run as BenchmarkSyncUpload's sync and baseline:
//
//   - read: read every pending record's content, in record order (the
//     plan must see it to diff it);
//   - states: insert a sync_states row per record, in record order, with
//     the engine's statement (the synced state the next diff starts
//     from);
//   - rewrite: rewrite each app row in canonical form, in record order,
//     with the engine's statement (every device stores the same bytes;
//     the app wrote its own key order and a null member).
//
// Each is timed on its own database, without triggers (a sync of that
// size drops them), against plainly inserting as many rows. The floor is
// their sum; x-floor is the sync's time over it. Writing and uploading
// the patch file, the merge and the stamps are left out of the floor:
// it is a lower bound, not a design.
func BenchmarkSyncFloor(b *testing.B) {
	const n = 100_000
	var syncT, plainT, readT, statesT, rewriteT time.Duration
	for b.Loop() {
		b.StopTimer()
		remote, err := NewFolderRemote(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		db, eng := openBenchDB(b, remote)
		insertPlain(b, db, "notes", n)
		plainT += insertPlain(b, db, "plain", n)
		runtime.GC()
		// The benchmark's own time is the sync's, as in benchSync: with
		// none, b.Loop would run it until the disk filled up.
		b.StartTimer()
		start := time.Now()
		r, err := eng.Sync(context.Background())
		syncT += time.Since(start)
		b.StopTimer()
		if err != nil || r.ChangesSent != n {
			b.Fatalf("sent %d of %d changes, err %v", r.ChangesSent, n, err)
		}
		read, states, rewrite := floorParts(b, n)
		readT, statesT, rewriteT = readT+read, statesT+states, rewriteT+rewrite
		b.StartTimer()
	}
	floor := readT + statesT + rewriteT
	x := func(d time.Duration) float64 { return float64(d) / float64(plainT) }
	b.ReportMetric(x(syncT), "x-insert")
	b.ReportMetric(x(floor), "floor-x-insert")
	b.ReportMetric(x(readT), "read-x-insert")
	b.ReportMetric(x(statesT), "states-x-insert")
	b.ReportMetric(x(rewriteT), "rewrite-x-insert")
	b.ReportMetric(float64(syncT)/float64(floor), "x-floor")
}

// floorParts times the three parts of BenchmarkSyncFloor's floor on a
// database of n app rows as BenchmarkSyncUpload's device holds them.
func floorParts(b *testing.B, n int) (read, states, rewrite time.Duration) {
	db := openSchemaDB(b, benchSchema+schemaSQL)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	insertRows(b, db, "notes", n, func(i int) string { return ids[i] })
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return strings.Compare(ids[x], ids[y]) })
	canonical := make([]string, n)
	for i := range canonical {
		v, err := jsonv.ParseObject([]byte(benchContent(i)), jsonv.Options{})
		if err != nil {
			b.Fatal(err)
		}
		canonical[i] = string(jsonv.Encode(v))
	}
	if _, err := db.Exec(`PRAGMA cache_size = ` + fmt.Sprint(-syncCacheKiB)); err != nil {
		b.Fatal(err)
	}
	runtime.GC()

	start := time.Now()
	rows, err := db.Query(`SELECT id, json(content) FROM notes ORDER BY id`)
	if err != nil {
		b.Fatal(err)
	}
	got := 0
	for rows.Next() {
		var id, content string
		if err := rows.Scan(&id, &content); err != nil {
			b.Fatal(err)
		}
		got++
	}
	rows.Close()
	if got != n {
		b.Fatalf("read %d rows of %d", got, n)
	}
	read = time.Since(start)

	device := uuid.NewString()
	states = insertEach(b, db, `INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (table_name, record_id) DO NOTHING`, n, func(k int) []any {
		i := order[k]
		at := merge.Stamp{Version: int64(k + 1), Device: device}
		return []any{"notes", ids[i], canonical[i], merge.FreshClock(at), at.Version, device, false}
	})

	t := &tableInfo{name: "notes", jsonb: true, columns: []string{"title"}}
	t.buildSQL()
	rewrite = insertEach(b, db, t.updateSQL, n, func(k int) []any {
		i := order[k]
		return []any{ids[i], canonical[i]}
	})
	var same int
	if err := db.QueryRow(`SELECT count(*) FROM notes n JOIN sync_states s ON s.record_id = n.id WHERE json(n.content) = s.record_data AND n.title IS s.record_data ->> '$.title'`).Scan(&same); err != nil || same != n {
		b.Fatalf("%d of %d rows rewritten to their state, err %v", same, n, err)
	}
	return read, states, rewrite
}
