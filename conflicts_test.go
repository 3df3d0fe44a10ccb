package drivesync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

func (d *device) conflicts() []Conflict {
	d.t.Helper()
	cs, err := d.eng.Conflicts(context.Background(), ConflictFilter{})
	if err != nil {
		d.t.Fatal(err)
	}
	return cs
}

// TestConflictLog: two devices edit one field at once; the losing side
// logs its value, the winning side logs nothing, and keeping the loser
// brings it back everywhere. Edits of other fields, and an edit made
// after seeing the other's, are not conflicts.
func TestConflictLog(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n1", `{"title":"t0","body":"b0","tags":{"x":true}}`)
	syncAll(t, a, b)

	// Both edit the title; b's write wins the tie of versions by its id.
	a.put("n1", `{"title":"from a","body":"b0","tags":{"x":true}}`)
	b.put("n1", `{"title":"from b","body":"b0","tags":{"x":true}}`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := a.get("n1"); !strings.Contains(got, `"from b"`) {
		t.Fatalf("a holds %s; the test expects b's write to win", got)
	}
	if cs := b.conflicts(); len(cs) != 0 {
		t.Fatalf("the winning side logged %+v", cs)
	}
	cs := a.conflicts()
	if len(cs) != 1 {
		t.Fatalf("a logged %d conflicts, want 1: %+v", len(cs), cs)
	}
	c := cs[0]
	if c.Table != "notes" || c.Record != "n1" || !slices.Equal(c.Path, []string{"title"}) || string(c.Loser) != `"from a"` || string(c.Winner) != `"from b"` ||
		c.LoserDevice != "dev-a" || c.WinnerDevice != "dev-b" || c.LoserVersion == 0 || c.WinnerVersion == 0 || c.At.IsZero() {
		t.Fatalf("logged %+v", c)
	}
	if !sameValues(c.Key, []any{"n1"}) {
		t.Fatalf("a document's conflict has Key %#v, want its id", c.Key)
	}

	// Sequential edits, and concurrent edits of different fields or
	// members of a map, are not conflicts.
	b.put("n1", `{"title":"b after seeing a","body":"b0","tags":{"x":true}}`)
	syncAll(t, b, a)
	a.put("n1", `{"title":"b after seeing a","body":"a's body","tags":{"x":true,"ya":true}}`)
	b.put("n1", `{"title":"b's title","body":"b0","tags":{"x":true,"yb":true}}`)
	syncAll(t, a, b, a)
	assertConverged(t, a, b)
	if n := len(a.conflicts()) + len(b.conflicts()); n != 1 {
		t.Fatalf("%d conflicts logged in all, want the first one only: %+v %+v", n, a.conflicts(), b.conflicts())
	}

	// Keep the loser: a's title comes back, as a new edit that syncs.
	if err := a.eng.ResolveConflict(context.Background(), c.ID, KeepLoser); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(a.get("n1"), `"title":"from a"`) || a.pendingCount() != 1 {
		t.Fatalf("after KeepLoser a holds %s with %d pending", a.get("n1"), a.pendingCount())
	}
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if got := b.get("n1"); !strings.Contains(got, `"title":"from a"`) || !strings.Contains(got, `"body":"a's body"`) || !strings.Contains(got, `"yb":true`) {
		t.Fatalf("b holds %s", got)
	}
	if len(a.conflicts()) != 0 || len(b.conflicts()) != 0 {
		t.Fatal("restoring the loser logged a conflict, or the resolved one stayed")
	}
	if err := a.eng.ResolveConflict(context.Background(), c.ID, KeepWinner); !errors.Is(err, ErrNoConflict) {
		t.Fatalf("resolving again: got %v, want ErrNoConflict", err)
	}
}

// TestConflictLogThreeDevices: a third device that held the overwritten
// value logs it too; the writer that won logs nothing. KeepWinner
// dismisses.
func TestConflictLogThreeDevices(t *testing.T) {
	mem := NewMemoryRemote()
	a, b, c := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem), newDevice(t, "dev-c", mem)
	a.put("n1", `{"body":"b0"}`)
	syncAll(t, a, b, c)
	a.put("n1", `{"body":"from a"}`)
	a.sync()
	c.sync()                         // c shows a's body
	b.put("n1", `{"body":"from b"}`) // not having seen a's
	syncAll(t, b, a, c)
	assertConverged(t, a, b, c)
	if !strings.Contains(c.get("n1"), "from b") {
		t.Fatalf("c holds %s; the test expects b's write to win", c.get("n1"))
	}
	for _, d := range []*device{a, c} {
		cs := d.conflicts()
		if len(cs) != 1 || string(cs[0].Loser) != `"from a"` || string(cs[0].Winner) != `"from b"` {
			t.Fatalf("%s logged %+v", d.name, cs)
		}
	}
	if cs := b.conflicts(); len(cs) != 0 {
		t.Fatalf("b logged %+v", cs)
	}
	if err := c.eng.ResolveConflict(context.Background(), c.conflicts()[0].ID, KeepWinner); err != nil {
		t.Fatal(err)
	}
	if len(c.conflicts()) != 0 || c.pendingCount() != 0 || !strings.Contains(c.get("n1"), "from b") {
		t.Fatal("KeepWinner changed the row or kept the entry")
	}
}

