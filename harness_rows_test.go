package drivesync

import (
	"database/sql"
	"errors"
	"fmt"

	"pgregory.net/rapid"
)

// The harness's notes table comes in two shapes. A document table (id,
// content JSON, the paths a, b, n.x, n.y and deleted_at as members), or,
// in a third of the schedules, an ordinary table: a composite key of a
// TEXT or BLOB column and an INTEGER, the paths as columns, b stored as a
// BLOB, and a path removed as NULL. The model is the same for both; these
// helpers are where the shapes differ.

const ordinaryNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	grp TEXT NOT NULL, num INTEGER NOT NULL,
	a TEXT, b BLOB, n_x TEXT, n_y TEXT, deleted_at TEXT,
	PRIMARY KEY (grp, num)
)`

// The strict variants: a and b NOT NULL, as strictNotesSchema's
// projections are (grp is ANY, since it holds BLOBs).
const strictOrdinaryNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	grp ANY NOT NULL, num INTEGER NOT NULL,
	a TEXT NOT NULL, b ANY NOT NULL, n_x TEXT, n_y TEXT, deleted_at TEXT,
	PRIMARY KEY (grp, num)
) STRICT`

const checkedStrictOrdinaryNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	grp ANY NOT NULL, num INTEGER NOT NULL,
	a TEXT NOT NULL, b ANY NOT NULL CHECK (CAST(b AS TEXT) NOT GLOB 'dev-[1-9]#*[357]' AND CAST(b AS TEXT) NOT GLOB 'dev-[1-9]#*[357]b'),
	n_x TEXT, n_y TEXT, deleted_at TEXT,
	PRIMARY KEY (grp, num)
) STRICT`

// ordinaryKeys are the keys of the harness's records in an ordinary
// table: text, a BLOB with a NUL byte, a quote in the text, a negative
// number.
var ordinaryKeys = map[string][]any{
	"r0": {"r", int64(0)},
	"r1": {"r", int64(1)},
	"r2": {[]byte("r\x00"), int64(2)},
	"r3": {"it's", int64(-3)},
}

// pathColumns are the columns of the paths in an ordinary table.
var pathColumns = map[string]string{"a": "a", "b": "b", "n.x": "n_x", "n.y": "n_y", "deleted_at": "deleted_at"}

func (w *world) notesSchema(dev string) string {
	switch {
	case w.ordinary && w.checked && dev == "dev-0":
		return checkedStrictOrdinaryNotesSchema
	case w.ordinary && w.strict:
		return strictOrdinaryNotesSchema
	case w.ordinary:
		return ordinaryNotesSchema
	case w.checked && dev == "dev-0":
		return checkedStrictNotesSchema
	case w.strict:
		return strictNotesSchema
	}
	return notesSchema
}

// recordID is the record id of harness record id in sync_states.
func (w *world) recordID(id string) string {
	if k, ok := ordinaryKeys[id]; w.ordinary && ok {
		return encodeKey(k)
	}
	return id
}

// harnessID is the harness record of a record id in sync_states.
func (w *world) harnessID(record string) string {
	if w.ordinary {
		for id, k := range ordinaryKeys {
			if encodeKey(k) == record {
				return id
			}
		}
	}
	return record
}

// keyOf is the SQL expression of the record id of notes row alias.
func (w *world) keyOf(alias string) string {
	if w.ordinary {
		return fmt.Sprintf("quote(%[1]s.grp) || ',' || quote(%[1]s.num)", alias)
	}
	return alias + ".id"
}

// where selects record id's row: the condition and its arguments.
func (w *world) where(id string) (string, []any) {
	if w.ordinary {
		k := ordinaryKeys[id]
		return "grp = ? AND num = ?", []any{k[0], k[1]}
	}
	return "id = ?", []any{id}
}

// row returns what a device's row of record id holds, as text the same
// for the same values (ok false: no row).
func (d *hdevice) row(rt *rapid.T, id string) (string, bool) {
	w := d.remote.w
	cond, args := w.where(id)
	q := `SELECT json(content) FROM notes WHERE ` + cond
	if w.ordinary {
		q = `SELECT quote(a) || ',' || quote(b) || ',' || quote(n_x) || ',' || quote(n_y) || ',' || quote(deleted_at) FROM notes WHERE ` + cond
	}
	var s string
	err := d.db.QueryRow(q, args...).Scan(&s)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false
	}
	if err != nil {
		rt.Fatal(err)
	}
	return s, true
}

// local reads a device's value of every path of a record ("" if absent
// or NULL).
func (d *hdevice) local(rt *rapid.T, id string) (map[string]string, bool) {
	w := d.remote.w
	out := map[string]string{}
	if w.ordinary {
		cond, args := w.where(id)
		var vals [5]sql.NullString
		err := d.db.QueryRow(`SELECT a, CAST(b AS TEXT), n_x, n_y, deleted_at FROM notes WHERE `+cond, args...).Scan(&vals[0], &vals[1], &vals[2], &vals[3], &vals[4])
		if errors.Is(err, sql.ErrNoRows) {
			return out, false
		}
		if err != nil {
			rt.Fatal(err)
		}
		for i, p := range harnessPaths {
			out[p] = vals[i].String
		}
		return out, true
	}
	content, ok := d.row(rt, id)
	if !ok {
		return out, false
	}
	for _, p := range harnessPaths {
		var v sql.NullString
		d.db.QueryRow(`SELECT json_extract(?, ?)`, content, "$."+p).Scan(&v)
		out[p] = v.String
	}
	return out, true
}

// create writes record id whole, with the values of val, and returns its
// row as row reads it.
func (d *hdevice) create(rt *rapid.T, id, val string) string {
	w := d.remote.w
	if !w.ordinary {
		content := fmt.Sprintf(`{"a":%q,"b":%q,"k":{%q:%q},"n":{"x":%q}}`, val+"a", val+"b", val, val+"k", val+"x")
		d.putNote(rt, id, content)
		return content
	}
	k := ordinaryKeys[id]
	if _, err := d.db.Exec(`INSERT INTO notes (grp, num, a, b, n_x, n_y, deleted_at) VALUES (?1, ?2, ?3, CAST(?4 AS BLOB), ?5, NULL, NULL)
