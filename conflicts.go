package drivesync

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// The conflict log. Last writer wins, per member path, on every device
// alike; what the winner overwrote is kept here, so that the app can show
// it and the user can bring it back.
//
// A received write overwrites a value concurrently when its writer had not
// seen that value. A write cannot tell that by its stamp (Lamport versions
// order writes, they do not say who saw what), so each write of a patch
// file says what it replaced: "seen" lists, for each path it writes, the
// stamp of the value its writer's synced state held there. A device that
// receives the write and held, at a path it overwrites, a value stamped
// above what the writer had seen there logs that value as the loser. A
// write over a value its writer had seen (a sequential edit) is not a
// conflict, nor is a write that changes nothing.
//
// Through a sync server a device receives merged states, not writes: the
// server keeps, for each path an engine's write set, what that write had
// seen there, and sends it with the state (ServerRecord.Seen), which the
// device checks the same way. A record a device gets through a snapshot
// or a merge file carries no such list, and is merged without a log
// entry.
//
// The loser must also be a value this device showed: one its synced state
// held before this sync (its app's rows showed that), or one its app
// wrote. One sync applies every file it receives in one transaction, so a
// value that reached the device in the sync and was overwritten within it
// (a device new to the store applies A's write and then B's concurrent
// write over it) never reached the app's rows: that conflict is the
// devices' that showed it. arrivals tells the two apart.

// MaxConflicts bounds the conflict log: past it, the oldest entries are
// dropped first.
const MaxConflicts = 1000

// maxSeen bounds a write's "seen" list; a longer one is left out, and
// readers then log nothing for that write. Readers take 64 KiB around a
// write's patch.
const maxSeen = 32 << 10

// A Conflict is a value this device showed (its synced state held it
// before the sync, or its app wrote it) that a concurrent write from
// another device overwrote, kept in the conflict log (sync_conflicts).
type Conflict struct {
	ID int64
	// Record is the record's id as the engine names it, which
	// ConflictFilter.Record selects by: a document's id, or an ordinary
	// table's key as SQL text, each key column's value as SQLite's
	// quote() writes it, joined by commas (X'00FF','it''s',-7). It comes
	// from other devices' files: bind Key in a query, never splice
	// Record into SQL.
	Table, Record string
	// Key is the record's key as Go values, in the order of the table's
	// PRIMARY KEY: int64 (INTEGER), string (TEXT) or []byte (BLOB); a
	// key never holds NULL or REAL. Bound as arguments it selects the
	// app's row: db.QueryRow("SELECT ... WHERE k1 = ? AND k2 = ?",
	// c.Key...) (the engine compares keys by BINARY: say k1 = ? COLLATE
	// BINARY where k1 declares another collation). A document's Key is
	// its id, a string. Key is nil for a table this Engine does not
	// sync, and for a record id that is no key of its table (a record
	// another device wrote that this table cannot hold, which Sync
	// reports in Report.Unwritten).
	Key []any
	// Path is the member path of the value in the record's content (an
	// ordinary table's column is one member; an append-only row in
	// conflict has an empty path: the whole row).
	Path []string
	// Loser is the value that was overwritten, Winner the value that
	// replaced it, as JSON (Winner is null when the write removed the
	// member). A document table's values are its content's JSON as the
	// app wrote it, kept as they are. An ordinary table's are one
	// column's value in the engine's typed form, which DecodeColumnValue
	// turns into the Go value; an append-only row's (Path empty) are an
	// object of its non-key columns' values, which DecodeColumnValues
	// decodes.
	Loser, Winner json.RawMessage
	// The stamps of the two writes: the version and the device that
	// made each.
	LoserVersion, WinnerVersion int64
	LoserDevice, WinnerDevice   string
	// At is when this device detected the conflict (its clock).
	At time.Time
}

// ConflictFilter selects conflicts; zero fields select all.
type ConflictFilter struct {
	Table, Record string
	Since         time.Time // detected at or after
	Limit         int       // at most this many, newest first
}

// A Resolution says which value of a conflict to keep.
type Resolution int

const (
	// KeepWinner dismisses the conflict: the winning value stays.
	KeepWinner Resolution = iota
	// KeepLoser writes the losing value back into the app's row as a new
	// edit, which the next Sync sends to the other devices.
	KeepLoser
)