// TestConflictLogBounded: past MaxConflicts the oldest entries go.
func TestConflictLogBounded(t *testing.T) {
	mem := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", mem)
	a.put("n1", `{"v":0}`)
	syncAll(t, a, b)
	a.exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
INSERT INTO sync_conflicts (table_name, record_id, path, loser, loser_version, loser_device, winner, winner_version, winner_device, detected_at)
SELECT 'notes', 'old' || i, '["v"]', '1', 1, 'x', '2', 2, 'y', '2026-01-01T00:00:00Z' FROM n`, MaxConflicts)
	a.put("n1", `{"v":"a"}`)
	b.put("n1", `{"v":"b"}`)
	syncAll(t, a, b, a)
	cs := a.conflicts()
	if len(cs) != MaxConflicts || cs[0].Record != "n1" || cs[len(cs)-1].Record != "old2" {
		t.Fatalf("%d entries, newest %s, oldest %s", len(cs), cs[0].Record, cs[len(cs)-1].Record)
	}
	if got, _ := a.eng.Conflicts(context.Background(), ConflictFilter{Record: "n1", Limit: 5}); len(got) != 1 {
		t.Fatalf("filter by record: %d", len(got))
	}
}

// TestConflictLogAppendOnly: an append-only row that another device wrote
// with another payload under the same key is logged once, on the side
// whose row is not the synced one; KeepWinner replaces the row with the
// synced one, KeepLoser keeps it. The side whose row won logs nothing:
// its row is the synced one, and nothing of it was lost.
func TestConflictLogAppendOnly(t *testing.T) {
	remote := NewMemoryRemote()
	a := rowsDevice(t, "dev-a", remote, dotsSchema, dotsTable)
	b := rowsDevice(t, "dev-b", remote, dotsSchema, dotsTable)
	a.exec(`INSERT INTO dots VALUES ('E', 1, X'0A', 10)`)
	a.exec(`INSERT INTO dots VALUES ('F', 1, X'0C', 12)`)
	b.exec(`INSERT INTO dots VALUES ('E', 1, X'0B', 11)`)
	b.exec(`INSERT INTO dots VALUES ('F', 1, X'0D', 13)`)
	for range 3 {
		syncAll(t, a, b)
	}
	ca, cb := a.conflicts(), b.conflicts()
	if len(ca) != 2 || len(cb) != 0 {
		t.Fatalf("logged %d on a, %d on b; want two on a (one per key), however many syncs report them, and none on b: %+v", len(ca), len(cb), cb)
	}
	slices.SortFunc(ca, func(x, y Conflict) int { return strings.Compare(x.Record, y.Record) })
	if len(ca[0].Path) != 0 || !strings.Contains(string(ca[0].Loser), "10") || !strings.Contains(string(ca[0].Winner), "11") || ca[0].WinnerDevice != "dev-b" {
		t.Fatalf("a logged %+v", ca[0])
	}
	// The whole row is in conflict: its columns decode by name.
	if !sameValues(ca[0].Key, []any{"E", int64(1)}) {
		t.Fatalf("Key %#v, want E, 1", ca[0].Key)
	}
	for _, side := range []struct {
		raw  json.RawMessage
		want map[string]any
	}{
		{ca[0].Loser, map[string]any{"pixel_data": []byte{0x0A}, "crc32_u32": int64(10)}},
		{ca[0].Winner, map[string]any{"pixel_data": []byte{0x0B}, "crc32_u32": int64(11)}},
	} {
		got, err := DecodeColumnValues(side.raw)
		if err != nil || len(got) != len(side.want) {
			t.Fatalf("DecodeColumnValues(%s) = %#v, %v; want %#v", side.raw, got, err, side.want)
		}
		for col, want := range side.want {
			if !sameValue(got[col], want) {
				t.Fatalf("DecodeColumnValues(%s)[%s] = %#v, want %#v", side.raw, col, got[col], want)
			}
		}
	}
	if err := a.eng.ResolveConflict(context.Background(), ca[0].ID, KeepWinner); err != nil {
		t.Fatal(err)
	}
	if err := a.eng.ResolveConflict(context.Background(), ca[1].ID, KeepLoser); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	if got, want := a.rows(`SELECT hex(pixel_data) FROM dots ORDER BY crc32_u32`), "0B\n0C\n"; got != want {
		t.Fatalf("a holds %q after KeepWinner of E and KeepLoser of F, want %q", got, want)
	}
	if got := b.rows(`SELECT hex(pixel_data) FROM dots ORDER BY crc32_u32`); got != "0B\n0D\n" {
		t.Fatalf("b holds %q", got)
	}
	if len(a.conflicts()) != 0 || len(b.conflicts()) != 0 {
		t.Fatalf("entries left: %+v %+v", a.conflicts(), b.conflicts())
	}
}

// TestConflictLogOrdinaryTable: a column of an ordinary table written on
// two devices at once; KeepLoser writes the column back, typed.
func TestConflictLogOrdinaryTable(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, n INTEGER, data BLOB)`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "items"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "items"})
	a.exec(`INSERT INTO items VALUES ('i1', 't0', 1, X'00')`)
	syncAll(t, a, b)
	a.exec(`UPDATE items SET data = X'AA', n = 2`)
	b.exec(`UPDATE items SET data = X'BB'`)
	syncAll(t, a, b)
	cs := a.conflicts()
	if len(cs) != 1 || !slices.Equal(cs[0].Path, []string{"data"}) {
		t.Fatalf("a logged %+v", cs)
	}
	if err := a.eng.ResolveConflict(context.Background(), cs[0].ID, KeepLoser); err != nil {
		t.Fatal(err)
	}
	syncAll(t, a, b)
	for _, d := range []*device{a, b} {
		if got := d.rows(`SELECT title, n, hex(data), typeof(data) FROM items`); got != "t0 | 2 | AA | blob\n" {
			t.Fatalf("%s holds %q", d.name, got)
		}
	}
}

