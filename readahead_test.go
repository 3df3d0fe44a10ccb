package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The decoders and the spool read ahead on a goroutine of their own (see
// jsonStream.elements and spool.each). These tests check that the caller
// still sees what a plain loop gives: every element in order, the first
// error in the elements' order, and a reader left where it should be.

// readAheadChange is the i-th change of these tests: sizes vary, and a
// few are large, so that batches end by size as well as by count.
func readAheadChange(i int) fileChange {
	body := strings.Repeat("x", i%37)
	if i%97 == 0 {
		body = strings.Repeat("y", 70<<10)
	}
	c := fileChange{table: "notes", record: fmt.Sprint("r", i), version: int64(i + 1), device: "d",
		patch: []byte(fmt.Sprintf(`{"b":%q,"i":%d}`, body, i))}
	if i%3 == 0 {
		c.clock = []byte(fmt.Sprint("clock", i))
		c.oldest = int64(i/2 + 1)
	}
	if i%5 == 0 {
		c.deleted = true
	}
	return c
}

func TestSpoolReplay(t *testing.T) {
	const n = 1000
	sp, err := newSpool(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	for i := range n {
		if err := sp.add(readAheadChange(i)); err != nil {
			t.Fatal(err)
		}
	}
	check := func(i int, c fileChange) {
		t.Helper()
		want := readAheadChange(i)
		if c.table != want.table || c.record != want.record || c.version != want.version || c.device != want.device ||
			c.deleted != want.deleted || !bytes.Equal(c.patch, want.patch) || !bytes.Equal(c.clock, want.clock) || (c.clock == nil) != (want.clock == nil) || c.base != nil ||
			c.oldest != want.oldest {
			t.Fatalf("change %d came back as %+v, want %+v", i, c, want)
		}
	}
	// Stopped by fn: the replay ends at once with fn's error.
	stop := errors.New("stop")
	for _, at := range []int{0, 1, 255, 256, 300, n - 1} {
		seen := 0
		err := sp.each(func(c fileChange) error {
			check(seen, c)
			if seen == at {
				return stop
			}
			seen++
			return nil
		})
		if err != stop || seen != at {
			t.Fatalf("stopped at %d: err %v after %d changes", at, err, seen)
		}
	}
	// Whole, again, and the spool takes more after it.
	seen := 0
	if err := sp.each(func(c fileChange) error { check(seen, c); seen++; return nil }); err != nil || seen != n {
		t.Fatalf("replay: %d of %d changes, err %v", seen, n, err)
	}
	if err := sp.add(readAheadChange(n)); err != nil {
		t.Fatal(err)
	}
	seen = 0
	if err := sp.each(func(c fileChange) error { check(seen, c); seen++; return nil }); err != nil || seen != n+1 {
		t.Fatalf("replay after add: %d of %d changes, err %v", seen, n+1, err)
	}
	// A spool file cut short: every whole change, in order, then the error.
	if err := sp.w.Flush(); err != nil {
		t.Fatal(err)
	}
	fi, err := sp.f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sp.f.Name(), fi.Size()*2/3); err != nil {
		t.Fatal(err)
	}
	seen = 0
	err = sp.each(func(c fileChange) error { check(seen, c); seen++; return nil })
	if err == nil || !strings.Contains(err.Error(), "read spool") || seen == 0 || seen >= n {
		t.Fatalf("cut spool: %d changes, err %v", seen, err)
	}
}

// readAheadPatchFile is a gzip patch file of n changes; bad, if not
// negative, is a change the reader must refuse: a version that is no
// number, or with broken, text that is not JSON.
func readAheadPatchFile(t *testing.T, n, bad int, broken ...bool) []byte {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"format":1,"device":"d","changes":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		c := readAheadChange(i)
		switch {
		case i == bad && len(broken) > 0:
			b.WriteString(`{"table_name":"notes",,"record_id":"r"}`)
		case i == bad:
			b.WriteString(`{"table_name":"notes","record_id":"r","patch":{"a":1},"sync_version":"one"}`)
		case c.deleted:
			fmt.Fprintf(&b, `{"table_name":%q,"record_id":%q,"patch":{},"is_deleted":true,"sync_version":%d}`, c.table, c.record, c.version)
		default:
			fmt.Fprintf(&b, `{"table_name":%q,"record_id":%q,"patch":%s,"sync_version":%d}`, c.table, c.record, c.patch, c.version)
		}
	}
	b.WriteString(`]}`)
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write([]byte(b.String()))
	w.Close()
	return gz.Bytes()
}

