package drivesync

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/drivesync/drivesync/internal/seal"
)

// Snapshot benchmarks. The goal: bootstrapping a new device from
// a 1,000,000-record snapshot costs at most 3x plainly inserting those
// rows (x_plain <= 3), with a peak heap under 128 MB; writing that
// snapshot stays under the same memory.
//
// Both run for 10k and 1M records. The 1M cases take minutes of setup
// (device A inserts, uploads and snapshots a million records), so they
// are skipped with -short:
//
//	go test -run '^$' -bench BenchmarkSnapshot -benchtime 1x -timeout 60m .
//	go test -run '^$' -bench BenchmarkSnapshot -benchtime 1x -short .  # 10k only
//
// The remote is a FolderRemote, so that the files it holds do not count
// in the heap measured.

// snapshotBenchSizes are the record counts of the snapshot benchmarks.
func snapshotBenchSizes() []int {
	if testing.Short() {
		return []int{10_000}
	}
	return []int{10_000, 1_000_000}
}

// laterRemote is a FolderRemote whose clock runs ahead by later, so that
// a benchmark can move time forward without sleeping.
type laterRemote struct {
	*FolderRemote
	later time.Duration
}

func (r *laterRemote) Now(ctx context.Context) (time.Time, error) {
	now, err := r.FolderRemote.Now(ctx)
	return now.Add(r.later), err
}

// snapshotSource returns a remote holding n records that a device synced
// and then wrote a snapshot of, an hour later by the remote's clock, so
// that the snapshot covers the patch file: a device that bootstraps from
// it downloads the snapshot alone.
func snapshotSource(b *testing.B, n int, key ...Key) (remote Remote, snapshot string) {
	b.Helper()
	folder, err := NewFolderRemote(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	r := &laterRemote{FolderRemote: folder}
	db, eng := openBenchDB(b, r, key...)
	insertPlain(b, db, "notes", n)
	if rep, err := eng.Sync(context.Background()); err != nil || rep.ChangesSent != n {
		b.Fatalf("device A sent %d of %d changes, err %v", rep.ChangesSent, n, err)
	}
	r.later = time.Hour
	rep, err := eng.Snapshot(context.Background())
	if err != nil || rep.Snapshot == "" {
		b.Fatalf("device A wrote snapshot %q, err %v", rep.Snapshot, err)
	}
	return r, rep.Snapshot
}

// BenchmarkSnapshotBootstrap times the first Sync of a new, empty device
// from a remote holding a snapshot of n records, against plainly
// inserting n rows in one transaction into an identical table of a fresh
// database (x_plain: random ids, as an app inserts; x_key_order: the same
// number of rows in key order, as a snapshot holds them), and samples the
// peak heap during the sync.
//
// The encrypted cases do the same on an encrypted store (an X25519 key:
// a passphrase adds one scrypt per engine).
func BenchmarkSnapshotBootstrap(b *testing.B) {
	for _, n := range snapshotBenchSizes() {
		for _, key := range benchKeys() {
			b.Run(fmt.Sprint(n)+key.name, func(b *testing.B) {
				benchBootstrap(b, n, key.key...)
			})
		}
	}
}

// benchKey is a benchmark's case: a plain store (no key) or an encrypted
// one.
type benchKey struct {
	name string
	key  []Key
}

func benchKeys() []benchKey {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		panic(err)
	}
	return []benchKey{{"", nil}, {"/encrypted", []Key{X25519Key(id)}}}
}