// TestSeenNeverKeepsAChangeBack: a change that fits in a patch file only
// without its "seen" list goes without it; it is never left unsent.
func TestSeenNeverKeepsAChangeBack(t *testing.T) {
	mem := NewMemoryRemote()
	a := newDevice(t, "dev-a", mem)
	a.cfg.Limits = Limits{MaxRecordSize: 1024, MaxExpandedSize: 1100, MaxFileSize: 1100}
	a.open()
	b := newDevice(t, "dev-b", mem)
	content := func(v string) string {
		var fields []string
		for i := range 20 {
			fields = append(fields, fmt.Sprintf(`"field%02d":"%s%02d"`, i, v, i))
		}
		return "{" + strings.Join(fields, ",") + "}"
	}
	a.put("n1", content(strings.Repeat("x", 30)))
	syncAll(t, a, b)
	a.put("n1", content(strings.Repeat("y", 30)))
	if r := a.sync(); len(r.Skipped) != 0 || r.ChangesSent != 1 {
		t.Fatalf("sent %d, skipped %v", r.ChangesSent, r.Skipped)
	}
	b.sync()
	assertConverged(t, a, b)
}

// sameValue reports whether a and b are the same column value: the same
// Go type and the same value, a float64 bit for bit (-0.0 is not 0.0).
func sameValue(a, b any) bool {
	switch a := a.(type) {
	case nil:
		return b == nil
	case int64:
		b, ok := b.(int64)
		return ok && a == b
	case float64:
		b, ok := b.(float64)
		return ok && math.Float64bits(a) == math.Float64bits(b)
	case string:
		b, ok := b.(string)
		return ok && a == b
	case []byte:
		b, ok := b.([]byte)
		return ok && bytes.Equal(a, b)
	}
	return false
}