// seenList returns the "seen" list of a write of patch over the synced
// state n: the stamp n holds at each path the patch writes, where n holds
// one. It returns nil if the list would exceed maxSeen.
func seenList(n *merge.Node, patch jsonv.Value) []byte {
	b := []byte{'['}
	var walk func(n *merge.Node, patch jsonv.Value, path []string) bool
	walk = func(n *merge.Node, patch jsonv.Value, path []string) bool {
		for _, m := range patch.Members {
			c := n.Child(m.Key, false)
			if c == nil {
				continue
			}
			p := append(path, m.Key)
			if !c.Stamp.IsZero() {
				if len(b) > 1 {
					b = append(b, ',')
				}
				b = append(b, "[["...)
				for i, k := range p {
					if i > 0 {
						b = append(b, ',')
					}
					b = jsonv.AppendString(b, k)
				}
				b = fmt.Appendf(b, "],%d,", c.Stamp.Version)
				b = jsonv.AppendString(b, c.Stamp.Device)
				b = append(b, ']')
				if len(b) > maxSeen {
					return false
				}
			}
			if m.Value.IsObject() && c.Kind == merge.ObjectNode && !walk(c, m.Value, p) {
				return false
			}
		}
		return true
	}
	if !walk(n, patch, nil) {
		return nil
	}
	return append(b, ']')
}

// parseSeen reads a write's "seen" list into stamps by path (see
// merge.PathKey). A list that cannot be read gives nil: nothing is
// logged for that write.
func parseSeen(raw []byte) map[string]merge.Stamp {
	seen, err := merge.ParseSeenList(raw)
	if err != nil {
		return nil
	}
	return seen
}

// overwritten is a value a received write may overwrite.
type overwritten struct {
	path  []string
	value jsonv.Value
	stamp merge.Stamp
	by    merge.Stamp // the write that would overwrite it
}

// overwrites returns the values of state n, a record shown on this device,
// at the paths patch writes, that its writer had not seen (see seen) and
// that this device showed (see arrivals): the candidates for the conflict
// log, before the write is merged.
func overwrites(n *merge.Node, patch jsonv.Value, seen map[string]merge.Stamp, at merge.Stamp, arrived *arrivals) []overwritten {
	var out []overwritten
	var walk func(n *merge.Node, patch jsonv.Value, path []string)
	walk = func(n *merge.Node, patch jsonv.Value, path []string) {
		for _, m := range patch.Members {
			c := n.Child(m.Key, false)
			if c == nil || c.Kind == merge.AbsentNode {
				continue // nothing held there to lose
			}
			p := append(path[:len(path):len(path)], m.Key)
			if m.Value.IsObject() && c.Kind == merge.ObjectNode {
				walk(c, m.Value, p)
				continue
			}
			if c.Stamp.Device == at.Device || !seen[merge.PathKey(p)].Less(c.Stamp) || !arrived.shown(c.Stamp) {
				continue // its writer's own value, one it had seen, or one this device never showed
			}
			v := jsonv.Value{Leaf: c.Leaf}
			if c.Kind == merge.ObjectNode {
				v = c.Value()
			}
			out = append(out, overwritten{path: p, value: v, stamp: c.Stamp, by: at})
		}
	}
	walk(n, patch, nil)
	return out
}

// stateOverwrites returns the values of state n, a record shown on this
// device, at the paths the writes listed in entries set, that those
// writes had not seen and this device showed: the candidates for the
// conflict log, before the server's state is merged. Each comes with its
// writer's stamp.
func (s *syncRun) stateOverwrites(n *merge.Node, entries []merge.SeenEntry, arrived *arrivals) []overwritten {
	var out []overwritten
	for _, e := range entries {
		if e.Writer.Device == s.e.deviceID {
			continue // this device's own write, back from the server
		}
		v, at, held := valueAt(n, e.Path)
		if !held || at.Device == e.Writer.Device || at == e.Writer || !e.Seen.Less(at) || !arrived.shown(at) {
			continue // nothing to lose, its writer's own value, one it had seen, or one this device never showed
		}
		out = append(out, overwritten{path: e.Path, value: v, stamp: at, by: e.Writer})
	}
	return out
}

