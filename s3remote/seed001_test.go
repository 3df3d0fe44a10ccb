package s3remote

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/miniotest"
)

// The lost-update race of a SQLite file kept whole in a bucket: writers
// that each download the file, write a row and upload the whole file back
// lose each other's rows whenever two of them overlap. drivesync's devices
// never overwrite a shared object; each uploads files of its own. Both
// run here with the same writers on the same server.

const (
	raceWriters  = 10
	raceBaseRows = 2000 // the database the writers start from (about 300 KB)
)

const raceSchema = `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT)`

// raceTitle is a row's text: about a hundred bytes, as a note's title and
// a few fields would be.
func raceTitle(id string) string { return fmt.Sprintf("%-96s", "row "+id) }

// raceResult is what one run of the writers measured.
type raceResult struct {
	acknowledged int     // writes whose writer was told they were stored
	lost         int     // acknowledged writes missing at the end (on any device)
	putBytes     int64   // bytes uploaded during the writes
	requests     int64   // requests during the writes
	syncs        int64   // syncs during the writes (drivesync)
	perWrite     float64 // putBytes per acknowledged write
}

// counting is a transport that counts requests and uploaded bytes.
type counting struct {
	requests, putBytes atomic.Int64
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	if req.Method == http.MethodPut && req.ContentLength > 0 {
		c.putBytes.Add(req.ContentLength)
	}
	return http.DefaultTransport.RoundTrip(req)
}

// raceDrivesync runs the writers as drivesync devices, each with its own
// database: a write is acknowledged once a Sync after it succeeded. After
// the writes every device syncs until none downloads anything, and every
// acknowledged write must be on every device.
func raceDrivesync(tb testing.TB, writes int) raceResult {
	ctx := context.Background()
	bucket := newBucket(tb)
	seed, seedEng := openDevice(tb, newClient(), bucket, Options{}, "seed", raceSchema)
	insertBase(tb, seed)
	if _, err := seedEng.Sync(ctx); err != nil {
		tb.Fatal(err)
	}
	c := &counting{}
	dbs := make([]*sql.DB, raceWriters)
	engs := make([]*drivesync.Engine, raceWriters)
	for i := range raceWriters {
		dbs[i], engs[i] = openDevice(tb, miniotest.ClientAt(server.Endpoint, c), bucket, Options{}, fmt.Sprintf("writer-%d", i), raceSchema)
		if _, err := engs[i].Sync(ctx); err != nil { // bootstrap
			tb.Fatal(err)
		}
	}
	c.requests.Store(0)
	c.putBytes.Store(0)
	var res raceResult
	var syncs atomic.Int64
	res.acknowledged = runWriters(tb, writes, func(i int, id string) error {
		if _, err := dbs[i].Exec(`INSERT INTO items VALUES (?, ?)`, id, raceTitle(id)); err != nil {
			return err
		}
		syncs.Add(1)
		_, err := engs[i].Sync(ctx)
		return err
	})
	res.syncs = syncs.Load()
	res.requests, res.putBytes = c.requests.Load(), c.putBytes.Load()
	// Quiescence: sync until a round downloads nothing.
	for round := 0; ; round++ {
		if round == 10 {
			tb.Fatal("the devices still download files after 10 rounds of syncs")
		}
		moved := false
		for _, e := range engs {
			r, err := e.Sync(ctx)
			if err != nil {
				tb.Fatal(err)
			}
			moved = moved || len(r.Downloaded) > 0
		}
		if !moved {
			break
		}
	}
	missing := map[string]bool{}
	for _, db := range dbs {
		for id := range missingRows(tb, db, writes) {
			missing[id] = true
		}
	}
	res.lost = len(missing)
	res.perWrite = float64(res.putBytes) / float64(res.acknowledged)
	return res
}