func sameValues(a, b []any) bool {
	return slices.EqualFunc(a, b, sameValue)
}

// TestConflictKeySelectsTheRow: an ordinary table's conflict gives the
// record's key as Go values, in the PRIMARY KEY's order, that select
// exactly the app's row when bound as arguments, and its two values
// decode to what each device's row held, for keys and values that SQL
// text makes hard to read (quotes, commas, NUL bytes, empty and BLOB
// keys, integers beyond 2^53, -0.0, infinities, TEXT that is not UTF-8).
// Record stays the key as SQL text.
func TestConflictKeySelectsTheRow(t *testing.T) {
	remote := NewMemoryRemote()
	schema := `CREATE TABLE cells (i INTEGER NOT NULL, v, s TEXT NOT NULL, b BLOB NOT NULL, PRIMARY KEY (b, s, i))`
	a := rowsDevice(t, "dev-a", remote, schema, Table{Name: "cells"})
	b := rowsDevice(t, "dev-b", remote, schema, Table{Name: "cells"})
	keys := [][]any{
		{[]byte{0x00, 0xFF}, `it's "day", 1`, int64(-7)},
		{[]byte{}, `','`, int64(math.MinInt64)},
		{[]byte(",'"), `a','b',X'00'`, int64(1<<53 + 1)},
		{[]byte{0x00}, ``, int64(math.MaxInt64)},
		{[]byte("'"), `,`, int64(0)},
		{[]byte{0xFF}, "é ☃ 'q' \u2028 \\ \n", int64(-(1<<53 + 1))},
		{[]byte{0x00, 0x00}, `''`, int64(1)},
	}
	// Each row's value on a, then on b (b syncs later and wins).
	values := [][2]string{
		{`NULL`, `1e308`},
		{`9e999`, `-9e999`},
		{`-0.0`, `5e-324`},
		{`9223372036854775807`, `-9007199254740993`},
		{`'it''s "x",' || char(0) || 'y'`, `CAST(X'FF61' AS TEXT)`},
		{`X'00'`, `X''`},
		{`''`, `0.1`},
	}
	for _, k := range keys {
		a.exec(`INSERT INTO cells (b, s, i, v) VALUES (?, ?, ?, 'first')`, k...)
	}
	syncAll(t, a, b)
	for i, k := range keys {
		a.exec(`UPDATE cells SET v = `+values[i][0]+` WHERE b = ? AND s = ? AND i = ?`, k...)
		b.exec(`UPDATE cells SET v = `+values[i][1]+` WHERE b = ? AND s = ? AND i = ?`, k...)
	}
	// What each row holds, as the driver reads it, by its key's index.
	held := func(d *device, k []any) (key []any, v any) {
		t.Helper()
		rows, err := d.db.Query(`SELECT b, s, i, v FROM cells WHERE b = ? AND s = ? AND i = ?`, k...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			key = make([]any, 3)
			if err := rows.Scan(&key[0], &key[1], &key[2], &v); err != nil {
				t.Fatal(err)
			}
			n++
		}
		if err := rows.Err(); err != nil || n != 1 {
			t.Fatalf("%s: the key %#v selects %d rows (%v), want 1", d.name, k, n, err)
		}
		return key, v
	}
	var mine, theirs []any
	for _, k := range keys {
		_, v := held(a, k)
		mine = append(mine, v)
		_, v = held(b, k)
		theirs = append(theirs, v)
	}
	syncAll(t, a, b)
	cs := a.conflicts()
	if len(cs) != len(keys) {
		t.Fatalf("a logged %d conflicts, want %d: %+v", len(cs), len(keys), cs)
	}
	seen := map[int]bool{}
	for _, c := range cs {
		i := slices.IndexFunc(keys, func(k []any) bool { return sameValues(k, c.Key) })
		if i < 0 || seen[i] {
			t.Fatalf("conflict of record %s has Key %#v: no key of the table, or another conflict's", c.Record, c.Key)
		}
		seen[i] = true
		key, v := held(a, c.Key)
		if !sameValues(key, keys[i]) {
			t.Fatalf("Key %#v selects the row of %#v", c.Key, key)
		}
		var record string
		if err := a.db.QueryRow(`SELECT quote(b) || ',' || quote(s) || ',' || quote(i) FROM cells WHERE b = ? AND s = ? AND i = ?`, c.Key...).Scan(&record); err != nil || c.Record != record {
			t.Fatalf("Record %q, want the key as SQL text %q (%v)", c.Record, record, err)
		}
		loser, err := DecodeColumnValue(c.Loser)
		if err != nil || !sameValue(loser, mine[i]) {
			t.Fatalf("record %s: DecodeColumnValue(%s) = %#v, %v; want a's value %#v", c.Record, c.Loser, loser, err, mine[i])
		}
		winner, err := DecodeColumnValue(c.Winner)
		if err != nil || !sameValue(winner, theirs[i]) || !sameValue(winner, v) {
			t.Fatalf("record %s: DecodeColumnValue(%s) = %#v, %v; want b's value %#v, which the row holds (%#v)", c.Record, c.Winner, winner, err, theirs[i], v)
		}
	}
}