// arrivals are the writes of other devices that a sync's commit has
// merged so far, as far as the conflict log needs them: it tells the
// values this device showed from those that reached it in this sync.
//
// Lamport versions do most of it: a value stamped above every version
// this device had seen or reserved when the sync began (before) reached
// it in this sync, unless this device's app wrote it (its own writes of
// this sync are stamped above own). A value stamped at or below before
// may have reached it in this sync too: a write another device made
// before it heard of this device's newest writes (it was offline, or its
// upload waited). Only those "late" writes are kept. A patch file's
// writes of one device have consecutive versions, so they are kept by
// device as runs of versions, about a run per file. A state (a snapshot's
// or a merge file's record, or the server's) keeps the late writes it
// places, one by one; its oldest version says whether it holds any, so
// that a state with none costs nothing, and a new device keeps nothing.
//
// A stamp names one write (see merge.Stamp), so a value whose stamp is
// kept reached the device in this sync. A write applied again (a file
// the ledger had forgotten) changes nothing and is not kept.
type arrivals struct {
	self        string // this device's id
	before, own int64
	runs        map[string][]versionRun // patch writes by device: sorted, disjoint, not adjacent
	placed      map[merge.Stamp]bool    // writes that states placed
}

// A versionRun is the versions first to last.
type versionRun struct{ first, last int64 }

// newArrivals returns the arrivals of a sync of device self that began
// with before the largest version it had seen or reserved, and that
// stamped its own changes above own.
func newArrivals(self string, before, own int64) *arrivals {
	return &arrivals{self: self, before: before, own: own, runs: map[string][]versionRun{}, placed: map[merge.Stamp]bool{}}
}

// shown reports whether this device showed the value stamped at: its
// synced state held it before this sync, or its app wrote it. A nil
// arrivals takes every value as shown.
func (a *arrivals) shown(at merge.Stamp) bool {
	switch {
	case a == nil:
		return true
	case at.Device == a.self && at.Version > a.own:
		return true // written by this device's app, sent in this sync
	case at.Version > a.before:
		return false
	}
	return !a.has(at)
}

// has reports whether the write stamped at is kept.
func (a *arrivals) has(at merge.Stamp) bool {
	if a.placed[at] {
		return true
	}
	runs := a.runs[at.Device]
	i, _ := slices.BinarySearchFunc(runs, at.Version, func(r versionRun, v int64) int { return cmp.Compare(r.last, v) })
	return i < len(runs) && runs[i].first <= at.Version
}

// late reports whether the write stamped at must be kept to be told
// apart: zero stamps, and those above before, need no keeping.
func (a *arrivals) late(at merge.Stamp) bool {
	return !at.IsZero() && at.Version <= a.before
}

// addWrite keeps the write of a patch file stamped at, which reached this
// device in this sync. A device's writes mostly come in the order of
// their versions: a run grows at its end.
func (a *arrivals) addWrite(at merge.Stamp) {
	if a == nil || !a.late(at) {
		return
	}
	v := at.Version
	runs := a.runs[at.Device]
	// The first run that holds v or ends right below it.
	i, _ := slices.BinarySearchFunc(runs, v-1, func(r versionRun, v int64) int { return cmp.Compare(r.last, v) })
	switch {
	case i == len(runs) || runs[i].first > v+1:
		runs = slices.Insert(runs, i, versionRun{v, v})
	case runs[i].first == v+1:
		runs[i].first = v
	case runs[i].last == v-1:
		runs[i].last = v
		if i+1 < len(runs) && runs[i+1].first == v+1 {
			runs[i].last = runs[i+1].last
			runs = slices.Delete(runs, i+1, i+2)
		}
	}
	a.runs[at.Device] = runs
}

// addPlaced keeps the write stamped at, which a state placed.
func (a *arrivals) addPlaced(at merge.Stamp) {
	if a.late(at) {
		a.placed[at] = true
	}
}

// created keeps the writes of c, a received change that gave its record
// its first state: all it holds reached this device in this sync.
func (a *arrivals) created(c fileChange) {
	switch {
	case a == nil:
	case c.clock == nil:
		a.addWrite(merge.Stamp{Version: c.version, Device: c.device})
	case c.oldest > a.before:
		// No write of it is late.
	default:
		if at, ok := merge.ParseFreshClock(c.clock); ok {
			a.addPlaced(at) // one write
		} else {
			merge.ClockStamps(c.clock, a.addPlaced) // validated when fetched
		}
	}
}