// raceWholeFile runs the writers as seed 001's workers did: download the
// database file, write a row into it, upload the whole file. A write is
// acknowledged once its upload succeeded.
func raceWholeFile(tb testing.TB, writes int) raceResult {
	ctx := context.Background()
	bucket := newBucket(tb)
	const key = "app.db"
	dir := tb.TempDir()
	base := filepath.Join(dir, "base.db")
	db, err := sql.Open("sqlite", "file:"+base)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := db.Exec(raceSchema); err != nil {
		tb.Fatal(err)
	}
	insertBase(tb, db)
	db.Close()
	content, err := os.ReadFile(base)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := newClient().PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String(key), Body: bytes.NewReader(content)}); err != nil {
		tb.Fatal(err)
	}
	c := &counting{}
	client := miniotest.ClientAt(server.Endpoint, c)
	acked := runWriters(tb, writes, func(_ int, id string) error {
		return wholeFileWrite(ctx, client, bucket, key, filepath.Join(dir, id+".db"), id)
	})
	res := raceResult{acknowledged: acked, requests: c.requests.Load(), putBytes: c.putBytes.Load()}
	final := filepath.Join(dir, "final.db")
	if err := download(ctx, newClient(), bucket, key, final); err != nil {
		tb.Fatal(err)
	}
	db, err = sql.Open("sqlite", "file:"+final)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	res.lost = len(missingRows(tb, db, writes))
	res.perWrite = float64(res.putBytes) / float64(res.acknowledged)
	return res
}

// runWriters runs the writers at once, each making writes writes of a row
// id of its own with write; a write is acknowledged when write returned
// nil, and a failing one fails tb.
func runWriters(tb testing.TB, writes int, write func(writer int, id string) error) int {
	var acked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, raceWriters)
	for i := range raceWriters {
		wg.Go(func() {
			for j := range writes {
				if err := write(i, fmt.Sprintf("w%d-%d", i, j)); err != nil {
					errs <- fmt.Errorf("writer %d: %w", i, err)
					return
				}
				acked.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return int(acked.Load())
}

// wholeFileWrite is one write of a seed 001 worker.
func wholeFileWrite(ctx context.Context, client *s3.Client, bucket, key, path, id string) error {
	if err := download(ctx, client, bucket, key, path); err != nil {
		return err
	}
	defer os.Remove(path)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return err
	}
	_, err = db.Exec(`INSERT INTO items VALUES (?, ?)`, id, raceTitle(id))
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	content, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	_, err = client.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: aws.String(key), Body: bytes.NewReader(content)})
	return err
}