// TestConflictKeyUnknown: a logged record that this device cannot read
// as a key of its table, or of a table not registered, has no Key; the
// log still lists it.
func TestConflictKeyUnknown(t *testing.T) {
	a := rowsDevice(t, "dev-a", NewMemoryRemote(), `CREATE TABLE kv (k TEXT PRIMARY KEY, v)`, Table{Name: "kv"})
	for i, entry := range [][2]string{{"kv", "'open"}, {"kv", "7"}, {"gone", "'x'"}} {
		a.exec(`INSERT INTO sync_conflicts (table_name, record_id, path, loser, loser_version, loser_device, winner, winner_version, winner_device, detected_at)
VALUES (?1, ?2, '["v"]', '1', 1, 'x', '2', 2, 'y', ?3)`, entry[0], entry[1], fmt.Sprintf("2026-01-01T00:00:0%dZ", i))
	}
	cs := a.conflicts()
	if len(cs) != 3 {
		t.Fatalf("listed %d, want 3", len(cs))
	}
	for _, c := range cs {
		if c.Key != nil {
			t.Errorf("table %s, record %s: Key %#v, want nil", c.Table, c.Record, c.Key)
		}
	}
}

// TestDecodeColumnValueInvertsEncoding: every value a column can hold
// decodes from its JSON form to the value the engine read, bit for bit.
func TestDecodeColumnValueInvertsEncoding(t *testing.T) {
	for _, tc := range []struct {
		typ  string
		v    any
		json string
	}{
		{"null", nil, `["null"]`},
		{"integer", int64(0), `0`},
		{"integer", int64(-7), `-7`},
		{"integer", int64(1<<53 + 1), `9007199254740993`},
		{"integer", int64(math.MaxInt64), `9223372036854775807`},
		{"integer", int64(math.MinInt64), `-9223372036854775808`},
		{"real", 0.0, `0.0`},
		{"real", math.Copysign(0, -1), `-0.0`},
		{"real", 100.0, `100.0`},
		{"real", 0.1, `0.1`},
		{"real", 1e308, `1e+308`},
		{"real", -1e308, `-1e+308`},
		{"real", 5e-324, `5e-324`},
		{"real", float64(1<<53 + 2), `9.007199254740994e+15`},
		{"real", math.Inf(1), `["real","inf"]`},
		{"real", math.Inf(-1), `["real","-inf"]`},
		{"text", "", `""`},
		{"text", `it's "day", 1`, `"it's \"day\", 1"`},
		{"text", "a\x00b\n\u2028é", `"a\u0000b\n` + "\u2028é" + `"`},
		{"text", "\xff\xfe", `["text","//4="]`},
		{"blob", []byte{}, `["blob",""]`},
		{"blob", []byte{0x00, 0xFF}, `["blob","AP8="]`},
		{"blob", []byte("abc"), `["blob","YWJj"]`},
	} {
		enc, err := encodeValue(tc.typ, tc.v)
		if err != nil {
			t.Fatalf("encodeValue(%s, %#v): %v", tc.typ, tc.v, err)
		}
		raw := json.RawMessage(jsonv.Encode(enc))
		if string(raw) != tc.json {
			t.Errorf("%s %#v encodes as %s, want %s (the documented form)", tc.typ, tc.v, raw, tc.json)
		}
		got, err := DecodeColumnValue(raw)
		if err != nil || !sameValue(got, tc.v) {
			t.Errorf("DecodeColumnValue(%s) = %#v, %v; want %#v", raw, got, err, tc.v)
		}
	}
	// SQLite stores no NaN; the engine writes one as NULL.
	if enc, _ := encodeValue("real", math.NaN()); string(jsonv.Encode(enc)) != `["null"]` {
		t.Errorf("NaN encodes as %s", jsonv.Encode(enc))
	}
}

