package drivesync

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/drivesync/drivesync/internal/seal"
	"github.com/google/uuid"
)

// Speed targets are measured as ratios against a baseline taken in the
// same run, so a noisy shared machine moves both sides alike.

const benchSchema = `
CREATE TABLE notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT);
CREATE TABLE plain (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT);`

func benchContent(i int) string {
	return fmt.Sprintf(`{"title":"note %d","body":"a typical note body of a few dozen words, written by the user on one of their devices","tags":{"t1":true},"updated_at":"2026-11-22T10:00:00Z","deleted_at":null,"n":%d}`, i, i)
}

// openBenchDB opens a benchmark's device on remote, encrypting with key
// if one is given.
func openBenchDB(b *testing.B, remote Remote, key ...Key) (*sql.DB, *Engine) {
	b.Helper()
	db := openSchemaDB(b, benchSchema)
	cfg := Config{Remote: remote, Tables: []Table{{Name: "notes"}}, TempDir: b.TempDir()}
	if len(key) > 0 {
		cfg.Encryption = key[0]
	}
	return db, openBenchEngine(b, db, cfg)
}

// openSchemaDB opens a new database file of a benchmark's, with schema.
func openSchemaDB(b *testing.B, schema string) *sql.DB {
	b.Helper()
	db, err := sql.Open("sqlite", testDSN(filepath.Join(b.TempDir(), "bench.db")))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if _, err := db.Exec(schema); err != nil {
		b.Fatal(err)
	}
	return db
}

// openBenchEngine opens the engine of a benchmark's database.
func openBenchEngine(b *testing.B, db *sql.DB, cfg Config) *Engine {
	b.Helper()
	eng, err := Open(context.Background(), db, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return eng
}

// BenchmarkCapture compares write transactions on a synced table with the
// same writes on an identical table in an identical database that has no
// engine, interleaved. Separate databases matter: in one database the
// two sides would share a WAL, and whichever write happened to trigger a
// checkpoint would pay for pages both wrote.
func BenchmarkCapture(b *testing.B) {
	for _, bc := range []struct {
		name   string
		rows   int  // rows per transaction
		update bool // update existing rows instead of inserting
		fresh  bool // the updated rows were synced (not pending) before
		every  int  // clear the pending marks every so many transactions, as a sync does (0: never)
	}{
		{"insert/1", 1, false, false, 0},
		{"update/1", 1, true, false, 0},
		{"update-after-sync/1", 1, true, true, 0},
		{"insert/1000", 1000, false, false, 0},
		{"insert/1000/sync-every-10", 1000, false, false, 10},
		{"update/1000", 1000, true, false, 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			synced, _ := openBenchDB(b, NewMemoryRemote())
			plain := openPlainDB(b)
			ids := make([]string, 10000)
			for i := range ids {
				ids[i] = uuid.NewString()
				for _, db := range []*sql.DB{synced, plain} {
					if _, err := db.Exec(`INSERT INTO notes (id, content, title) VALUES (?, jsonb(?), 'x')`, ids[i], benchContent(i)); err != nil {
						b.Fatal(err)
					}
				}
			}
			before := func(i int) {
				if bc.fresh || (bc.every > 0 && i%bc.every == 0) {
					synced.Exec(`DELETE FROM sync_pending_changes; DELETE FROM sync_pending_log`)
				}
			}
			compareCapture(b, synced, plain, bc.rows, before, func(tx *sql.Tx, k int) (err error) {
				if bc.update {
					_, err = tx.Exec(`UPDATE notes SET content = jsonb(?), title = ? WHERE id = ?`, benchContent(k), "t", ids[k%len(ids)])
				} else {
					_, err = tx.Exec(`INSERT INTO notes (id, content, title) VALUES (?, jsonb(?), 'x')`, uuid.NewString(), benchContent(k))
				}
				return err
			})
		})
	}
}