ON CONFLICT (grp, num) DO UPDATE SET a = excluded.a, b = excluded.b, n_x = excluded.n_x, n_y = NULL, deleted_at = NULL`,
		k[0], k[1], val+"a", val+"b", val+"x"); err != nil {
		rt.Fatal(err)
	}
	row, _ := d.row(rt, id)
	return row
}

// setPath writes one path of record id.
func (d *hdevice) setPath(rt *rapid.T, id, path, val string) {
	w := d.remote.w
	if !w.ordinary {
		d.setNotePath(rt, id, "$."+path, val)
		return
	}
	cond, args := w.where(id)
	v := "?"
	if path == "b" {
		v = "CAST(? AS BLOB)"
	}
	if _, err := d.db.Exec(fmt.Sprintf(`UPDATE notes SET %s = %s WHERE %s`, pathColumns[path], v, cond), append([]any{val}, args...)...); err != nil {
		rt.Fatal(err)
	}
}

// remove deletes record id's row.
func (d *hdevice) remove(rt *rapid.T, id string) {
	cond, args := d.remote.w.where(id)
	if _, err := d.db.Exec(`DELETE FROM notes WHERE `+cond, args...); err != nil {
		rt.Fatal(err)
	}
}

// notesDump selects every row of notes in a fixed order, exactly.
func (w *world) notesDump() string {
	switch {
	case w.ordinary:
		return typedDump("notes", "grp", "num", "a", "b", "n_x", "n_y", "deleted_at")
	case w.strict:
		return `SELECT id, hex(content), quote(a), quote(b), quote(title), quote(display_order) FROM notes ORDER BY id`
	}
	return `SELECT id, hex(content), quote(title), quote(display_order) FROM notes ORDER BY id`
}