// placedBy keeps the writes of c's state o, received, that it places in
// n, the record's state it is about to be merged into: those newer than
// what n holds where o holds them. The rest of o (a server's state holds
// the whole record) n held already, or loses to what n holds: a stamp
// this device showed at one path must not be kept because o holds it,
// stale, at another.
func (a *arrivals) placedBy(c fileChange, n, o *merge.Node) {
	if a == nil || c.oldest > a.before {
		return // no write of it is late
	}
	var walk func(n, o *merge.Node)
	walk = func(n, o *merge.Node) {
		if n == nil || n.Stamp.Less(o.Stamp) {
			a.addPlaced(o.Stamp)
		}
		for _, k := range o.Kids {
			var nk *merge.Node
			if n != nil {
				nk = n.Child(k.Key, false)
			}
			walk(nk, k.Node)
		}
	}
	walk(n, o)
}

// valueAt returns n's value at path, and whether it holds one.
func valueAt(n *merge.Node, path []string) (jsonv.Value, merge.Stamp, bool) {
	for _, k := range path {
		if n = n.Child(k, false); n == nil {
			return jsonv.Value{}, merge.Stamp{}, false
		}
	}
	switch n.Kind {
	case merge.LeafNode:
		return jsonv.Value{Leaf: n.Leaf}, n.Stamp, true
	case merge.ObjectNode:
		return n.Value(), n.Stamp, true
	}
	return jsonv.Value{}, n.Stamp, false
}

// logConflicts logs the candidates of c's record that their writes, now
// merged into n, did overwrite: the value there is theirs now.
func (s *syncRun) logConflicts(ctx context.Context, c fileChange, n *merge.Node, cands []overwritten) error {
	for _, o := range cands {
		v, at, held := valueAt(n, o.path)
		if at != o.by || held && jsonv.Equal(v, o.value) {
			continue // the write lost there, or wrote the same value
		}
		winner := jsonv.Null
		if held {
			winner = v
		}
		if err := s.addConflict(ctx, c.table, c.record, o.path, o.value, o.stamp, winner, at); err != nil {
			return err
		}
	}
	return nil
}

// addConflict adds an entry to the log, dropping the oldest past
// MaxConflicts.
func (s *syncRun) addConflict(ctx context.Context, table, record string, path []string, loser jsonv.Value, loserAt merge.Stamp, winner jsonv.Value, winnerAt merge.Stamp) error {
	p, _ := json.Marshal(path)
	if path == nil {
		p = []byte("[]")
	}
	s.e.log.Info("drivesync: a concurrent write overwrote a value (logged in sync_conflicts)", "table", table, "record", record, "path", string(p), "winner", winnerAt.Device)
	err := s.exec(ctx, `INSERT INTO sync_conflicts (table_name, record_id, path, loser, loser_version, loser_device, winner, winner_version, winner_device, detected_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)`, table, record, string(p), string(jsonv.Encode(loser)), loserAt.Version, loserAt.Device,
		string(jsonv.Encode(winner)), winnerAt.Version, winnerAt.Device, time.Now().UTC().Format(time.RFC3339Nano))
	if err != nil {
		return &Error{Op: "log conflict", Table: table, Record: record, Err: err}
	}
	s.conflicts++
	return nil
}

// logImmutable logs an append-only row that holds another payload than
// received write c under the same key: the row is the loser, kept until
// the app resolves it (see ResolveConflict). It is logged once per write.
func (s *syncRun) logImmutable(ctx context.Context, t *tableInfo, c fileChange) error {
	var n int
	if err := s.queryRow(ctx, `SELECT count(*) FROM sync_conflicts WHERE table_name = ?1 AND record_id = ?2 AND path = '[]' AND winner_version = ?3 AND winner_device = ?4`,
		[]any{c.table, c.record, c.version, c.device}, &n); err != nil || n > 0 {
		return err
	}
	shown, ok, err := t.readRow(ctx, s, c.record)
	if err != nil || !ok {
		return err
	}
	mine, err := jsonv.ParseObject([]byte(shown), jsonv.Options{})
	if err != nil {
		return nil // not a row the log can show
	}
	theirs, err := jsonv.ParseObject(c.patch, jsonv.Options{})
	if err != nil {
		return nil
	}
	// The row was never sent: its stamp is this device's, version 0.
	return s.addConflict(ctx, c.table, c.record, nil, mine, merge.Stamp{Device: s.e.deviceID}, theirs, merge.Stamp{Version: c.version, Device: c.device})
}

// trimConflicts drops the oldest entries past MaxConflicts.
func (s *syncRun) trimConflicts(ctx context.Context) error {
	if s.conflicts == 0 {
		return nil
	}
	return s.exec(ctx, `DELETE FROM sync_conflicts WHERE id <= (SELECT id FROM sync_conflicts ORDER BY id DESC LIMIT 1 OFFSET ?1)`, MaxConflicts)
}