func benchBootstrap(b *testing.B, n int, key ...Key) {
	remote, snapshot := snapshotSource(b, n, key...)
	var syncT, plainT, sortedT time.Duration
	var peak uint64
	for b.Loop() {
		b.StopTimer()
		db, eng := openBenchDB(b, remote, key...)
		plainT += insertPlain(b, openPlainDB(b), "plain", n)
		sortedT += insertSorted(b, openPlainDB(b), "plain", n)
		runtime.GC()
		b.StartTimer()
		stop := heapPeak()
		start := time.Now()
		r, err := eng.Sync(context.Background())
		syncT += time.Since(start)
		peak = max(peak, stop())
		b.StopTimer()
		if err != nil || r.ChangesReceived != n || !slices.Equal(r.Downloaded, []string{snapshot}) {
			b.Fatalf("bootstrap received %d of %d changes from %q (want only %s), err %v", r.ChangesReceived, n, r.Downloaded, snapshot, err)
		}
		var rows, titled, states int
		if err := db.QueryRow(`SELECT count(*), count(title), (SELECT count(*) FROM sync_states) FROM notes`).Scan(&rows, &titled, &states); err != nil {
			b.Fatal(err)
		}
		if rows != n || titled != n || states != n {
			b.Fatalf("after bootstrap: %d rows (%d with their title), %d states; want %d", rows, titled, states, n)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(syncT)/float64(plainT), "x_plain")
	b.ReportMetric(float64(syncT)/float64(sortedT), "x_key_order")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
	b.ReportMetric(plainT.Seconds()/float64(b.N), "plain-s/op")
}

// BenchmarkSnapshotWrite times Engine.Snapshot (a sync with nothing to
// do, writing and uploading the snapshot, compacting) on a device with n
// synced records, against plainly inserting n rows in one transaction
// into an identical table of a fresh database, and samples the peak heap
// during it.
func BenchmarkSnapshotWrite(b *testing.B) {
	for _, n := range snapshotBenchSizes() {
		for _, key := range benchKeys() {
			b.Run(fmt.Sprint(n)+key.name, func(b *testing.B) {
				benchSnapshotWrite(b, n, key.key...)
			})
		}
	}
}

func benchSnapshotWrite(b *testing.B, n int, key ...Key) {
	dir := b.TempDir()
	remote, err := NewFolderRemote(dir)
	if err != nil {
		b.Fatal(err)
	}
	db, eng := openBenchDB(b, remote, key...)
	insertPlain(b, db, "notes", n)
	if r, err := eng.Sync(context.Background()); err != nil || r.ChangesSent != n {
		b.Fatalf("sent %d of %d changes, err %v", r.ChangesSent, n, err)
	}
	var snapT, plainT time.Duration
	var peak uint64
	var size int64
	for b.Loop() {
		b.StopTimer()
		plainT += insertPlain(b, openPlainDB(b), "plain", n)
		runtime.GC()
		b.StartTimer()
		stop := heapPeak()
		start := time.Now()
		r, err := eng.Snapshot(context.Background())
		snapT += time.Since(start)
		peak = max(peak, stop())
		b.StopTimer()
		if err != nil || r.Snapshot == "" {
			b.Fatalf("wrote snapshot %q, err %v", r.Snapshot, err)
		}
		size = snapshotRecords(b, dir, r.Snapshot, n, eng)
		b.StartTimer()
	}
	b.ReportMetric(float64(snapT)/float64(plainT), "x_plain")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
	b.ReportMetric(plainT.Seconds()/float64(b.N), "plain-s/op")
	b.ReportMetric(float64(size)/(1<<20), "snapshot-MB")
}

// snapshotRecords checks that the snapshot name in the folder dir holds
// want records, and returns its size.
func snapshotRecords(b *testing.B, dir, name string, want int, eng *Engine) (size int64) {
	b.Helper()
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if eng.keys != nil {
		r = seal.Decrypt(f, name, eng.keys.read)
	}
	_, _, device, _ := parseFileName(name)
	records := 0
	_, err = decodeStateFile(r, device, Limits{}.withDefaults(), func(fileChange) error {
		records++
		return nil
	})
	if err != nil || records != want {
		b.Fatalf("snapshot %s holds %d records, want %d (err %v)", name, records, want, err)
	}
	fi, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}
