package drivertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// testErrorCodes: sqliteerr reads the result code out of the errors the
// driver really returns, through each path a statement can take (direct
// execution, bound arguments, a statement prepared on a connection inside
// a transaction, as the engine writes rows) and through the engine's own
// wrapping.
func testErrorCodes(t *testing.T, d Driver) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "codes.db")
	db := openDB(t, d.Name, d.DSN(path, 0))
	mustExec(t, db, `CREATE TABLE t (id TEXT PRIMARY KEY, u TEXT UNIQUE, n TEXT NOT NULL DEFAULT '', c INTEGER CHECK (c >= 0))`)
	mustExec(t, db, `INSERT INTO t (id, u) VALUES ('a', 'x')`)
	exec := func(query string, args ...any) error {
		_, err := db.Exec(query, args...)
		return err
	}
	unique := exec(`INSERT INTO t (id, u) VALUES ('b', 'x')`)

	// A statement prepared on a connection and run inside BEGIN
	// IMMEDIATE, as the engine's final transaction does.
	inTx := func(query string, args ...any) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		defer conn.ExecContext(ctx, "ROLLBACK")
		st, err := conn.PrepareContext(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		_, err = st.ExecContext(ctx, args...)
		return err
	}

	// Another connection holds the write lock; this one sets no busy
	// timeout, so SQLite answers SQLITE_BUSY at once.
	var busyBegin, busyWrite, busyWriteArgs error
	func() {
		other := openDB(t, d.Name, d.DSN(path, 0))
		holder, err := other.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		if _, err := holder.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		defer holder.ExecContext(ctx, "ROLLBACK")
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, busyBegin = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		conn.ExecContext(ctx, "ROLLBACK")
		busyWrite = exec(`INSERT INTO t (id) VALUES ('b')`)
		busyWriteArgs = exec(`INSERT INTO t (id) VALUES (?)`, "b")
	}()

	// SQLITE_LOCKED: a connection drops a table it is still reading.
	var locked error
	func() {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		mustExec(t, db, `CREATE TABLE dropme (x)`)
		mustExec(t, db, `INSERT INTO dropme VALUES (1), (2)`)
		rows, err := conn.QueryContext(ctx, `SELECT x FROM dropme`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		if !rows.Next() {
			t.Fatal("no row to read")
		}
		_, locked = conn.ExecContext(ctx, `DROP TABLE dropme`)
	}()

	// SQLITE_READONLY: a connection that may not write, as one on a
	// file opened read-only is (query_only says so in every driver's
	// DSN syntax alike).
	var readOnly error
	func() {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `PRAGMA query_only = 1`); err != nil {
			t.Fatal(err)
		}
		defer conn.ExecContext(ctx, `PRAGMA query_only = 0`)
		_, readOnly = conn.ExecContext(ctx, `INSERT INTO t (id) VALUES ('ro')`)
	}()

	var one int
	tests := []struct {
		name       string
		err        error
		code       int
		busy       bool
		constraint bool
	}{
		{"unique", unique, 19, false, true},
		{"unique, bound arguments", exec(`INSERT INTO t (id, u) VALUES (?, ?)`, "b", "x"), 19, false, true},
		{"not null", exec(`INSERT INTO t (id, n) VALUES ('b', NULL)`), 19, false, true},
		{"check, bound arguments", exec(`INSERT INTO t (id, c) VALUES (?, ?)`, "b", -1), 19, false, true},
		{"primary key", exec(`INSERT INTO t (id) VALUES ('a')`), 19, false, true},
		{"unique, prepared, in a transaction", inTx(`INSERT INTO t (id, u) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET u = excluded.u`, "b", "x"), 19, false, true},
		{"not null, prepared, in a transaction", inTx(`UPDATE t SET n = ?2 WHERE id = ?1`, "a", nil), 19, false, true},
		{"unique, wrapped by the engine", &drivesync.Error{Op: "write", Table: "t", Record: "b", Err: unique}, 19, false, true},
		{"unique, wrapped twice", fmt.Errorf("apply: %w", &drivesync.Error{Op: "write", Err: unique}), 19, false, true},
		{"unique, joined after another error", errors.Join(errors.New("first"), unique), 19, false, true},
		{"busy BEGIN IMMEDIATE", busyBegin, 5, true, false},
		{"busy write", busyWrite, 5, true, false},
		{"busy write, bound arguments", busyWriteArgs, 5, true, false},
		{"busy, wrapped by the engine", &drivesync.Error{Op: "apply", Err: busyBegin}, 5, true, false},
		{"locked table", locked, 6, true, false},
		{"read-only connection", readOnly, 8, false, false},
		{"read-only, wrapped by the engine", &drivesync.Error{Op: "sync", Err: readOnly}, 8, false, false},
		{"syntax error", exec(`SELEC 1`), 1, false, false},
		{"no such table", exec(`INSERT INTO missing VALUES (1)`), 1, false, false},
		{"no rows", db.QueryRow(`SELECT 1 WHERE 0`).Scan(&one), -1, false, false},
		{"nil", nil, -1, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.code != -1 && tt.err == nil {
				t.Fatalf("%s: the statement did not fail", d.Name)
			}
			code, busy, constraint, readOnly := sqliteerr.Code(tt.err), sqliteerr.IsBusy(tt.err), sqliteerr.IsConstraint(tt.err), sqliteerr.IsReadOnly(tt.err)
			if code != tt.code || busy != tt.busy || constraint != tt.constraint || readOnly != (tt.code == sqliteerr.ReadOnly) {
				t.Errorf("%s error %T %q: Code, IsBusy, IsConstraint, IsReadOnly = %d, %v, %v, %v; want %d, %v, %v, %v",
					d.Name, tt.err, tt.err, code, busy, constraint, readOnly, tt.code, tt.busy, tt.constraint, tt.code == sqliteerr.ReadOnly)
			}
		})
	}
}

func mustExec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.Exec(query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}
