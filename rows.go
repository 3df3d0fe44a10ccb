package drivesync

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// The app's rows, of either table shape.
//
// A document table (id TEXT PRIMARY KEY, content JSON) stores a record
// as its content object. An ordinary table (any declared primary key, no
// content column) stores it as the row's columns; the engine sees the
// same record through the same object: one member per non-key column,
// named after it, so that the merge, the stamps, the files and the
// snapshots are the same code for both shapes, and each column merges on
// its own (last writer wins per column, as per member path for
// documents).
//
// Column values are typed, and must come back bit for bit on every
// device, so each has one JSON form:
//
//	TEXT     a string: "abc"
//	INTEGER  a number without fraction or exponent: 42
//	REAL     a number with one: 1.5, 100.0, 1e+300 (the shortest text
//	         that reads back as the same float64)
//	NULL     ["null"]
//	BLOB     ["blob", "<base64>"]
//	others   ["real", "inf"], ["real", "-inf"], and ["text", "<base64>"]
//	         for TEXT that is not valid UTF-8
//
// Arrays are leaves of the merge, replaced whole, so a tagged value is
// one value. NULL is a value: a column set to NULL holds ["null"], and a
// column never written has no member (a row written from such a record
// takes the column's default).
//
// The record id of an ordinary row is its key, each key column's value
// as SQLite's quote() writes it, joined by commas: 'abc',3 or X'0A0B'.
// The INTEGER 1 and the TEXT '1' are different keys. The capture triggers
// compute it in SQL; the engine decodes it to bind the key's values as
// parameters. A key column holding NULL or REAL, or TEXT with a NUL
// character, has no such id: the triggers refuse the app's statement.
//
// Columns a device's table lacks (a newer app version added them) keep
// their values in the record's synced state: a row is read and written
// through its own columns only, and its edits are taken against the
// state's values of those columns alone.

// runner runs the engine's statements: the sync's prepared statements, or
// a plain connection (direct) outside a sync.
type runner interface {
	exec(ctx context.Context, query string, args ...any) error
	execCount(ctx context.Context, query string, args ...any) (int64, error)
	queryRow(ctx context.Context, query string, args []any, dest ...any) error
}

type direct struct{ q querier }

func (d direct) exec(ctx context.Context, query string, args ...any) error {
	_, err := d.q.ExecContext(ctx, query, args...)
	return err
}

func (d direct) execCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := d.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// writeOne runs a write of the engine that must change one row of the
// app's table t, the row of record id. A BEFORE trigger of the app that
// raises IGNORE skips it without an error: that is the table refusing the
// row (reported, and tried again at every sync), not a write.
func (t *tableInfo) writeOne(ctx context.Context, r runner, id, query string, args ...any) error {
	n, err := r.execCount(ctx, query, args...)
	if err == nil && n == 0 {
		return rowErrorf("table %s, record %s: a trigger of the table skipped the write (RAISE(IGNORE)); the row keeps what it showed", t.name, id)
	}
	return err
}

func (d direct) queryRow(ctx context.Context, query string, args []any, dest ...any) error {
	return d.q.QueryRowContext(ctx, query, args...).Scan(dest...)
}

// rowError is a record that cannot be a row of its table at all (a key or
// value another device wrote that this table's shape cannot hold), or an
// append-only row in conflict (err: ErrImmutableConflict). It is reported
// as an unwritten row, as a row the table's constraints refuse, and never
// fails a sync.
type rowError struct {
	msg string
	err error
}

func (e *rowError) Error() string { return e.msg }
func (e *rowError) Unwrap() error { return e.err }

func rowErrorf(format string, args ...any) error { return &rowError{msg: fmt.Sprintf(format, args...)} }

