package drivesync

import (
	"database/sql"
	"testing"

	"github.com/google/uuid"
)

// BenchmarkCaptureOrdinary is BenchmarkCapture on an ordinary table (dots:
// a composite key, a 512-byte BLOB, typed columns): the same writes on a
// synced table and on an identical table in a database without the
// engine, interleaved, in the same run.
func BenchmarkCaptureOrdinary(b *testing.B) {
	open := func(synced bool) *sql.DB {
		db := openSchemaDB(b, benchDotsSchema)
		if synced {
			openBenchEngine(b, db, Config{Remote: NewMemoryRemote(), Tables: []Table{{Name: "dots"}}, TempDir: b.TempDir()})
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
