package drivesync

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
)

// TestOrdinaryLookupRuns: a sync reads an ordinary table's pending rows
// by their keys, many keys per statement (lookupSQL). Over several runs
// of keys, with keys of every type, rows deleted, edited and left alone
// between syncs, a key that cannot be sent in the middle of a run, and a
// table whose keys are so wide that a statement holds fewer keys than a
// run, the other device ends with exactly the same rows: a row the
// lookup missed would be sent as deleted, one it mismatched as another's
// values.
func TestOrdinaryLookupRuns(t *testing.T) {
	cols := make([]string, 20)
	for i := range cols {
		cols[i] = fmt.Sprintf("k%d", i)
	}
	schema := `CREATE TABLE kv (k, v, w INTEGER, PRIMARY KEY (k)) WITHOUT ROWID;
CREATE TABLE wide (` + strings.Join(cols, ", ") + `, v TEXT, PRIMARY KEY (` + strings.Join(cols, ", ") + `));`
	wide := &tableInfo{keys: cols}
	if n := wide.lookupKeys(); n >= fillRows {
		t.Fatalf("a statement holds %d keys of wide: the test needs fewer than a run's %d", n, fillRows)
	}
	remote := NewMemoryRemote()
	tables := []Table{{Name: "kv"}, {Name: "wide"}}
	a := rowsDevice(t, "dev-a", remote, schema, tables...)
	b := rowsDevice(t, "dev-b", remote, schema, tables...)
	const n = 300
	for i := range n {
		switch i % 3 {
		case 0:
			a.exec(`INSERT INTO kv VALUES (?, ?, ?)`, i, fmt.Sprint("integer ", i), i)
		case 1:
			a.exec(`INSERT INTO kv VALUES (?, ?, ?)`, fmt.Sprintf("it's, %d", i), fmt.Sprint("text ", i), i)
		case 2:
			a.exec(`INSERT INTO kv VALUES (?, ?, ?)`, []byte{byte(i), 0, byte(i >> 8)}, fmt.Sprint("blob ", i), i)
		}
	}
	// A key that is not UTF-8, in the middle of the second run: skipped,
	// and nothing else is.
	a.exec(`INSERT INTO kv VALUES (CAST(X'FF70' AS TEXT), 'bad key', 0)`)
	for i := range 150 {
		args := make([]any, len(cols)+1)
		for j := range cols {
			args[j] = (i + j) % 7
		}
		args[len(cols)-1], args[len(cols)] = i, fmt.Sprint("wide ", i)
		a.exec(`INSERT INTO wide VALUES (`+strings.Repeat("?, ", len(cols))+`?)`, args...)
	}
	kvDump := typedDump("kv", "k", "v", "w") + " "
	kvSent := strings.Replace(kvDump, "FROM kv", "FROM kv WHERE CAST(k AS BLOB) != X'FF70'", 1)
	wideDump := typedDump("wide", append(cols, "v")...)
	check := func(round string) {
		t.Helper()
		r := a.sync()
		if len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0].Err.Error(), "not valid UTF-8") {
			t.Fatalf("%s: skipped %v, want the key that is not UTF-8 only", round, r.Skipped)
		}
		b.sync()
		if got, want := b.rows(kvSent), a.rows(kvSent); got != want {
			t.Fatalf("%s: b's kv differs:\n%s\nwant\n%s", round, got, want)
		}
		if got, want := b.rows(wideDump), a.rows(wideDump); got != want {
			t.Fatalf("%s: b's wide differs:\n%s\nwant\n%s", round, got, want)
		}
		if got := strings.Count(b.rows(kvDump), "\n"); got == 0 {
			t.Fatalf("%s: b has no rows", round)
		}
	}
	check("first sync")
	// Every third row deleted, every fifth edited, the rest left alone,
	// all pending again.
	a.exec(`UPDATE kv SET w = w + 1000`)
	a.exec(`UPDATE kv SET w = w - 1000 WHERE w % 5 != 0`)
	a.exec(`DELETE FROM kv WHERE w % 3 = 1`)
	a.exec(`UPDATE wide SET v = v || ' edited' WHERE k19 % 5 = 0`)
	a.exec(`DELETE FROM wide WHERE k19 % 3 = 1`)
	a.exec(`UPDATE wide SET v = v WHERE k19 % 3 != 1`)
	check("second sync")
	if got := strings.Count(b.rows(wideDump), "\n"); got != 100 {
		t.Fatalf("b holds %d rows of wide, want 100", got)
	}
}

// TestPendingInRecordOrder: the plan reads the pending records of the set
// and the log together, each once, in record order, though pendingSQL
// leaves the order to its source (see pendingSQL), for a document table
// and an ordinary one.
func TestPendingInRecordOrder(t *testing.T) {
	schema := notesSchema + `;
CREATE TABLE kv (k, v, PRIMARY KEY (k)) WITHOUT ROWID;`
	d := rowsDevice(t, "dev-a", NewMemoryRemote(), schema, Table{Name: "notes"}, Table{Name: "kv"})
	// Written in an order of their own, several times each; some
	// marked in the set as well as the log.
	const n = 500
	for round := range 2 {
		for i := range n {
			j := (i * 7919) % n
			d.exec(`INSERT INTO notes (id, content) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET content = excluded.content`, fmt.Sprintf("n%04d", j), fmt.Sprintf(`{"r":%d}`, round))
			d.exec(`INSERT INTO kv VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, []any{j, fmt.Sprint("t", j)}[j%2], round)
		}
	}
	d.exec(`INSERT INTO sync_pending_changes SELECT DISTINCT table_name, record_id FROM sync_pending_log WHERE rowid % 3 = 0`)
	d.exec(`INSERT INTO sync_pending_changes VALUES ('notes', 'gone'), ('kv', '''gone''')`)
	for _, name := range []string{"notes", "kv"} {
		ti := d.eng.tables[name]
		rows, err := d.db.Query(ti.pendingSQL(pendingUnion), name)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for rows.Next() {
			var id string
			vals := make([]any, 0)
			cols, _ := rows.Columns()
			for range cols[1:] {
				vals = append(vals, new(any))
			}
			if err := rows.Scan(append([]any{&id}, vals...)...); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if len(ids) != n+1 {
			t.Fatalf("%s: %d pending records read, want %d", name, len(ids), n+1)
		}
		for i := 1; i < len(ids); i++ {
			if ids[i-1] >= ids[i] {
				t.Fatalf("%s: record %q read after %q: not in record order", name, ids[i], ids[i-1])
			}
		}
	}
}

// TestEachRowFillMustEmitAll: a fill that leaves a row of its run out
// fails the loop: fn never seeing a pending record would clear its mark
// unsent.
func TestEachRowFillMustEmitAll(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	ctx := context.Background()
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rows, err := conn.QueryContext(ctx, `WITH RECURSIVE k(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM k WHERE i < 99) SELECT i FROM k`)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	err = eachRow(rows, func(rows *sql.Rows, i *int) error { return rows.Scan(i) }, func(run []int, emit func(*int) bool) error {
		for i := range run {
			if run[i] != 70 && !emit(&run[i]) {
				return nil
			}
		}
		return nil
	}, func(*int) int { return 8 }, func(err error) error { return err }, func(i *int) error { seen++; return nil })
	if err == nil || !strings.Contains(err.Error(), "35 of 36 rows") {
		t.Fatalf("a fill leaving row 70 out: err %v after %d rows", err, seen)
	}
}