// keyExpr is the SQL expression of the record id of row r (NEW, OLD or a
// table alias).
func (t *tableInfo) keyExpr(r string) string {
	if !t.ordinary {
		return r + ".id"
	}
	parts := make([]string, len(t.keys))
	for i, k := range t.keys {
		parts[i] = fmt.Sprintf("quote(%s.%s)", r, quoteIdent(k))
	}
	return strings.Join(parts, " || ',' || ")
}

// badKey is the SQL condition that row r's key has no record id.
func (t *tableInfo) badKey(r string) string {
	conds := make([]string, len(t.keys))
	for i, k := range t.keys {
		conds[i] = badKeyColumn(r, k)
	}
	return "(" + strings.Join(conds, " OR ") + ")"
}

// badKeyColumn is the SQL condition that key column k of row r holds no
// part of a record id.
func badKeyColumn(r, k string) string {
	// Not typeof(...) NOT IN (...): a trigger builds an IN list's table
	// again at each row it fires for, which cost an insert into an
	// ordinary table as much as the insert itself.
	return fmt.Sprintf("%[1]s IS NULL OR typeof(%[1]s) = 'real' OR typeof(%[1]s) = 'text' AND instr(%[1]s, char(0)) > 0", r+"."+quoteIdent(k))
}

// keyChecked is the SQL expression that is expr, the record id of row r,
// when r's key has one, and otherwise raises the error that refuses the
// app's statement, naming the key column at fault.
func (t *tableInfo) keyChecked(r, expr string) string {
	var b strings.Builder
	b.WriteString("CASE")
	for _, k := range t.keys {
		msg := fmt.Sprintf("drivesync: table %s: key column %s must hold TEXT (without NUL characters), INTEGER or BLOB values, never NULL or REAL: devices find a record by its key", t.name, k)
		fmt.Fprintf(&b, " WHEN %s THEN RAISE(ABORT, %s)", badKeyColumn(r, k), quoteString(msg))
	}
	fmt.Fprintf(&b, " ELSE %s END", expr)
	return b.String()
}

// decodeKey returns the values of record id's key columns, or a rowError.
func (t *tableInfo) decodeKey(id string) ([]any, error) {
	notKey := func() ([]any, error) {
		return nil, rowErrorf("record id %q is not a key of table %s (%s)", id, t.name, strings.Join(t.keys, ", "))
	}
	vals := make([]any, 0, len(t.keys))
	rest := id
	for i := range t.keys {
		if i > 0 {
			var ok bool
			if rest, ok = strings.CutPrefix(rest, ","); !ok {
				return notKey()
			}
		}
		v, n, ok := quotedValue(rest)
		if !ok {
			return notKey()
		}
		vals = append(vals, v)
		rest = rest[n:]
	}
	if rest != "" || encodeKey(vals) != id {
		return notKey()
	}
	// A value the key column's affinity would convert ('0' in an INTEGER
	// column, 7 in a TEXT one) is no key a row of this table can have: it
	// would be the row of another record.
	for i, v := range vals {
		s, isText := v.(string)
		_, isInt := v.(int64)
		if isText && strings.IndexByte(s, 0) >= 0 {
			// The capture triggers refuse such a key (see badKey).
			return nil, rowErrorf("record id %q is not a key of table %s: %s holds a NUL character", id, t.name, t.keys[i])
		}
		switch t.keyTypes[i] {
		case 'i':
			if isText && numericText.MatchString(s) {
				return nil, rowErrorf("record id %q is not a key of table %s: %s is %q, a number as text, which column %s stores as a number", id, t.name, t.keys[i], s, t.keys[i])
			}
		case 't':
			if isInt {
				return nil, rowErrorf("record id %q is not a key of table %s: %s is the integer %d, which column %s stores as text", id, t.name, t.keys[i], v, t.keys[i])
			}
		}
	}
	return vals, nil
}

// numericText matches the TEXT that a column of INTEGER or NUMERIC
// affinity stores as a number: a decimal integer or real, with ASCII
// spaces around it ('infinity', '0x10' and a no-break space stay TEXT).
var numericText = regexp.MustCompile(`^[ \t\n\f\r\v]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\n\f\r\v]*$`)

