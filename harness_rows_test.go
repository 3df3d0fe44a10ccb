package drivesync

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

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
	grp ANY NOT NULL, num ANY NOT NULL,
	a TEXT NOT NULL, b ANY NOT NULL, n_x TEXT, n_y TEXT, deleted_at TEXT,
	PRIMARY KEY (grp, num)
) STRICT`

const checkedStrictOrdinaryNotesSchema = `CREATE TABLE IF NOT EXISTS notes (
	grp ANY NOT NULL, num ANY NOT NULL,
	a TEXT NOT NULL, b ANY NOT NULL CHECK (CAST(b AS TEXT) NOT GLOB 'dev-[1-9]#*[357]' AND CAST(b AS TEXT) NOT GLOB 'dev-[1-9]#*[357]b'),
	n_x TEXT, n_y TEXT, deleted_at TEXT,
	PRIMARY KEY (grp, num)
) STRICT`

// ordinaryKeys are the keys of the harness's records in an ordinary
// table: text, the same text in another case, a BLOB with a NUL byte, a
// quote in the text, a negative number, and TEXT in the INTEGER column
// that its affinity keeps as TEXT.
var ordinaryKeys = map[string][]any{
	"r0": {"r", int64(0)},
	"r1": {"R", int64(0)}, // r0's key in another case
	"r2": {[]byte("r\x00"), "0x2"},
	"r3": {"it's", int64(-3)},
}

// pathColumns are the columns of the paths in an ordinary table.
var pathColumns = map[string]string{"a": "a", "b": "b", "n.x": "n_x", "n.y": "n_y", "deleted_at": "deleted_at"}

func (w *world) notesSchema(dev string) string {
	schema := w.shapeSchema(dev)
	if w.nocase {
		schema = strings.NewReplacer("grp TEXT NOT NULL", "grp TEXT COLLATE NOCASE NOT NULL", "grp ANY NOT NULL", "grp ANY COLLATE NOCASE NOT NULL",
			"PRIMARY KEY (grp, num)", "PRIMARY KEY (grp COLLATE binary, num)").Replace(schema)
	}
	return schema
}

// shapeSchema is notesSchema before w.nocase.
func (w *world) shapeSchema(dev string) string {
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
		return "grp = ? COLLATE BINARY AND num = ?", []any{k[0], k[1]}
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

// Every schedule also syncs three small ordinary tables with the other
// table options and constraints: gens, whose g only grows (MergeMax);
// facts, an append-only table whose keys are mostly each device's own,
// sometimes shared: written with the same payload by several devices (one
// record), or with different ones (a conflict each writer reports); and
// slots, three items on four places, one item to a place (UNIQUE), which
// the app moves and swaps: a device receives swaps and rotations that it
// can only write as a whole, and concurrent moves that put two items on
// one place, which every device refuses until the app moves one away
// (fixSlots). An app trigger counts each item's moves, skipping the
// engine's writes as the README asks.
const extraSchema = `CREATE TABLE IF NOT EXISTS gens (id TEXT PRIMARY KEY, g INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS facts (dev TEXT NOT NULL, n INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (dev, n));
CREATE TABLE IF NOT EXISTS slots (id TEXT PRIMARY KEY, pos INTEGER NOT NULL UNIQUE, moves INTEGER NOT NULL DEFAULT 0);
CREATE TRIGGER IF NOT EXISTS slots_moved AFTER UPDATE OF pos ON slots WHEN (SELECT is_syncing FROM sync_control) = 0
BEGIN UPDATE slots SET moves = moves + 1 WHERE id = NEW.id; END`

var extraTables = []Table{
	{Name: "gens", Merge: map[string]MergeRule{"g": MergeMax}},
	{Name: "facts", AppendOnly: true},
	{Name: "slots"},
}

// slotWrite places, moves, swaps or removes items of slots on d, as the
// app does: a swap takes three updates in one transaction, through a
// place no item holds.
func slotWrite(rt *rapid.T, d *hdevice, label string) {
	held := map[string]int64{} // item -> place
	taken := map[int64]bool{}
	rows, err := d.db.Query(`SELECT id, pos FROM slots`)
	if err != nil {
		rt.Fatal(err)
	}
	for rows.Next() {
		var id string
		var pos int64
		rows.Scan(&id, &pos)
		held[id], taken[pos] = pos, true
	}
	rows.Close()
	var free []int64
	for pos := range int64(4) {
		if !taken[pos] {
			free = append(free, pos)
		}
	}
	var placed, unplaced []string
	for _, id := range []string{"s0", "s1", "s2"} {
		if _, ok := held[id]; ok {
			placed = append(placed, id)
		} else {
			unplaced = append(unplaced, id)
		}
	}
	op := rapid.IntRange(0, 9).Draw(rt, label+"slotOp")
	switch {
	case len(unplaced) > 0 && len(free) > 0 && (op < 3 || len(placed) < 2):
		item := rapid.SampledFrom(unplaced).Draw(rt, label+"slot")
		to := rapid.SampledFrom(free).Draw(rt, label+"slotTo")
		d.exec(rt, `INSERT INTO slots (id, pos) VALUES (?1, ?2)`, item, to)
		count("write: slots, an item placed")
		rt.Logf("%s: slots %s placed at %d", d.name, item, to)
	case len(placed) == 0:
	case op == 3:
		item := rapid.SampledFrom(placed).Draw(rt, label+"slot")
		d.exec(rt, `DELETE FROM slots WHERE id = ?1`, item)
		count("write: slots, an item removed")
		rt.Logf("%s: slots %s removed", d.name, item)
	case op < 6 && len(free) > 0 || len(placed) == 1:
		item := rapid.SampledFrom(placed).Draw(rt, label+"slot")
		to := rapid.SampledFrom(free).Draw(rt, label+"slotTo")
		d.exec(rt, `UPDATE slots SET pos = ?2 WHERE id = ?1`, item, to)
		count("write: slots, an item moved")
		rt.Logf("%s: slots %s moved from %d to %d", d.name, item, held[item], to)
	default:
		item := rapid.SampledFrom(placed).Draw(rt, label+"slot")
		other := rapid.SampledFrom(slices.DeleteFunc(slices.Clone(placed), func(id string) bool { return id == item })).Draw(rt, label+"slotWith")
		tx, err := d.db.Begin()
		if err != nil {
			rt.Fatal(err)
		}
		for _, step := range [][2]any{{item, -1}, {other, held[item]}, {item, held[other]}} {
			if _, err := tx.Exec(`UPDATE slots SET pos = ?2 WHERE id = ?1`, step[0], step[1]); err != nil {
				rt.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			rt.Fatal(err)
		}
		count("write: slots, two items swapped")
		rt.Logf("%s: slots %s and %s swapped (%d, %d)", d.name, item, other, held[item], held[other])
	}
}

func (d *hdevice) exec(rt *rapid.T, query string, args ...any) {
	if _, err := d.db.Exec(query, args...); err != nil {
		rt.Fatal(err)
	}
}

// fixSlots is the app moving away, on each device, the items that the
// device's slots refused: items that concurrent moves put on one place.
// Each goes to a place of its own, past the four. It reports whether
// anything moved.
func fixSlots(rt *rapid.T, devs []*hdevice) bool {
	moved := false
	for _, d := range devs {
		for _, record := range d.unwritten(rt, "slots") {
			d.seq++
			n, _ := strconv.Atoi(strings.TrimPrefix(d.name, "dev-"))
			to := 1000*(n+1) + d.seq          // no other item's place
			item := strings.Trim(record, "'") // the record id of a TEXT key is its SQL literal
			d.exec(rt, `INSERT INTO slots (id, pos) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET pos = excluded.pos`, item, to)
			count("quiesce: an item two devices put on one place, moved away")
			rt.Logf("%s: slots %s moved to %d: the table refused it", d.name, item, to)
			moved = true
		}
	}
	return moved
}

type factKey struct {
	dev string
	n   int
}

// extraModel is what the schedule wrote to gens and facts.
type extraModel struct {
	facts map[factKey]map[string]string // key -> writing device -> payload
}

// extraWrite writes gens or facts on d.
func (m *model) extraWrite(rt *rapid.T, d *hdevice, label string, facts bool) {
	d.seq++
	val := fmt.Sprintf("%s#%d", d.name, d.seq)
	if !facts {
		id := rapid.SampledFrom([]string{"g0", "g1"}).Draw(rt, label+"gen")
		g := rapid.IntRange(0, 1000).Draw(rt, label+"g")
		if _, err := d.db.Exec(`INSERT INTO gens VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET g = excluded.g`, id, g); err != nil {
			rt.Fatal(err)
		}
		count("write: a MergeMax column")
		rt.Logf("%s: gens %s = %d", d.name, id, g)
		return
	}
	if rapid.IntRange(0, 7).Draw(rt, label+"factBurst") == 0 {
		m.factBurst(rt, d, rapid.IntRange(65, 300).Draw(rt, label+"facts"))
		return
	}
	key := factKey{d.name, d.seq}
	payload := val
	if k := rapid.IntRange(0, 5).Draw(rt, label+"fact"); k < 3 {
		key = factKey{"shared", k}
		if rapid.Bool().Draw(rt, label+"samePayload") {
			payload = fmt.Sprintf("same-%d", k)
		}
	}
	res, err := d.db.Exec(`INSERT INTO facts VALUES (?1, ?2, CAST(?3 AS BLOB)) ON CONFLICT DO NOTHING`, key.dev, key.n, payload)
	if err != nil {
		rt.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if m.extra.facts[key] == nil {
			m.extra.facts[key] = map[string]string{}
		}
		m.extra.facts[key][d.name] = payload
		count("write: an append-only row")
		rt.Logf("%s: facts %v = %s", d.name, key, payload)
	}
}

// factBurst writes n facts of d's own in one transaction: a sync then
// reads more rows of one table than one statement looks up (see
// lookupSQL) and than one batch reads ahead (see readAhead). A row the
// reading missed would stay unsent, and one it took for another would
// reach the other devices with another's payload: checkExtra finds both.
func (m *model) factBurst(rt *rapid.T, d *hdevice, n int) {
	tx, err := d.db.Begin()
	if err != nil {
		rt.Fatal(err)
	}
	defer tx.Rollback()
	for range n {
		d.seq++
		key, payload := factKey{d.name, d.seq}, fmt.Sprintf("%s#%d", d.name, d.seq)
		if _, err := tx.Exec(`INSERT INTO facts VALUES (?1, ?2, CAST(?3 AS BLOB))`, key.dev, key.n, payload); err != nil {
			rt.Fatal(err)
		}
		m.extra.facts[key] = map[string]string{d.name: payload}
	}
	if err := tx.Commit(); err != nil {
		rt.Fatal(err)
	}
	count("write: a burst of append-only rows")
	rt.Logf("%s: %d facts, up to %s#%d", d.name, n, d.name, d.seq)
}

// checkGens checks, after a sync of d that succeeded, that no value of
// gens went back from what d showed after its syncs before.
func (d *hdevice) checkGens(rt *rapid.T) {
	// A row the app wrote since (pending) shows the app's value, which
	// may be below: checked once a sync sends it.
	rows, err := d.db.Query(`SELECT id, g FROM gens WHERE NOT EXISTS (SELECT 1 FROM ` + pendingUnion + ` p
	WHERE p.table_name = 'gens' AND p.record_id = quote(gens.id))`)
	if err != nil {
		rt.Fatal(err)
	}
	defer rows.Close()
	w := d.remote.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gens[d.name] == nil {
		w.gens[d.name] = map[string]int64{}
	}
	for rows.Next() {
		var id string
		var g int64
		rows.Scan(&id, &g)
		if g < w.gens[d.name][id] {
			rt.Fatalf("%s: gens %s went back from %d to %d: a MergeMax value lost", d.name, id, w.gens[d.name][id], g)
		}
		w.gens[d.name][id] = g
		count("MergeMax values checked after a sync")
	}
}

// checkExtra checks gens and facts at quiescence: every device shows the
// same gens, none below a value a device showed after a sync; every fact
// is on every device, a shared key written with one payload as one
// record; a key written with different payloads stays each writer's own,
// and a device holding another payload than the synced one reports it.
func checkExtra(rt *rapid.T, devs []*hdevice, m *model) {
	gens := `SELECT quote(id) || '=' || quote(g) FROM gens ORDER BY id`
	want := devs[0].rowsOf(rt, gens)
	for _, d := range devs {
		if got := d.rowsOf(rt, gens); got != want {
			rt.Fatalf("%s: gens %q, want %q", d.name, got, want)
		}
		w := d.remote.w
		for id, g := range w.gens[d.name] {
			var final int64
			devs[0].db.QueryRow(`SELECT g FROM gens WHERE id = ?`, id).Scan(&final)
			if final < g {
				rt.Fatalf("gens %s = %d at quiescence, below the %d %s showed after a sync", id, final, g, d.name)
			}
		}
	}
	// must: devices that must report a conflict: they hold a payload
	// other than the synced one. may: devices holding the synced payload
	// of a key in conflict: they report it if they held their row when
	// another payload reached them in a patch file, not if it reached
	// them only as the synced record of a snapshot.
	must, may := map[string]bool{}, map[string]bool{}
	for key, writers := range m.extra.facts {
		payloads := map[string]bool{}
		for _, p := range writers {
			payloads[p] = true
		}
		if len(payloads) > 1 {
			for _, d := range devs {
				may[d.name] = true
			}
		}
		for _, d := range devs {
			var got sql.NullString
			d.db.QueryRow(`SELECT CAST(payload AS TEXT) FROM facts WHERE dev = ? AND n = ?`, key.dev, key.n).Scan(&got)
			var synced sql.NullString
			d.db.QueryRow(`SELECT json_extract(record_data, '$.payload[1]') FROM sync_states WHERE table_name = 'facts' AND record_id = ?`, encodeKey([]any{key.dev, int64(key.n)})).Scan(&synced)
			mine, wrote := writers[d.name]
			switch {
			case !got.Valid:
				rt.Fatalf("%s: lost append-only row %v (written by %v)", d.name, key, writers)
			case wrote && got.String != mine:
				rt.Fatalf("%s: append-only row %v = %q, want its own %q", d.name, key, got.String, mine)
			case !payloads[got.String]:
				rt.Fatalf("%s: append-only row %v = %q, which no device wrote (%v)", d.name, key, got.String, writers)
			case base64Of(got.String) != synced.String:
				must[d.name] = true
				count("append-only rows kept against another device's payload")
			}
			if len(payloads) == 1 {
				count("append-only rows checked")
			}
		}
	}
	for _, d := range devs {
		r, err := d.eng.Sync(context.Background())
		if err != nil {
			rt.Fatal(err)
		}
		reported := false
		for _, u := range r.Unwritten {
			if errors.Is(u.Err, ErrImmutableConflict) {
				reported = true
			}
		}
		if must[d.name] && !reported || reported && !may[d.name] {
			rt.Fatalf("%s: reports conflicts %v (Unwritten %v); must report: %v, may: %v", d.name, reported, r.Unwritten, must[d.name], may[d.name])
		}
		if reported {
			count("append-only conflicts reported at quiescence")
		}
	}
}

func base64Of(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// rowsOf returns a query's rows as text.
func (d *hdevice) rowsOf(rt *rapid.T, query string) string {
	rows, err := d.db.Query(query)
	if err != nil {
		rt.Fatal(err)
	}
	defer rows.Close()
	var b []byte
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rt.Fatal(err)
		}
		b = append(b, s...)
		b = append(b, '\n')
	}
	return string(b)
}
