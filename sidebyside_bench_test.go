package drivesync

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// The side-by-side comparison: one user's database of about 100 MB on
// two devices. Device A changes n records (their title); at the same
// time device B changes another field (the mood) of the first of them.
// Each design then sends A's change, and B's; the question is what it
// costs, and whether both edits survive.
//
//   - drivesync: a Sync on each device (A, B, A again).
//   - the database file: the .db file copied to the shared folder after
//     each device's change, as a Dropbox folder holding it does; B's copy
//     replaces A's.
//   - a file per record: each changed record written to a file of its
//     own, as RxDB's Google Drive plugin and Joplin's file targets do; B's
//     file of the first record replaces A's.
//
// Bytes and time are measured over a folder (the sends of A's change:
// A's sync, its copy, its files), requests over the fake Drive server
// (the same sends through DriveRemote).
func BenchmarkSideBySide(b *testing.B) {
	const records = 10_000 // of about 2.5 KB each, twice (the app's row and the synced state): a database of about 100 MB
	dir := b.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "shared"), 0o755); err != nil {
		b.Fatal(err)
	}
	folder, err := NewFolderRemote(filepath.Join(dir, "shared"))
	if err != nil {
		b.Fatal(err)
	}
	counted := &byteCounter{Remote: folder}
	a := sideDevice(b, filepath.Join(dir, "a.db"), counted)
	fill(b, a.db, records)
	mustSync(b, a.eng)
	bdev := sideDevice(b, filepath.Join(dir, "b.db"), counted)
	mustSync(b, bdev.eng)
	size := fileSize(b, a.path)
	b.Logf("database of %d records: %.1f MB", records, float64(size)/1e6)

	for _, n := range []int{1, 100, 10_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for round := 0; b.Loop(); round++ {
				tag := fmt.Sprintf("%d-%d", n, round)
				// drivesync.
				editTitles(b, a.db, n, "a "+tag)
				editMood(b, bdev.db, "b "+tag)
				counted.bytes.Store(0)
				start := time.Now()
				mustSync(b, a.eng)
				sendTime := time.Since(start)
				sent := counted.bytes.Load()
				mustSync(b, bdev.eng)
				mustSync(b, a.eng)
				survived := bothEdits(b, a.db, "a "+tag, "b "+tag) && bothEdits(b, bdev.db, "a "+tag, "b "+tag)
				b.ReportMetric(float64(sent), "drivesync-bytes")
				b.ReportMetric(float64(sendTime.Microseconds())/1000, "drivesync-ms")
				b.ReportMetric(boolMetric(survived), "drivesync-both-edits")

				// The database file, copied whole: new edits, made on
				// both devices at the same time again.
				tag = "file " + tag
				editTitles(b, a.db, n, "a "+tag)
				editMood(b, bdev.db, "b "+tag)
				shared := filepath.Join(dir, "shared-db", "notes.db")
				os.MkdirAll(filepath.Dir(shared), 0o755)
				start = time.Now()
				copied := copyDB(b, a.db, a.path, shared)
				b.ReportMetric(float64(copied), "dbfile-bytes")
				b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "dbfile-ms")
				copyDB(b, bdev.db, bdev.path, shared) // B's copy replaces A's
				b.ReportMetric(boolMetric(sharedHas(b, shared, "a "+tag) && sharedHas(b, shared, "b "+tag)), "dbfile-both-edits")

				// A file per changed record, likewise.
				tag = "record " + tag
				editTitles(b, a.db, n, "a "+tag)
				editMood(b, bdev.db, "b "+tag)
				perRecord := filepath.Join(dir, "per-record")
				os.MkdirAll(perRecord, 0o755)
				start = time.Now()
				written := writeRecordFiles(b, a.db, perRecord, n)
				b.ReportMetric(float64(written), "per-record-bytes")
				b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "per-record-ms")
				writeRecordFiles(b, bdev.db, perRecord, 1) // B's file of record 0 replaces A's
				body, _ := os.ReadFile(filepath.Join(perRecord, "r00000.json"))
				b.ReportMetric(boolMetric(bytes.Contains(body, []byte(`"a `+tag)) && bytes.Contains(body, []byte(`"b `+tag))), "per-record-both-edits")

				// drivesync merges the edits the other designs lost: the
				// devices agree again before the next round.
				mustSync(b, a.eng)
				mustSync(b, bdev.eng)
				mustSync(b, a.eng)
			}
		})
	}
}