// quotedValue reads one value as quote() writes it at the start of s: a
// string, a blob or an integer, and the bytes it took.
func quotedValue(s string) (any, int, bool) {
	switch {
	case strings.HasPrefix(s, "'"):
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '\'' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '\'' {
				b.WriteByte('\'')
				i++
				continue
			}
			return b.String(), i + 1, true
		}
		return nil, 0, false
	case strings.HasPrefix(s, "X'"):
		end := strings.IndexByte(s[2:], '\'')
		if end < 0 || end%2 != 0 {
			return nil, 0, false
		}
		b := make([]byte, end/2)
		for i := range b {
			v, err := strconv.ParseUint(s[2+2*i:4+2*i], 16, 8)
			if err != nil {
				return nil, 0, false
			}
			b[i] = byte(v)
		}
		return b, end + 3, true
	default:
		end := 0
		for end < len(s) && (s[end] == '-' && end == 0 || s[end] >= '0' && s[end] <= '9') {
			end++
		}
		v, err := strconv.ParseInt(s[:end], 10, 64)
		if err != nil {
			return nil, 0, false
		}
		return v, end, true
	}
}

// encodeKey is the record id of key values, as the triggers write it.
func encodeKey(vals []any) string {
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		switch v := v.(type) {
		case string:
			b.WriteString("'" + strings.ReplaceAll(v, "'", "''") + "'")
		case []byte:
			fmt.Fprintf(&b, "X'%X'", v)
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		}
	}
	return b.String()
}

// encodeValue returns the JSON form of a column value of SQLite type typ
// ("integer", "real", "text", "blob" or "null") as a driver returned it.
func encodeValue(typ string, v any) (jsonv.Value, error) {
	leaf := func(s string) (jsonv.Value, error) { return jsonv.Value{Leaf: []byte(s)}, nil }
	tagged := func(tag string, b []byte) (jsonv.Value, error) {
		return leaf(`["` + tag + `","` + base64.StdEncoding.EncodeToString(b) + `"]`)
	}
	switch typ {
	case "null":
		return leaf(`["null"]`)
	case "integer":
		if i, ok := v.(int64); ok {
			return leaf(strconv.FormatInt(i, 10))
		}
	case "real":
		if f, ok := v.(float64); ok {
			switch {
			case math.IsInf(f, 1):
				return leaf(`["real","inf"]`)
			case math.IsInf(f, -1):
				return leaf(`["real","-inf"]`)
			case math.IsNaN(f): // SQLite stores no NaN; a driver would not return one
				return leaf(`["null"]`)
			}
			s := strconv.FormatFloat(f, 'g', -1, 64)
			if !strings.ContainsAny(s, ".e") {
				s += ".0"
			}
			return leaf(s)
		}
	case "text":
		var s string
		switch v := v.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		default:
			return jsonv.Value{}, fmt.Errorf("a TEXT value read as %T", v)
		}
		if !utf8.ValidString(s) {
			return tagged("text", []byte(s))
		}
		return jsonv.Value{Leaf: jsonv.AppendString(nil, s)}, nil
	case "blob":
		switch v := v.(type) {
		case []byte:
			return tagged("blob", v)
		case string:
			return tagged("blob", []byte(v))
		}
	}
	return jsonv.Value{}, fmt.Errorf("a %s value read as %T", strings.ToUpper(typ), v)
}