// compareCapture times write transactions of rows writes (write(tx, k),
// k counting the writes) on a synced database and on a plain one,
// interleaved and alternating which goes first, and reports their ratio.
// before, if set, runs untimed before each pair.
func compareCapture(b *testing.B, synced, plain *sql.DB, rows int, before func(i int), write func(tx *sql.Tx, k int) error) {
	txn := func(db *sql.DB, iter int) time.Duration {
		start := time.Now()
		tx, err := db.Begin()
		if err != nil {
			b.Fatal(err)
		}
		for j := range rows {
			if err := write(tx, iter*rows+j); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var syncedT, plainT time.Duration
	for i := 0; b.Loop(); i++ {
		if before != nil {
			b.StopTimer()
			before(i)
			b.StartTimer()
		}
		if i%2 == 0 {
			plainT += txn(plain, i)
			syncedT += txn(synced, i)
		} else {
			syncedT += txn(synced, i)
			plainT += txn(plain, i)
		}
	}
	b.ReportMetric(float64(syncedT)/float64(plainT), "x-unsynced")
	b.ReportMetric(float64(syncedT.Nanoseconds())/float64(b.N*rows), "ns/synced-row")
}

func openPlainDB(b *testing.B) *sql.DB {
	b.Helper()
	return openSchemaDB(b, benchSchema)
}

// heapPeak samples the live heap until stop is called.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// runtime/metrics, unlike ReadMemStats, does not stop the world,
		// so sampling does not slow the sync it measures.
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// insertPlain is the baseline: plainly inserting n rows in one transaction.
func insertPlain(b *testing.B, db *sql.DB, table string, n int) time.Duration {
	return insertRows(b, db, table, n, func(int) string { return uuid.NewString() })
}

// insertSorted inserts n rows as insertPlain does, in key order.
func insertSorted(b *testing.B, db *sql.DB, table string, n int) time.Duration {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	slices.Sort(ids)
	return insertRows(b, db, table, n, func(i int) string { return ids[i] })
}

// insertRows inserts n rows with the ids id gives, in one transaction.
func insertRows(b *testing.B, db *sql.DB, table string, n int, id func(int) string) time.Duration {
	return insertEach(b, db, `INSERT INTO `+table+` (id, content, title) VALUES (?, jsonb(?), ?)`, n, func(i int) []any {
		return []any{id(i), benchContent(i), fmt.Sprint("note ", i)}
	})
}

// insertEach runs insert n times, with the arguments args gives, in one
// transaction, and returns how long it took.
func insertEach(b *testing.B, db *sql.DB, insert string, n int, args func(int) []any) time.Duration {
	start := time.Now()
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	st, err := tx.Prepare(insert)
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		if _, err := st.Exec(args(i)...); err != nil {
			b.Fatal(err)
		}
	}
	st.Close()
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkSyncUpload measures a sync that sends n pending new records,
// against plainly inserting n rows.
func BenchmarkSyncUpload(b *testing.B) {
	benchSync(b, func(b *testing.B, remote Remote, n int) *Engine {
		db, eng := openBenchDB(b, remote)
		insertPlain(b, db, "notes", n) // captured: n pending records
		return eng
	}, insertPlain, func(r Report) int { return r.ChangesSent })
}

// BenchmarkSyncApply measures a sync that receives n new records from
// another device, against plainly inserting n rows.
func BenchmarkSyncApply(b *testing.B) {
	benchSync(b, func(b *testing.B, remote Remote, n int) *Engine {
		srcDB, src := openBenchDB(b, remote)
		insertPlain(b, srcDB, "notes", n)
		if _, err := src.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		_, eng := openBenchDB(b, remote)
		return eng
	}, insertPlain, func(r Report) int { return r.ChangesReceived })
}

// BenchmarkSyncApplyEdits measures a sync that receives another device's
// edits of n records this device holds, each with its "seen" list (the
// conflict log's check runs for every one), against plainly inserting n
// rows.
func BenchmarkSyncApplyEdits(b *testing.B) {
	benchSync(b, func(b *testing.B, remote Remote, n int) *Engine {
		ctx := context.Background()
		srcDB, src := openBenchDB(b, remote)
		insertPlain(b, srcDB, "notes", n)
		_, eng := openBenchDB(b, remote)
		for _, e := range []*Engine{src, eng} {
			if _, err := e.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := srcDB.Exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'edited')`); err != nil {
			b.Fatal(err)
		}
		if _, err := src.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return eng
	}, insertPlain, func(r Report) int { return r.ChangesReceived })
}

// The ordinary table of the sync benchmarks: a composite key, typed
// columns and a 512-byte BLOB, as seed 003's dot art has them; plain_dots
// is its twin without the engine.
const benchDotsSchema = `
CREATE TABLE dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixel_data BLOB NOT NULL, title TEXT, acquired_at INTEGER NOT NULL, PRIMARY KEY (uuid, gen));
CREATE TABLE plain_dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixel_data BLOB NOT NULL, title TEXT, acquired_at INTEGER NOT NULL, PRIMARY KEY (uuid, gen));`

// openBenchDots opens a benchmark's device that syncs dots.
func openBenchDots(b *testing.B, remote Remote) (*sql.DB, *Engine) {
	b.Helper()
	db := openSchemaDB(b, benchDotsSchema)
	return db, openBenchEngine(b, db, Config{Remote: remote, Tables: []Table{{Name: "dots"}}, TempDir: b.TempDir()})
}

// insertDots plainly inserts n rows into table, of dots' shape, with
// random uuids, in one transaction.
func insertDots(b *testing.B, db *sql.DB, table string, n int) time.Duration {
	pixels := make([]byte, 512)
	return insertEach(b, db, `INSERT INTO `+table+` (uuid, gen, pixel_data, title, acquired_at) VALUES (?, ?, ?, ?, ?)`, n, func(i int) []any {
		pixels[i%len(pixels)] = byte(i)
		return []any{uuid.NewString(), i % 4, pixels, fmt.Sprint("dot ", i), 1764000000 + i}
	})
}

// BenchmarkSyncUploadOrdinary is BenchmarkSyncUpload on an ordinary
// table, against plainly inserting as many rows into its twin.
func BenchmarkSyncUploadOrdinary(b *testing.B) {
	benchSync(b, func(b *testing.B, remote Remote, n int) *Engine {
		db, eng := openBenchDots(b, remote)
		insertDots(b, db, "dots", n)
		return eng
	}, func(b *testing.B, db *sql.DB, _ string, n int) time.Duration {
		return insertDots(b, db, "plain_dots", n)
	}, func(r Report) int { return r.ChangesSent })
}

// BenchmarkSyncApplyOrdinary is BenchmarkSyncApply on an ordinary table.
func BenchmarkSyncApplyOrdinary(b *testing.B) {
	benchSync(b, func(b *testing.B, remote Remote, n int) *Engine {
		srcDB, src := openBenchDots(b, remote)
		insertDots(b, srcDB, "dots", n)
		if _, err := src.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		_, eng := openBenchDots(b, remote)
		return eng
	}, func(b *testing.B, db *sql.DB, _ string, n int) time.Duration {
		return insertDots(b, db, "plain_dots", n)
	}, func(r Report) int { return r.ChangesReceived })
}

// benchSync times, for 10k and 100k records, the sync of the engine that
// prepare returns against inserting as many rows into a plain table of
// the same database (baseline), and samples the peak heap during the
// sync.
func benchSync(b *testing.B, prepare func(b *testing.B, remote Remote, n int) *Engine, baseline func(b *testing.B, db *sql.DB, table string, n int) time.Duration, moved func(Report) int) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var syncT, plainT time.Duration
			var peak uint64
			for b.Loop() {
				b.StopTimer()
				remote, err := NewFolderRemote(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				eng := prepare(b, remote, n)
				plainT += baseline(b, eng.db, "plain", n)
				runtime.GC()
				b.StartTimer()
				stop := heapPeak()
				start := time.Now()
				r, err := eng.Sync(context.Background())
				syncT += time.Since(start)
				peak = max(peak, stop())
				if err != nil || moved(r) != n {
					b.Fatalf("moved %d of %d changes, err %v", moved(r), n, err)
				}
			}
			b.ReportMetric(float64(syncT)/float64(plainT), "x-insert")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
		})
	}
}

// BenchmarkEncryptionOverhead syncs n new records from one device to
// another through a folder, on a plain store and on an encrypted one (an
// X25519 key) in the same iteration, and reports the encrypted side's
// time over the plain side's, for the upload and for the apply, and the
// bytes each left on the remote.
func BenchmarkEncryptionOverhead(b *testing.B) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var up, apply [2]time.Duration
			var size [2]int64
			var overhead int64
			for b.Loop() {
				b.StopTimer()
				for i, key := range [][]Key{nil, {X25519Key(id)}} {
					dir := b.TempDir()
					remote, err := NewFolderRemote(dir)
					if err != nil {
						b.Fatal(err)
					}
					srcDB, src := openBenchDB(b, remote, key...)
					_, dst := openBenchDB(b, remote, key...)
					insertPlain(b, srcDB, "notes", n)
					runtime.GC()
					b.StartTimer()
					start := time.Now()
					r1, err1 := src.Sync(context.Background())
					up[i] += time.Since(start)
					start = time.Now()
					r2, err2 := dst.Sync(context.Background())
					apply[i] += time.Since(start)
					b.StopTimer()
					if err1 != nil || err2 != nil || r1.ChangesSent != n || r2.ChangesReceived != n {
						b.Fatalf("sent %d, received %d of %d: %v, %v", r1.ChangesSent, r2.ChangesReceived, n, err1, err2)
					}
					size[i] = dirSize(b, dir)
					if i == 1 {
						overhead = size[1] - plainSize(b, dir, dst)
					}
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(up[1])/float64(up[0]), "upload-x-plain")
			b.ReportMetric(float64(apply[1])/float64(apply[0]), "apply-x-plain")
			b.ReportMetric(float64(size[0]), "plain-bytes")
			b.ReportMetric(float64(size[1]), "encrypted-bytes")
			// The two stores' ids differ, and so do their gzip sizes: the
			// overhead is measured on the encrypted store's own files.
			b.ReportMetric(float64(overhead), "overhead-bytes")
		})
	}
}

// dirSize returns the bytes of the files under dir.
func dirSize(b *testing.B, dir string) (n int64) {
	b.Helper()
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		n += fi.Size()
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// plainSize returns the bytes of the files under dir, an encrypted
// store's folder, decrypted with eng's keys (the marker and key checks as
// they are).
func plainSize(b *testing.B, dir string, eng *Engine) (n int64) {
	b.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, _ := filepath.Rel(dir, p)
		name = filepath.ToSlash(name)
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		var r io.Reader = f
		if _, _, _, ok := parseFileName(name); ok {
			r = seal.Decrypt(f, name, eng.keys.read)
		}
		k, err := io.Copy(io.Discard, r)
		n += k
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}