func TestDecodeReadsAheadInOrder(t *testing.T) {
	const n = 1000
	decode := func(file []byte, emit func(fileChange) error) error {
		_, err := decodePatchFile(bytes.NewReader(file), "d", 1<<30, 1<<20, emit)
		return err
	}
	good := readAheadPatchFile(t, n, -1)
	seen := 0
	in := func(c fileChange) error {
		if want := readAheadChange(seen); c.record != want.record || c.version != want.version || c.deleted != want.deleted {
			t.Fatalf("change %d came as %s v%d", seen, c.record, c.version)
		}
		seen++
		return nil
	}
	if err := decode(good, in); err != nil || seen != n {
		t.Fatalf("%d of %d changes, err %v", seen, n, err)
	}
	// emit's error ends the read at once.
	stop := errors.New("stop")
	for _, at := range []int{0, 255, 256, 700} {
		seen = 0
		err := decode(good, func(c fileChange) error {
			if seen == at {
				return stop
			}
			return in(c)
		})
		if err != stop || seen != at {
			t.Fatalf("stopped at %d: err %v after %d changes", at, err, seen)
		}
	}
	// A bad change: those before it reach emit, then its error.
	for _, bad := range []int{0, 1, 300, n - 1} {
		seen = 0
		err := decode(readAheadPatchFile(t, n, bad), in)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("change %d:", bad)) || seen != bad {
			t.Fatalf("bad change %d: err %v after %d changes", bad, err, seen)
		}
	}
	// A change that is not JSON stops the reading side.
	for _, bad := range []int{0, 300, n - 1} {
		seen = 0
		err := decode(readAheadPatchFile(t, n, bad, true), in)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("change %d:", bad)) || seen != bad {
			t.Fatalf("change %d not JSON: err %v after %d changes", bad, err, seen)
		}
	}
	// emit's error comes first when it is met before a bad change.
	seen = 0
	err := decode(readAheadPatchFile(t, n, 600), func(c fileChange) error {
		if seen == 500 {
			return stop
		}
		return in(c)
	})
	if err != stop {
		t.Fatalf("emit failed at 500 before the bad change 600: err %v", err)
	}
	// A file cut short inside the changes.
	seen = 0
	raw := readAheadPatchFile(t, n, -1)
	zr, _ := gzip.NewReader(bytes.NewReader(raw))
	var plain bytes.Buffer
	plain.ReadFrom(zr)
	var cut bytes.Buffer
	w := gzip.NewWriter(&cut)
	w.Write(plain.Bytes()[:plain.Len()/2])
	w.Close()
	if err := decode(cut.Bytes(), in); err == nil || seen == 0 || seen >= n {
		t.Fatalf("cut file: err %v after %d changes", err, seen)
	}
}