// decodeValue returns the value to bind for the JSON form v of a column
// value: int64, float64, string, []byte or nil.
func decodeValue(v jsonv.Value) (any, error) {
	bad := func() (any, error) {
		return nil, fmt.Errorf("%s is not a column value (a string, a number, [\"null\"] or a tagged [\"blob\",…])", truncate(string(jsonv.Encode(v)), 40))
	}
	if v.IsObject() || len(v.Leaf) == 0 {
		return bad()
	}
	switch c := v.Leaf[0]; {
	case c == '"':
		s, ok := v.String()
		if !ok {
			return bad()
		}
		return s, nil
	case c == '-' || c >= '0' && c <= '9':
		text := string(v.Leaf)
		if strings.ContainsAny(text, ".eE") {
			f, err := strconv.ParseFloat(text, 64)
			if err != nil || math.IsInf(f, 0) {
				return bad()
			}
			return f, nil
		}
		i, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return bad()
		}
		return i, nil
	case c == '[':
		elems, err := jsonv.ParseArray(v.Leaf, jsonv.Options{})
		if err != nil || len(elems) == 0 {
			return bad()
		}
		tag, _ := elems[0].String()
		var arg string
		if len(elems) == 2 {
			arg, _ = elems[1].String()
		}
		switch {
		case tag == "null" && len(elems) == 1:
			return nil, nil
		case tag == "real" && len(elems) == 2 && arg == "inf":
			return math.Inf(1), nil
		case tag == "real" && len(elems) == 2 && arg == "-inf":
			return math.Inf(-1), nil
		case (tag == "blob" || tag == "text") && len(elems) == 2:
			b, err := base64.StdEncoding.Strict().DecodeString(arg)
			if err != nil {
				return bad()
			}
			if tag == "text" {
				return string(b), nil
			}
			return b, nil
		}
	}
	return bad()
}

// readRow returns the record the app's row of record id holds, as
// canonical JSON text (ok false: no row).
func (t *tableInfo) readRow(ctx context.Context, r runner, id string) (text string, ok bool, err error) {
	if !t.ordinary {
		err = r.queryRow(ctx, t.readSQL, []any{id}, &text)
		if errors.Is(err, sql.ErrNoRows) {
			return "", false, nil
		}
		return text, err == nil, err
	}
	key, err := t.decodeKey(id)
	if err != nil {
		return "", false, nil // no row of this table can have it
	}
	return t.readKey(ctx, r, key)
}

// readKey is readRow for an ordinary table's row of key, decoded.
func (t *tableInfo) readKey(ctx context.Context, r runner, key []any) (text string, ok bool, err error) {
	return t.readKeyBy(func(dest ...any) error { return r.queryRow(ctx, t.readSQL, key, dest...) })
}

