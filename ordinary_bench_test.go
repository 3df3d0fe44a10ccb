package drivesync

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
)

// BenchmarkCaptureOrdinary is BenchmarkCapture on an ordinary table (a
// composite key, a 512-byte BLOB, typed columns): the same writes on a
// synced table and on an identical table in a database without the
// engine, interleaved, in the same run.
func BenchmarkCaptureOrdinary(b *testing.B) {
	const schema = `CREATE TABLE dots (uuid TEXT NOT NULL, gen INTEGER NOT NULL, pixel_data BLOB NOT NULL,
	title TEXT, acquired_at INTEGER NOT NULL, PRIMARY KEY (uuid, gen))`
	open := func(synced bool) *sql.DB {
		db, err := sql.Open("sqlite", testDSN(filepath.Join(b.TempDir(), "bench.db")))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		if _, err := db.Exec(schema); err != nil {
			b.Fatal(err)
		}
		if synced {
			if _, err := Open(context.Background(), db, Config{Remote: NewMemoryRemote(), Tables: []Table{{Name: "dots"}}, TempDir: b.TempDir()}); err != nil {
				b.Fatal(err)
			}
		}
		return db
	}
	pixels := make([]byte, 512)
	for _, bc := range []struct {
		name   string
		rows   int
		update bool
	}{
		{"insert/1", 1, false},
		{"update/1", 1, true},
		{"insert/1000", 1000, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			synced, plain := open(true), open(false)
			ids := make([]string, 1000)
			for i := range ids {
				ids[i] = uuid.NewString()
				for _, db := range []*sql.DB{synced, plain} {
					if _, err := db.Exec(`INSERT INTO dots VALUES (?, 0, ?, 'x', 1)`, ids[i], pixels); err != nil {
						b.Fatal(err)
					}
				}
			}
			compareCapture(b, synced, plain, bc.rows, nil, func(tx *sql.Tx, k int) (err error) {
				if bc.update {
					_, err = tx.Exec(`UPDATE dots SET title = ?, acquired_at = ? WHERE uuid = ? AND gen = 0`, "t", k, ids[k%len(ids)])
				} else {
					_, err = tx.Exec(`INSERT INTO dots VALUES (?, ?, ?, 'x', ?)`, uuid.NewString(), k, pixels, k)
				}
				return err
			})
		})
	}
}