// BenchmarkSideBySideRequests counts the Drive requests of the sends of
// BenchmarkSideBySide's designs, on the fake Drive server. A drivesync
// sync's requests do not grow with the database (one patch file holds
// the change), so its store here holds only the records changed; the
// database file is the 100 MB the other benchmark copies. The other
// designs write to a Drive of their own, so that drivesync's listings do
// not page through their files.
func BenchmarkSideBySideRequests(b *testing.B) {
	for _, n := range []int{1, 100, 10_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			srv := drivefake.New(b)
			ctx := context.Background()
			r, err := NewDriveRemote(ctx, srv.Service(ctx, b), DriveOptions{})
			if err != nil {
				b.Fatal(err)
			}
			other := drivefake.New(b)
			or, err := NewDriveRemote(ctx, other.Service(ctx, b), DriveOptions{})
			if err != nil {
				b.Fatal(err)
			}
			a := sideDevice(b, filepath.Join(b.TempDir(), "a.db"), r)
			fill(b, a.db, n)
			mustSync(b, a.eng)
			dbFile := make([]byte, 100<<20)
			rand.Read(dbFile)
			for round := 0; b.Loop(); round++ {
				editTitles(b, a.db, n, fmt.Sprint("a ", round))
				srv.ResetRequests()
				mustSync(b, a.eng)
				b.ReportMetric(float64(srv.Requests()), "drivesync-requests")
				other.ResetRequests()
				if err := or.Create(ctx, fmt.Sprintf("db/notes-%d.db", round), bytes.NewReader(dbFile)); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(other.Requests()), "dbfile-requests")
				other.ResetRequests()
				for i := range n {
					if err := or.Create(ctx, fmt.Sprintf("records/%d/r%05d.json", round, i), bytes.NewReader([]byte(`{"title":"x"}`))); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(other.Requests()), "per-record-requests")
			}
		})
	}
}

type sideDev struct {
	path string
	db   *sql.DB
	eng  *Engine
}

func sideDevice(b testing.TB, path string, remote Remote) sideDev {
	b.Helper()
	db, err := sql.Open("sqlite", testDSN(path))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	if _, err := db.Exec(benchSchema); err != nil {
		b.Fatal(err)
	}
	eng, err := Open(context.Background(), db, Config{Remote: remote, Tables: []Table{{Name: "notes"}}, TempDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	return sideDev{path: path, db: db, eng: eng}
}

// fill inserts n records of about 2.5 KB: a title, and a body of random
// text (hex: it compresses as prose does, about half).
func fill(b testing.TB, db *sql.DB, n int) {
	b.Helper()
	tx, err := db.Begin()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1200)
	for i := range n {
		rand.Read(buf)
		content, _ := json.Marshal(map[string]string{"title": fmt.Sprint("note ", i), "body": hex.EncodeToString(buf)})
		if _, err := tx.Exec(`INSERT INTO notes (id, content) VALUES (?, jsonb(?))`, fmt.Sprintf("r%05d", i), string(content)); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

func editTitles(b testing.TB, db *sql.DB, n int, title string) {
	b.Helper()
	if _, err := db.Exec(`UPDATE notes SET content = jsonb_set(content, '$.title', ?) WHERE id < ?`, title, fmt.Sprintf("r%05d", n)); err != nil {
		b.Fatal(err)
	}
}

func editMood(b *testing.B, db *sql.DB, body string) {
	b.Helper()
	if _, err := db.Exec(`UPDATE notes SET content = jsonb_set(content, '$.mood', ?) WHERE id = 'r00000'`, body); err != nil {
		b.Fatal(err)
	}
}

// bothEdits reports whether record 0 holds A's title and B's mood.
func bothEdits(b *testing.B, db *sql.DB, title, mood string) bool {
	b.Helper()
	var t, bd string
	if err := db.QueryRow(`SELECT content->>'title', coalesce(content->>'mood', '') FROM notes WHERE id = 'r00000'`).Scan(&t, &bd); err != nil {
		b.Fatal(err)
	}
	return t == title && bd == mood
}

// copyDB copies a device's database file to dst, as a sync tool would
// after the app wrote it: checkpointed, whole.
func copyDB(b *testing.B, db *sql.DB, src, dst string) int64 {
	b.Helper()
	if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		b.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	tmp := dst + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// sharedHas reports whether the shared database file's record 0 holds s.
func sharedHas(b *testing.B, path, s string) bool {
	b.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var content string
	if err := db.QueryRow(`SELECT json(content) FROM notes WHERE id = 'r00000'`).Scan(&content); err != nil {
		b.Fatal(err)
	}
	return bytes.Contains([]byte(content), []byte(`"`+s+`"`))
}

// writeRecordFiles writes each of the first n records to a file of its
// own, and returns the bytes written.
func writeRecordFiles(b *testing.B, db *sql.DB, dir string, n int) int64 {
	b.Helper()
	rows, err := db.Query(`SELECT id, json(content) FROM notes WHERE id < ? ORDER BY id`, fmt.Sprintf("r%05d", n))
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	var total int64
	for rows.Next() {
		var id, content string
		if err := rows.Scan(&id, &content); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, id+".json"), []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
		total += int64(len(content))
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return total
}

func fileSize(b *testing.B, path string) int64 {
	b.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}

func mustSync(b testing.TB, eng *Engine) {
	b.Helper()
	if _, err := eng.Sync(context.Background()); err != nil {
		b.Fatal(err)
	}
}

func boolMetric(ok bool) float64 {
	if ok {
		return 1
	}
	return 0
}

// byteCounter counts the bytes of the files created through it.
type byteCounter struct {
	Remote
	bytes atomic.Int64
}

func (c *byteCounter) Create(ctx context.Context, name string, content io.Reader) error {
	cr := &countReader{r: content}
	err := c.Remote.Create(ctx, name, cr)
	c.bytes.Add(cr.n)
	return err
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