// Conflicts lists the conflict log, newest first.
func (e *Engine) Conflicts(ctx context.Context, f ConflictFilter) ([]Conflict, error) {
	q := `SELECT id, table_name, record_id, path, loser, loser_version, loser_device, winner, winner_version, winner_device, detected_at
FROM sync_conflicts WHERE (?1 = '' OR table_name = ?1) AND (?2 = '' OR record_id = ?2) AND detected_at >= ?3 ORDER BY id DESC`
	args := []any{f.Table, f.Record, ""}
	if !f.Since.IsZero() {
		args[2] = f.Since.UTC().Format(time.RFC3339Nano)
	}
	if f.Limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	rows, err := e.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, &Error{Op: "conflicts", Err: err}
	}
	defer rows.Close()
	var out []Conflict
	for rows.Next() {
		var c Conflict
		var path, loser, winner, at string
		if err := rows.Scan(&c.ID, &c.Table, &c.Record, &path, &loser, &c.LoserVersion, &c.LoserDevice, &winner, &c.WinnerVersion, &c.WinnerDevice, &at); err != nil {
			return nil, &Error{Op: "conflicts", Err: err}
		}
		json.Unmarshal([]byte(path), &c.Path)
		c.Key = e.recordKey(c.Table, c.Record)
		c.Loser, c.Winner = json.RawMessage(loser), json.RawMessage(winner)
		c.At, _ = time.Parse(time.RFC3339Nano, at)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, &Error{Op: "conflicts", Err: err}
	}
	return out, nil
}

// recordKey is the Key of a logged record (see Conflict.Key).
func (e *Engine) recordKey(table, record string) []any {
	t := e.tables[table]
	switch {
	case t == nil:
		return nil
	case !t.ordinary:
		return []any{record}
	}
	key, err := t.decodeKey(record)
	if err != nil {
		return nil
	}
	return key
}

// DecodeColumnValue returns the Go value of one column of an ordinary
// table from the JSON form the engine keeps it in, which a Conflict's
// Loser and Winner hold. It is the engine's own decoding, the inverse of
// how it encodes a value read from a row, so the value is the one the
// row held, bit for bit:
//
//	SQLite value      JSON form                           Go value
//	INTEGER           a number without '.' or 'e': -7     int64, all 64 bits
//	REAL              a number with '.' or 'e': 1.5,      float64
//	                  100.0, -0.0, 1e+308, 5e-324
//	REAL ±infinity    ["real","inf"], ["real","-inf"]     math.Inf(1), math.Inf(-1)
//	TEXT              a JSON string: "it's \"day\""       string
//	TEXT, not UTF-8   ["text","<base64>"]                 string of those bytes
//	BLOB              ["blob","<base64>"]                 []byte
//	NULL              ["null"]                            nil
//
// Base64 is the standard, padded alphabet (encoding/base64.StdEncoding).
// A REAL's number is the shortest text that reads back as the same
// float64. SQLite stores no NaN (it stores NULL), so no form holds one.
// The Go values are those database/sql binds, so a value can be written
// back as an argument (UPDATE t SET col = ? ...).
//
// Anything else is an error that names the JSON: JSON null (a write that
// removed the value), an object, a tag not listed above. Document
// tables' values are the app's own JSON, kept as written: read those
// with encoding/json, not with this.
func DecodeColumnValue(v json.RawMessage) (any, error) {
	parsed, err := jsonv.Parse(v, jsonv.Options{})
	if err != nil {
		return nil, fmt.Errorf("drivesync: %q is not JSON: %w", truncate(string(v), 40), err)
	}
	val, err := decodeValue(parsed)
	if err != nil {
		return nil, fmt.Errorf("drivesync: %w", err)
	}
	return val, nil
}

// DecodeColumnValues decodes a JSON object of an ordinary table's
// column values, by column name (see DecodeColumnValue): the Loser and
// Winner of an append-only row's conflict, which is the whole row's
// non-key columns.
func DecodeColumnValues(v json.RawMessage) (map[string]any, error) {
	parsed, err := jsonv.ParseObject(v, jsonv.Options{})
	if err != nil {
		return nil, fmt.Errorf("drivesync: %q is not a JSON object of column values: %w", truncate(string(v), 40), err)
	}
	out := make(map[string]any, len(parsed.Members))
	for _, m := range parsed.Members {
		val, err := decodeValue(m.Value)
		if err != nil {
			return nil, fmt.Errorf("drivesync: column %s: %w", m.Key, err)
		}
		out[m.Key] = val
	}
	return out, nil
}