// TestEachRow reads 1000 rows of a real SQLite query ahead: fn sees them
// in order, its error ends the read, a scan error comes after the rows
// before it, and fn can query the same connection meanwhile.
func TestEachRow(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", testDSN(filepath.Join(t.TempDir(), "rows.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const n = 1000
	query := func() *sql.Rows {
		t.Helper()
		// Row 700 holds text where the scan wants a number; rows whose
		// text is long end batches by size.
		rows, err := conn.QueryContext(ctx, `WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i < ?1 - 1)
SELECT CASE WHEN i = ?2 THEN 'seven hundred' ELSE i END, CASE WHEN i % 50 = 0 THEN zeroblob(100000) ELSE '' END FROM k`, n, 700)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	type row struct {
		i   int
		pad []byte
	}
	scan := func(rows *sql.Rows, r *row) error { return rows.Scan(&r.i, &r.pad) }
	size := func(r *row) int { return len(r.pad) }
	readErr := func(err error) error { return fmt.Errorf("reading: %w", err) }
	// Up to the bad row, fn sees each row in order and queries the
	// same connection.
	seen := 0
	err = eachRow(query(), scan, nil, size, readErr, func(r *row) error {
		if r.i != seen {
			t.Fatalf("row %d came as %d", seen, r.i)
		}
		var one int
		if err := conn.QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
			return err
		}
		seen++
		return nil
	})
	if err == nil || !strings.HasPrefix(err.Error(), "reading: ") || seen != 700 {
		t.Fatalf("after %d rows: err %v, want the scan error of row 700", seen, err)
	}
	stop := errors.New("stop")
	for _, at := range []int{0, 255, 256, 699} {
		seen = 0
		err := eachRow(query(), scan, nil, size, readErr, func(r *row) error {
			if seen == at {
				return stop
			}
			seen++
			return nil
		})
		if err != stop || seen != at {
			t.Fatalf("stopped at %d: err %v after %d rows", at, err, seen)
		}
	}
	// The connection is free again: the rows were closed.
	if _, err := conn.ExecContext(ctx, `CREATE TABLE after_rows (x)`); err != nil {
		t.Fatal(err)
	}
}

// TestReadAhead: fn's error stops read at its next send, and readAhead
// returns only once read has (under -race, reading what read wrote
// would race otherwise); read's error comes after the items before it.
func TestReadAhead(t *testing.T) {
	const n = 10000
	stop := errors.New("stop")
	var sent int
	var returned bool
	got := 0
	err := readAhead(func(send func(int, int) bool) error {
		defer func() { returned = true }()
		for i := range n {
			sent++
			if !send(i, 8) {
				return nil
			}
		}
		return nil
	}, func(i *int) error {
		if *i != got {
			t.Fatalf("item %d came as %d", got, *i)
		}
		if got == 300 {
			return stop
		}
		got++
		return nil
	})
	if err != stop || !returned || sent == n {
		t.Fatalf("err %v, read returned %v, sent %d of %d", err, returned, sent, n)
	}
	readErr := errors.New("read")
	got = 0
	err = readAhead(func(send func(int, int) bool) error {
		for i := range 700 {
			send(i, 1<<20) // every item fills a batch
		}
		return readErr
	}, func(i *int) error { got++; return nil })
	if err != readErr || got != 700 {
		t.Fatalf("err %v after %d items, want the read's error after 700", err, got)
	}
}

// TestReadAheadStopsRead: once fn fails, read's next send says stop,
// whether read is filling a batch or waiting to hand one over.
func TestReadAheadStopsRead(t *testing.T) {
	for _, waiting := range []bool{false, true} {
		for range 10 {
			var sent, failedAt atomic.Int64
			stop := errors.New("stop")
			err := readAhead(func(send func(int, int) bool) error {
				for i := 0; ; i++ {
					if !waiting && i%10 == 0 {
						time.Sleep(time.Millisecond) // mid-batch when fn fails
					}
					sent.Add(1)
					if !send(i, 1) {
						return nil
					}
				}
			}, func(*int) error {
				if waiting {
					// read waits with its fourth batch full: two wait in
					// the channel, fn has the first.
					for sent.Load() < 4*aheadItems {
						runtime.Gosched()
					}
					time.Sleep(time.Millisecond)
				}
				failedAt.Store(sent.Load())
				return stop
			})
			// Between fn's failure and stop, read may send the rest of a
			// burst of 10 (then it sleeps); a batch holds 256.
			if after := sent.Load() - failedAt.Load(); err != stop || after > 20 {
				t.Fatalf("waiting %v: err %v; read sent %d items after fn failed", waiting, err, after)
			}
		}
	}
}