// TestDecodeColumnValueRefuses: JSON that is no column value's form is
// an error naming it, never a guess.
func TestDecodeColumnValueRefuses(t *testing.T) {
	for _, raw := range []string{``, `null`, `true`, `{}`, `{"a":1}`, `[]`, `["null",1]`, `["blob"]`, `["blob","!!"]`,
		`["real","nan"]`, `["real","Inf"]`, `["date","x"]`, `1e999`, `99999999999999999999`, `"open`, `1 2`} {
		got, err := DecodeColumnValue(json.RawMessage(raw))
		if err == nil {
			t.Errorf("DecodeColumnValue(%s) = %#v, want an error", raw, got)
			continue
		}
		if raw != "" && !strings.Contains(err.Error(), raw) {
			t.Errorf("DecodeColumnValue(%s): %v does not name the value", raw, err)
		}
	}
	if got, err := DecodeColumnValues(json.RawMessage(`{"a":1,"b":{"c":2}}`)); err == nil || !strings.Contains(err.Error(), "b") {
		t.Errorf("DecodeColumnValues of a nested object = %#v, %v; want an error naming column b", got, err)
	}
	if got, err := DecodeColumnValues(json.RawMessage(`"x"`)); err == nil {
		t.Errorf("DecodeColumnValues of a string = %#v, want an error", got)
	}
}

// arrivals keep versions as sorted, disjoint runs that are not adjacent,
// whatever the order they come in, and tell each kept one, only those, at
// or below before.
func TestArrivalsKeepRuns(t *testing.T) {
	for _, order := range [][]int64{
		{1, 2, 3, 7, 9, 8, 20, 5},
		{20, 9, 8, 7, 5, 3, 2, 1},
		{5, 1, 3, 2, 9, 7, 8, 20, 3, 8},
		{8, 20, 1, 7, 3, 5, 9, 2},
	} {
		a := newArrivals("me", 20, 30)
		for _, v := range order {
			a.addWrite(merge.Stamp{Version: v, Device: "x"})
		}
		a.addWrite(merge.Stamp{Version: 21, Device: "x"}) // above before: told by its version
		a.addWrite(merge.Stamp{Version: 4, Device: "y"})
		want := []versionRun{{1, 3}, {5, 5}, {7, 9}, {20, 20}}
		if got := a.runs["x"]; !slices.Equal(got, want) {
			t.Errorf("added %v: runs %v, want %v", order, got, want)
		}
		for v := range int64(23) {
			if got, want := a.has(merge.Stamp{Version: v, Device: "x"}), slices.Contains(order, v); got != want {
				t.Errorf("added %v: has(%d) = %v, want %v", order, v, got, want)
			}
		}
		if a.has(merge.Stamp{Version: 5, Device: "y"}) || !a.has(merge.Stamp{Version: 4, Device: "y"}) {
			t.Errorf("device y's versions: %v", a.runs["y"])
		}
	}
}