// readKeyBy is readKey, running readSQL through query.
func (t *tableInfo) readKeyBy(query func(dest ...any) error) (text string, ok bool, err error) {
	vals := make([]any, 2*len(t.fields)+1)
	dest := make([]any, len(vals))
	for i := range vals {
		dest[i] = &vals[i]
	}
	err = query(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	v, err := t.rowValue(vals[1:])
	if err != nil {
		return "", false, err
	}
	return string(jsonv.Encode(v)), true, nil
}

// rowValue is the record an ordinary row holds, from the pairs (typeof,
// value) of its non-key columns that readSQL selects.
func (t *tableInfo) rowValue(vals []any) (jsonv.Value, error) {
	v := jsonv.Value{Members: make([]jsonv.Member, 0, len(t.fields))}
	for i, col := range t.fields {
		typ, _ := vals[2*i].(string)
		if b, ok := vals[2*i].([]byte); ok {
			typ = string(b)
		}
		cv, err := encodeValue(typ, vals[2*i+1])
		if err != nil {
			return jsonv.Value{}, fmt.Errorf("column %s: %w", col, err)
		}
		v.Members = append(v.Members, jsonv.Member{Key: col, Value: cv})
	}
	sortMembers(v.Members)
	return v, nil
}

// writeRow makes the app's row of record id hold content (canonical JSON
// text of an object): a document's content and projections, or an
// ordinary row's columns that content has (a column it lacks keeps its
// value, or takes its default in a new row).
func (t *tableInfo) writeRow(ctx context.Context, r runner, id, content string) error {
	return t.writeParsed(ctx, r, id, content, nil)
}

// A parsedRow is what writing an ordinary row takes from a record,
// worked out ahead of the write (see Engine.parseAhead).
type parsedRow struct {
	v    jsonv.Value // the record
	key  []any       // its key's values
	cols []string    // the columns the write sets
	args []any       // the key's values, then the columns'
	err  error       // why the record is no row of the table (see columnArgs)
}

// parseRow works out the parsedRow of the record id with content; an id
// that is no key, or content that is no JSON object, fails it.
func (t *tableInfo) parseRow(id string, content []byte) (*parsedRow, error) {
	key, err := t.decodeKey(id)
	if err != nil {
		return nil, err
	}
	v, err := jsonv.ParseObject(content, jsonv.Options{})
	if err != nil {
		return nil, rowErrorf("table %s, record %s: %v", t.name, id, err)
	}
	return t.parsed(id, key, v), nil
}

// parsed returns the parsedRow of record v of record id (key: its key's
// values).
func (t *tableInfo) parsed(id string, key []any, v jsonv.Value) *parsedRow {
	p := &parsedRow{v: v, key: key}
	p.cols, p.args, p.err = t.columnArgs(id, key, v)
	return p
}

// writeParsed is writeRow; parsed, if not nil, is content's parsedRow,
// worked out ahead.
func (t *tableInfo) writeParsed(ctx context.Context, r runner, id, content string, parsed *parsedRow) error {
	if !t.ordinary {
		return t.writeOne(ctx, r, id, t.upsertSQL, id, content)
	}
	if parsed == nil {
		var err error
		if parsed, err = t.parseRow(id, []byte(content)); err != nil {
			return err
		}
	}
	if t.appendOnly {
		if written, err := t.keepImmutable(ctx, r, id, parsed.v); written || err != nil {
			return err
		}
		if err := t.upsertParsed(ctx, r, id, parsed); err != nil {
			return err // refused: not placed
		}
		return t.place(ctx, r, id)
	}
	return t.upsertParsed(ctx, r, id, parsed)
}

// columnArgs returns the columns of this table that record v (of record id,
// whose key's values are key) has, and the arguments of the write that
// sets them: the key's values, then theirs.
func (t *tableInfo) columnArgs(id string, key []any, v jsonv.Value) (cols []string, args []any, err error) {
	args = slices.Clip(key)
	for _, m := range v.Members {
		if !t.hasField(m.Key) {
			continue // a column this table lacks: kept in the synced state
		}
		leaf, ok := t.ruleValue(m.Key, m.Value)
		if !ok {
			return nil, nil, rowErrorf("table %s, record %s, column %s: %s is no value this table's merge rule for the column reads (MergeRule %v)", t.name, id, m.Key, truncate(string(jsonv.Encode(m.Value)), 40), t.rules[m.Key])
		}
		val, err := decodeValue(leaf)
		if err != nil {
			return nil, nil, rowErrorf("table %s, record %s, column %s: %v", t.name, id, m.Key, err)
		}
		cols = append(cols, m.Key)
		args = append(args, val)
	}
	return cols, args, nil
}

// upsertColumns writes the row of record id (key: its key's values) with
// the columns of this table that record v has (see columnArgs).
func (t *tableInfo) upsertColumns(ctx context.Context, r runner, id string, key []any, v jsonv.Value) error {
	return t.upsertParsed(ctx, r, id, t.parsed(id, key, v))
}

// upsertParsed is upsertColumns, from the record's parsedRow.
func (t *tableInfo) upsertParsed(ctx context.Context, r runner, id string, p *parsedRow) error {
	if p.err != nil {
		return p.err
	}
	if len(p.cols) == 0 {
		// DO NOTHING: a row that exists stays; one that does not, and
		// is still missing, an app trigger skipped (see writeOne).
		n, err := r.execCount(ctx, t.upsertFor(p.cols), p.args...)
		if err != nil || n > 0 {
			return err
		}
		if there, err := t.rowThere(ctx, r, p.key); err != nil || there {
			return err
		}
		return rowErrorf("table %s, record %s: a trigger of the table skipped the write (RAISE(IGNORE)); the row keeps what it showed", t.name, id)
	}
	return t.writeOne(ctx, r, id, t.upsertFor(p.cols), p.args...)
}

// updateRow writes content to a row known to exist.
func (t *tableInfo) updateRow(ctx context.Context, r runner, id, content string) error {
	if !t.ordinary {
		return t.writeOne(ctx, r, id, t.updateSQL, id, content)
	}
	return t.writeRow(ctx, r, id, content)
}

// refusal reports whether a failed row write is the table refusing the
// row (its constraints, or a record its shape cannot hold), which never
// fails a sync: the row is reported in Report.Unwritten and tried again.
func refusal(err error) bool {
	var re *rowError
	return sqliteerr.IsConstraint(err) || errors.As(err, &re)
}

// refused is refusal for a write the engine made in a quiet window of
// q's transaction (see beginQuiet), which must still be open: an app
// trigger's RAISE(ROLLBACK) refuses a row by rolling the whole transaction
// back (the engine's writes say OR ABORT, so a constraint declared ON
// CONFLICT ROLLBACK no longer does). Going on would run the rest
// in autocommit mode, where the window's end deletes the app's pending
// marks that the rollback put back; that is an error, returned as err.
// A write that did not fail is no refusal, and err is nil.
func refused(ctx context.Context, q querier, err error) (ok bool, _ error) {
	if !refusal(err) {
		return false, err
	}
	var syncing int
	if qerr := q.QueryRowContext(ctx, `SELECT is_syncing FROM sync_control`).Scan(&syncing); qerr != nil {
		return false, qerr
	}
	if syncing != 1 {
		return false, fmt.Errorf("%w; the table rolled back the whole transaction (an app trigger's RAISE(ROLLBACK)), so the row cannot be kept unwritten while the rest is written: raise ABORT instead", err)
	}
	return true, nil
}

// deleteRow deletes the app's row of record id, if any.
func (t *tableInfo) deleteRow(ctx context.Context, r runner, id string) error {
	if !t.ordinary {
		return t.deleteOne(ctx, r, id, id)
	}
	key, err := t.decodeKey(id)
	if err != nil {
		return nil // no row of this table can have it
	}
	if t.appendOnly {
		if placed, err := t.placed(ctx, r, id); !placed || err != nil {
			if err != nil {
				return err
			}
			return t.keepImmutableFromDelete(ctx, r, id)
		}
		// The engine's row follows the record, deleted by an app version
		// without AppendOnly.
		if err := t.deleteOne(ctx, r, id, key...); err != nil {
			return err
		}
		return r.exec(ctx, `DELETE FROM sync_placed WHERE table_name = ?1 AND record_id = ?2`, t.name, id)
	}
	return t.deleteOne(ctx, r, id, key...)
}

// deleteOne deletes the row of record id (key: its key's values, or its
// id), if there is one. A delete that an app trigger skips with
// RAISE(IGNORE) leaves the row: a refusal, as in writeOne.
func (t *tableInfo) deleteOne(ctx context.Context, r runner, id string, key ...any) error {
	n, err := r.execCount(ctx, t.deleteSQL, key...)
	if err != nil || n > 0 {
		return err
	}
	if there, err := t.rowThere(ctx, r, key); err != nil || !there {
		return err
	}
	return rowErrorf("table %s, record %s: a trigger of the table skipped the delete (RAISE(IGNORE)); the row stays", t.name, id)
}

// rowThere reports whether the table has the row of key (its key's
// values, or a document's id).
func (t *tableInfo) rowThere(ctx context.Context, r runner, key []any) (bool, error) {
	var one int
	err := r.queryRow(ctx, t.existsSQL, key, &one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (t *tableInfo) hasField(col string) bool { return t.fieldSet[col] }

// rowRecord returns the record an ordinary row stands for, given state,
// the record it showed (nil: none): its columns, with two exceptions that
// keep a table of another app version from undoing what it does not
// know. The members of state that are not columns of this table (a newer
// app version added them) are kept as they are: this device never edits
// them. And a column state lacks that holds the column's constant default
// is left out: the engine wrote the row from a record written where the
// column did not exist, and the default is not the app's edit (sending it
// would overwrite a value another device wrote meanwhile). A column with
// a merge rule holds what the rule makes of the row's value (see
// ruleMember); overruled names the columns whose value the rule did not
// take. Document tables hold the whole record.
func (t *tableInfo) rowRecord(state *jsonv.Value, row jsonv.Value) (rec jsonv.Value, overruled []string) {
	if !t.ordinary || state == nil && t.rules == nil {
		return row, nil
	}
	out := jsonv.Value{Members: make([]jsonv.Member, 0, len(row.Members))}
	for _, m := range row.Members {
		var have *jsonv.Value
		if state != nil {
			h, ok := state.Get(m.Key)
			if !ok {
				if t.isDefault(m) {
					continue
				}
			} else {
				have = &h
			}
		}
		v, lower := t.ruleMember(m.Key, m.Value, have)
		if lower {
			overruled = append(overruled, m.Key)
		}
		out.Members = append(out.Members, jsonv.Member{Key: m.Key, Value: v})
	}
	if state != nil {
		for _, m := range state.Members {
			if !t.hasField(m.Key) {
				out.Members = append(out.Members, m)
			}
		}
	}
	sortMembers(out.Members)
	return out, overruled
}

// isDefault reports whether member m of a row holds its column's
// constant default.
func (t *tableInfo) isDefault(m jsonv.Member) bool {
	d, ok := t.defaults[m.Key]
	return ok && jsonv.Equal(d, m.Value)
}

// ordinarySQL builds the statements of an ordinary table. A key is
// compared as its PRIMARY KEY index compares it, BINARY (see
// registration), whatever collation its column declares: 'a' and 'A'
// are then two rows and two records, in a column declared COLLATE NOCASE
// too.
func (t *tableInfo) ordinarySQL() {
	tbl := quoteIdent(t.name)
	where := make([]string, len(t.keys))
	for i, k := range t.keys {
		where[i] = fmt.Sprintf("%s = ?%d%s", quoteIdent(k), i+1, t.binary())
	}
	t.readSQL = fmt.Sprintf("SELECT %s FROM %s c WHERE %s", t.selectFields("c"), tbl, strings.Join(where, " AND "))
	t.deleteSQL = fmt.Sprintf("DELETE FROM %s WHERE %s", tbl, strings.Join(where, " AND "))
	t.existsSQL = fmt.Sprintf("SELECT 1 FROM %s WHERE %s", tbl, strings.Join(where, " AND "))
	t.fieldSet = map[string]bool{}
	for _, f := range t.fields {
		t.fieldSet[f] = true
	}
	t.upserts = map[string]string{}
}

// binary is the collation the engine compares a key column by, BINARY
// (see ordinarySQL), or none for the rowid, which has no collation (nor
// an index an upsert's ON CONFLICT could name with one).
func (t *tableInfo) binary() string {
	if t.rowidKey {
		return ""
	}
	return " COLLATE BINARY"
}

// lookupKeys is how many keys lookupSQL reads the rows of: up to 64,
// and fewer than the 999 parameters that older builds of SQLite allow.
func (t *tableInfo) lookupKeys() int {
	return max(1, min(fillRows, 999/(1+len(t.keys))))
}

// lookupSQL reads the rows of n keys at once, for a sync that reads many
// (one statement per row costs more than SQLite's lookup). Each key is
// 1+len(keys) parameters: its index, then its columns as decodeKey gives
// them, compared as readSQL compares them; fewer keys pad with NULLs,
// which no key equals. Each row found comes as its key's index, then the
// pairs rowValue takes.
func (t *tableInfo) lookupSQL(n int) string {
	tuple := "(?" + strings.Repeat(", ?", len(t.keys)) + ")"
	on := make([]string, len(t.keys))
	for i, k := range t.keys {
		on[i] = fmt.Sprintf("c.%s = v.column%d%s", quoteIdent(k), i+2, t.binary())
	}
	sel := []string{"v.column1"}
	for _, f := range t.fields {
		sel = append(sel, typedValue("c."+quoteIdent(f)))
	}
	// CROSS JOIN: SQLite loops over the keys and looks each one up in
	// the table, whatever its statistics say.
	return fmt.Sprintf("SELECT %s FROM (VALUES %s%s) AS v CROSS JOIN %s AS c ON %s", strings.Join(sel, ", "),
		tuple, strings.Repeat(", "+tuple, n-1), quoteIdent(t.name), strings.Join(on, " AND "))
}

// selectFields selects, from the row named r, 1 and then the type and
// value of each non-key column (see rowValue).
func (t *tableInfo) selectFields(r string) string {
	sel := []string{"1"}
	for _, f := range t.fields {
		sel = append(sel, typedValue(r+"."+quoteIdent(f)))
	}
	return strings.Join(sel, ", ")
}

// typedValue selects the type and value of SQL expression x, as drivers
// return it unchanged: an expression, which has no declared type (some
// drivers convert a column's values by its declared type, DATETIME or
// BOOLEAN), and TEXT as the bytes of a BLOB (some drivers decode TEXT that
// looks like a time whatever the type). rowValue takes the pair back.
func typedValue(x string) string {
	return fmt.Sprintf("typeof(%[1]s), CASE WHEN typeof(%[1]s) = 'text' THEN CAST(%[1]s AS BLOB) ELSE %[1]s END", x)
}

// upsertFor is the statement writing an ordinary row's key and columns
// cols, in that order, as parameters. Like every write of the engine to
// an app's row, it says OR ABORT on a table that declares a conflict
// algorithm that would drop or hide the row (see overridesConflicts):
// UNIQUE ... ON CONFLICT REPLACE deletes the other row that holds the
// value, IGNORE drops the write, ROLLBACK ends the whole transaction. The
// row is refused instead, which the engine reports and tries again (see
// refusal). Only the key's own conflict is the upsert's.
func (t *tableInfo) upsertFor(cols []string) string {
	sig := strings.Join(cols, ",")
	t.mu.Lock()
	defer t.mu.Unlock()
	if q, ok := t.upserts[sig]; ok {
		return q
	}
	names := make([]string, 0, len(t.keys)+len(cols))
	params := make([]string, 0, cap(names))
	for _, c := range append(append([]string{}, t.keys...), cols...) {
		names = append(names, quoteIdent(c))
		params = append(params, "?"+strconv.Itoa(len(params)+1))
	}
	keys := make([]string, len(t.keys))
	for i, k := range t.keys {
		keys[i] = quoteIdent(k) + t.binary()
	}
	action := "NOTHING"
	if len(cols) > 0 {
		sets := make([]string, len(cols))
		for i, c := range cols {
			sets[i] = fmt.Sprintf("%[1]s = excluded.%[1]s", quoteIdent(c))
		}
		action = "UPDATE SET " + strings.Join(sets, ", ")
	}
	q := fmt.Sprintf("INSERT %sINTO %s (%s) VALUES (%s) ON CONFLICT (%s) DO %s", t.orAbort, quoteIdent(t.name),
		strings.Join(names, ", "), strings.Join(params, ", "), strings.Join(keys, ", "), action)
	t.upserts[sig] = q
	return q
}

// sortMembers puts an object's members in canonical (byte) order.
func sortMembers(ms []jsonv.Member) {
	slices.SortFunc(ms, func(a, b jsonv.Member) int { return strings.Compare(a.Key, b.Key) })
}