// ErrNoConflict says that a conflict id is not in the log (resolved, or
// dropped past MaxConflicts).
var ErrNoConflict = errors.New("no such conflict in the log")

// ResolveConflict takes the conflict id out of the log. KeepLoser first
// writes its losing value back into the app's row at its path, as an edit
// of the app's (the next Sync sends it, and it wins over the value that
// had won); KeepWinner leaves the row as it is. An append-only row in
// conflict is kept with KeepLoser and replaced by the other devices' row
// with KeepWinner (the row is deleted, and the next Sync writes theirs).
func (e *Engine) ResolveConflict(ctx context.Context, id int64, keep Resolution) error {
	conn, err := e.db.Conn(ctx)
	if err != nil {
		return &Error{Op: "resolve conflict", Err: err}
	}
	defer conn.Close()
	if err := beginImmediate(ctx, conn); err != nil {
		return &Error{Op: "resolve conflict", Err: err}
	}
	err = e.resolve(ctx, conn, id, keep)
	if err == nil {
		_, err = conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		endTx(conn)
		if _, ok := err.(*Error); !ok {
			err = &Error{Op: "resolve conflict", Err: err}
		}
	}
	return err
}

func (e *Engine) resolve(ctx context.Context, conn *sql.Conn, id int64, keep Resolution) error {
	var table, record, path, loser string
	err := conn.QueryRowContext(ctx, `SELECT table_name, record_id, path, loser FROM sync_conflicts WHERE id = ?1`, id).Scan(&table, &record, &path, &loser)
	if errors.Is(err, sql.ErrNoRows) {
		return &Error{Op: "resolve conflict", Err: fmt.Errorf("%w: id %d", ErrNoConflict, id)}
	}
	if err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `DELETE FROM sync_conflicts WHERE id = ?1`, id); err != nil {
		return err
	}
	t := e.tables[table]
	fail := func(format string, args ...any) error {
		return &Error{Op: "resolve conflict", Table: table, Record: record, Err: fmt.Errorf(format, args...)}
	}
	var keys []string
	if err := json.Unmarshal([]byte(path), &keys); err != nil {
		return fail("the logged path is corrupt: %v", err)
	}
	switch {
	case t == nil:
		return fail("table %s is not registered", table)
	case t.appendOnly && keep == KeepWinner:
		// The app deletes its row, which the trigger allows for a record
		// in conflict; the next sync writes the other devices' row.
		key, err := t.decodeKey(record)
		if err != nil {
			return fail("the record's key cannot be read: %v", err)
		}
		_, err = conn.ExecContext(ctx, t.deleteSQL, key...)
		return err
	case keep == KeepWinner || t.appendOnly:
		return nil
	case keep != KeepLoser:
		return fail("unknown resolution %d", keep)
	}
	row, ok, err := t.readRow(ctx, direct{conn}, record)
	if err != nil {
		return err
	}
	if !ok {
		return fail("the record has no row any more (it was deleted since): nothing to restore the value into")
	}
	cur, err := jsonv.ParseObject([]byte(row), jsonv.Options{})
	if err != nil {
		return fail("the row's content is not a JSON object: %v", err)
	}
	v, err := jsonv.Parse([]byte(loser), jsonv.Options{})
	if err != nil {
		return fail("the logged value is corrupt: %v", err)
	}
	// The app's write: the capture trigger marks the record pending.
	return t.writeRow(ctx, direct{conn}, record, string(jsonv.Encode(setPath(cur, keys, v))))
}

// setPath returns obj with the member at path set to v, creating the
// objects on the way.
func setPath(obj jsonv.Value, path []string, v jsonv.Value) jsonv.Value {
	if len(path) == 0 {
		return v
	}
	members := append([]jsonv.Member(nil), obj.Members...)
	for i, m := range members {
		if m.Key == path[0] {
			inner := m.Value
			if !inner.IsObject() {
				inner = jsonv.Value{Members: []jsonv.Member{}}
			}
			members[i].Value = setPath(inner, path[1:], v)
			return jsonv.Value{Members: members}
		}
	}
	members = append(members, jsonv.Member{Key: path[0], Value: setPath(jsonv.Value{Members: []jsonv.Member{}}, path[1:], v)})
	sortMembers(members)
	return jsonv.Value{Members: members}
}