// A value is shown unless it reached the device in this sync: stamped
// above before, or kept. This device's own writes of this sync (above
// own) were its app's.
func TestArrivalsShown(t *testing.T) {
	a := newArrivals("me", 10, 15)
	a.addWrite(merge.Stamp{Version: 4, Device: "x"})
	for _, tc := range []struct {
		at   merge.Stamp
		want bool
	}{
		{merge.Stamp{Version: 3, Device: "x"}, true},
		{merge.Stamp{Version: 4, Device: "x"}, false},
		{merge.Stamp{Version: 4, Device: "y"}, true},
		{merge.Stamp{Version: 10, Device: "y"}, true},
		{merge.Stamp{Version: 11, Device: "y"}, false},
		{merge.Stamp{Version: 9, Device: "me"}, true},
		{merge.Stamp{Version: 12, Device: "me"}, false}, // another database under this id
		{merge.Stamp{Version: 16, Device: "me"}, true},
	} {
		if got := a.shown(tc.at); got != tc.want {
			t.Errorf("shown(%v) = %v, want %v", tc.at, got, tc.want)
		}
	}
	if !(*arrivals)(nil).shown(merge.Stamp{Version: 99, Device: "x"}) {
		t.Error("nil arrivals: a value is not shown")
	}
}

// A received state keeps, when it creates its record, every write it
// holds at or below before; merged into a record, those newer than what
// the record held where the state holds them. A new device keeps none,
// nor does a state whose oldest write is above before.
func TestArrivalsOfStates(t *testing.T) {
	type write struct {
		version int64
		patch   string
	}
	state := func(writes ...write) *merge.Node {
		n := &merge.Node{}
		for _, w := range writes {
			p, err := jsonv.ParseObject([]byte(w.patch), jsonv.Options{KeepNulls: true})
			if err != nil {
				t.Fatal(err)
			}
			n.ApplyPatch(p, merge.Stamp{Version: w.version, Device: "x"})
		}
		return n
	}
	// The record held writes 2 and 5; the state holds 2, 4 (stale at a,
	// where the record holds 5), 6 and 8.
	held := state(write{2, `{"a":1,"b":1,"c":1}`}, write{5, `{"a":3}`})
	o := state(write{2, `{"a":1,"b":1,"c":1}`}, write{4, `{"a":2}`}, write{6, `{"m":{"k":1}}`}, write{8, `{"b":null}`})
	data, clock := merge.EncodeState(o)
	c := fileChange{table: "notes", record: "r", patch: []byte(data), clock: []byte(clock), version: 8, device: "x", oldest: o.Oldest()}
	if c.oldest != 2 {
		t.Fatalf("Oldest() = %d, want 2", c.oldest)
	}
	kept := func(a *arrivals) (out []int64) {
		for v := range int64(10) {
			if a.has(merge.Stamp{Version: v, Device: "x"}) {
				out = append(out, v)
			}
		}
		return out
	}
	a := newArrivals("me", 6, 6)
	a.created(c)
	if got, want := kept(a), []int64{2, 4, 6}; !slices.Equal(got, want) {
		t.Errorf("created: kept %v, want %v", got, want)
	}
	a = newArrivals("me", 6, 6)
	a.placedBy(c, held, o)
	if got, want := kept(a), []int64{6}; !slices.Equal(got, want) {
		t.Errorf("placed: kept %v, want %v", got, want)
	}
	for _, before := range []int64{0, 1} { // a new device; no write late
		a = newArrivals("me", before, before)
		a.created(c)
		a.placedBy(c, held, o)
		if len(a.runs)+len(a.placed) != 0 {
			t.Errorf("before %d: kept %v %v", before, a.runs, a.placed)
		}
	}
}