func download(ctx context.Context, client *s3.Client, bucket, key, path string) error {
	out, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: aws.String(key)})
	if err != nil {
		var nk *types.NoSuchKey
		if errors.As(err, &nk) {
			return fmt.Errorf("%s is missing", key)
		}
		return err
	}
	defer out.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, out.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func insertBase(tb testing.TB, db *sql.DB) {
	tb.Helper()
	tx, err := db.Begin()
	if err != nil {
		tb.Fatal(err)
	}
	defer tx.Rollback()
	for i := range raceBaseRows {
		id := fmt.Sprintf("base-%d", i)
		if _, err := tx.Exec(`INSERT INTO items VALUES (?, ?)`, id, raceTitle(id)); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
}

// missingRows returns the writers' rows that db lacks.
func missingRows(tb testing.TB, db *sql.DB, writes int) map[string]bool {
	tb.Helper()
	missing := map[string]bool{}
	for i := range raceWriters {
		for j := range writes {
			missing[fmt.Sprintf("w%d-%d", i, j)] = true
		}
	}
	rows, err := db.Query(`SELECT id, title FROM items WHERE id LIKE 'w%'`)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, title string
		if err := rows.Scan(&id, &title); err != nil {
			tb.Fatal(err)
		}
		if title == raceTitle(id) {
			delete(missing, id)
		}
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	var base int
	if err := db.QueryRow(`SELECT count(*) FROM items WHERE id LIKE 'base-%'`).Scan(&base); err != nil || base != raceBaseRows {
		tb.Fatalf("%d base rows (%v), want %d", base, err, raceBaseRows)
	}
	return missing
}

// Ten writers, each with its own database, write to one bucket at once.
// With drivesync no acknowledged write is lost; the whole-file approach,
// run beside it with the same writers, is expected to lose some (how many
// depends on how the writers overlap: it is logged, not asserted).
func TestSeed001Race(t *testing.T) {
	const writes = 10
	d := raceDrivesync(t, writes)
	if d.acknowledged != raceWriters*writes || d.lost != 0 {
		t.Errorf("drivesync: %d writes acknowledged, %d of them lost; want %d and 0", d.acknowledged, d.lost, raceWriters*writes)
	}
	w := raceWholeFile(t, writes)
	if w.acknowledged != raceWriters*writes {
		t.Errorf("whole file: %d writes acknowledged, want %d", w.acknowledged, raceWriters*writes)
	}
	t.Logf("drivesync: %d writes acknowledged, %d lost, %.0f bytes uploaded per write, %.1f requests per sync",
		d.acknowledged, d.lost, d.perWrite, float64(d.requests)/float64(d.syncs))
	t.Logf("whole file: %d writes acknowledged, %d lost, %.0f bytes uploaded per write", w.acknowledged, w.lost, w.perWrite)
}

// BenchmarkSeed001Race measures both approaches in one run: lost writes
// and bytes uploaded per write, and drivesync's requests per sync. Each
// iteration is a whole run of ten writers writing ten rows each.
func BenchmarkSeed001Race(b *testing.B) {
	const writes = 10
	var d, w raceResult
	for b.Loop() {
		r := raceDrivesync(b, writes)
		d.lost += r.lost
		d.acknowledged += r.acknowledged
		d.putBytes += r.putBytes
		d.requests += r.requests
		d.syncs += r.syncs
		r = raceWholeFile(b, writes)
		w.lost += r.lost
		w.acknowledged += r.acknowledged
		w.putBytes += r.putBytes
	}
	b.ReportMetric(float64(d.lost)/float64(b.N), "drivesync-lost/op")
	b.ReportMetric(float64(w.lost)/float64(b.N), "wholefile-lost/op")
	b.ReportMetric(float64(d.putBytes)/float64(d.acknowledged), "drivesync-B/write")
	b.ReportMetric(float64(w.putBytes)/float64(w.acknowledged), "wholefile-B/write")
	b.ReportMetric(float64(d.requests)/float64(d.syncs), "drivesync-requests/sync")
}

// What a sync costs in requests: one with nothing new, one that uploads
// its own changes, and one that downloads k files of others.
func TestRequestsPerSync(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	ca, cb := &counting{}, &counting{}
	// New: a HeadBucket for the clock, and the self-test's two puts and
	// its delete.
	cn := &counting{}
	if _, err := New(ctx, miniotest.ClientAt(server.Endpoint, cn), bucket, Options{}); err != nil {
		t.Fatal(err)
	}
	if n := cn.requests.Load(); n != 4 {
		t.Errorf("New: %d requests, want 4", n)
	}
	a, ea := openDevice(t, miniotest.ClientAt(server.Endpoint, ca), bucket, Options{}, "dev-a", raceSchema)
	_, eb := openDevice(t, miniotest.ClientAt(server.Endpoint, cb), bucket, Options{}, "dev-b", raceSchema)
	for _, e := range []*drivesync.Engine{ea, eb, ea, eb} {
		if _, err := e.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	measure := func(c *counting, e *drivesync.Engine) int64 {
		t.Helper()
		before := c.requests.Load()
		if _, err := e.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		return c.requests.Load() - before
	}
	// A listing and the store's marker; then the uploads, or one
	// download per new file.
	if n := measure(cb, eb); n != 2 {
		t.Errorf("a sync with nothing new: %d requests, want 2", n)
	}
	const k = 3
	for i := range k {
		if _, err := a.Exec(`INSERT INTO items VALUES (?, 'x')`, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
		if n := measure(ca, ea); n != 3 {
			t.Errorf("a sync uploading one file: %d requests, want 3", n)
		}
	}
	if n := measure(cb, eb); n != 2+k {
		t.Errorf("a sync downloading %d files: %d requests, want %d", k, n, 2+k)
	}
}
