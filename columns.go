package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// An ordinary table across registrations and app versions: its rows
// joined to the synced state when the table is registered (adoptRows),
// registered again (markEditedRows), or gains columns a newer app version
// added (writeNewColumns), and the columns' constant defaults, which a
// row holds for a record written where the column did not exist (see
// rowRecord).

// literalRE matches the default values rowRecord knows: constants.
var literalRE = regexp.MustCompile(`^(?i:[+-]?[0-9.]+(e[+-]?[0-9]+)?|'([^']|'')*'|x'[0-9a-f]*'|null|true|false)$`)

// readDefaults learns the constant defaults of an ordinary table's columns
// (a column without one defaults to NULL), as a row stores them: a
// default is converted by its column's type (0 in a REAL column is 0.0,
// '7' in an INTEGER one 7), so the value is read back from a column of
// the same type. q must be one connection (the temporary table is its
// own).
func (t *tableInfo) readDefaults(ctx context.Context, q querier) error {
	var strict bool
	if err := q.QueryRowContext(ctx, `SELECT strict FROM pragma_table_list WHERE name = ?1 AND schema = 'main'`, t.name).Scan(&strict); err != nil {
		return err
	}
	rows, err := q.QueryContext(ctx, `SELECT name, type, dflt_value FROM pragma_table_xinfo(?1) WHERE hidden = 0 AND pk = 0`, t.name)
	if err != nil {
		return err
	}
	type dflt struct {
		decl string
		expr sql.NullString
	}
	dflts := map[string]dflt{}
	for rows.Next() {
		var name string
		var d dflt
		if err := rows.Scan(&name, &d.decl, &d.expr); err != nil {
			rows.Close()
			return err
		}
		dflts[name] = d
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	t.defaults = map[string]jsonv.Value{}
	for name, d := range dflts {
		expr := "NULL"
		if d.expr.Valid {
			if expr = constantDefault(d.expr); expr == "" {
				continue // not a constant: every row has its own
			}
		}
		typ, v, ok, err := storedDefault(ctx, q, d.decl, strict, expr)
		if err != nil {
			return fmt.Errorf("column %s: default %s: %w", name, expr, err)
		}
		if !ok {
			continue // the column cannot store it: no row holds it
		}
		jv, err := encodeValue(typ, v)
		if err != nil {
			return fmt.Errorf("column %s: default %s: %w", name, expr, err)
		}
		t.defaults[name] = jv
	}
	return nil
}

// constantDefault returns a column's declared default if it is a
// constant (see literalRE), without its parentheses; "" if it is none.
func constantDefault(d sql.NullString) string {
	if !d.Valid {
		return ""
	}
	expr := strings.TrimSpace(d.String)
	for strings.HasPrefix(expr, "(") && strings.HasSuffix(expr, ")") {
		expr = strings.TrimSpace(expr[1 : len(expr)-1])
	}
	if !literalRE.MatchString(expr) {
		return ""
	}
	return expr
}

// storedDefault returns the type and value that a column declared decl
// (of a STRICT table if strict) stores for constant expr, by storing it in
// a temporary table; ok is false if such a column refuses it (a STRICT
// column of another type).
func storedDefault(ctx context.Context, q querier, decl string, strict bool, expr string) (typ string, v any, ok bool, err error) {
	table := "CREATE TEMP TABLE drivesync_default (v " + decl + ")"
	if strict {
		table += " STRICT"
	}
	if _, err := q.ExecContext(ctx, table); err != nil {
		return "", nil, false, err
	}
	defer q.ExecContext(context.WithoutCancel(ctx), `DROP TABLE temp.drivesync_default`)
	_, err = q.ExecContext(ctx, "INSERT INTO temp.drivesync_default (v) VALUES ("+expr+")")
	if sqliteerr.IsConstraint(err) {
		return "", nil, false, nil
	}
	if err == nil {
		err = q.QueryRowContext(ctx, "SELECT "+typedValue("v")+" FROM temp.drivesync_default").Scan(&typ, &v)
	}
	return typ, v, err == nil, err
}

// adoptRows joins a newly registered ordinary table to the synced state,
// as adoptTable does a document table: every row becomes pending, and
// synced records it lacks are written into it (a row its constraints
// refuse is left to the next sync, which reports it). A row whose key has
// no record id (NULL or REAL, written before the table was synced) fails
// the registration: it could never sync.
func adoptRows(ctx context.Context, q querier, t *tableInfo) error {
	tbl := quoteIdent(t.name)
	var bad int
	if err := q.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FROM %s c WHERE %s`, tbl, t.badKey("c"))).Scan(&bad); err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("%d rows have a key that is NULL, REAL or TEXT with a NUL character in %s: give them TEXT or INTEGER keys before syncing the table (devices find a record by its key)", bad, strings.Join(t.keys, ", "))
	}
	if _, err := q.ExecContext(ctx, fmt.Sprintf(`INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id) SELECT ?1, %s FROM %s c`, t.keyExpr("c"), tbl), t.name); err != nil {
		return err
	}
	return engineWrites(ctx, q, func() error { return writeMissingRows(ctx, q, t) })
}

// writeMissingRows writes, one by one, each synced record of t that has
// no row; a row the table refuses goes to sync_unwritten. It runs in a
// quiet window (see engineWrites).
func writeMissingRows(ctx context.Context, q querier, t *tableInfo) error {
	return eachState(ctx, q, t.name, func(id, data string, deleted bool) error {
		if deleted {
			return nil
		}
		_, ok, err := t.readRow(ctx, direct{q}, id)
		if err != nil || ok {
			return err
		}
		refusedRow, err := refused(ctx, q, t.writeRow(ctx, direct{q}, id, data))
		if refusedRow {
			_, err = q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_unwritten (table_name, record_id) VALUES (?1, ?2)`, t.name, id)
		}
		return err
	})
}

// markEditedRows marks pending the rows of an ordinary table registered
// again that differ from what they showed (see reattachTable): a row
// unlike its kept base, or, without one, unlike its synced state; and a
// synced record whose row is gone though it showed one.
func markEditedRows(ctx context.Context, q querier, t *tableInfo) error {
	rows, err := q.QueryContext(ctx, fmt.Sprintf(`SELECT %[1]s, %[2]s,
	u.record_id IS NOT NULL, u.base, s.record_id IS NOT NULL AND NOT s.is_deleted, s.record_data
FROM %[3]s c
LEFT JOIN sync_unwritten u ON u.table_name = ?1 AND u.record_id = %[1]s
LEFT JOIN sync_states s ON s.table_name = ?1 AND s.record_id = %[1]s`, t.keyExpr("c"), t.selectFields("c"), quoteIdent(t.name)), t.name)
	if err != nil {
		return err
	}
	var edited []string
	for rows.Next() {
		vals := make([]any, 2*len(t.fields)+1)
		var id string
		var kept, shown bool
		var base, state sql.NullString
		dest := []any{&id}
		for i := range vals {
			dest = append(dest, &vals[i])
		}
		dest = append(dest, &kept, &base, &shown, &state)
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return err
		}
		v, err := t.rowValue(vals[1:])
		if err != nil {
			edited = append(edited, id) // the next sync reports it
			continue
		}
		showed := base
		if !kept {
			showed = sql.NullString{String: state.String, Valid: shown}
		}
		if !showed.Valid {
			edited = append(edited, id)
			continue
		}
		was, err := jsonv.ParseObject([]byte(showed.String), jsonv.Options{})
		if err != nil {
			edited = append(edited, id)
			continue
		}
		if rec, lower := t.rowRecord(&was, v); len(lower) > 0 || !jsonv.Equal(rec, was) {
			edited = append(edited, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	err = eachState(ctx, q, t.name, func(id, _ string, deleted bool) error {
		var kept bool
		var base sql.NullString
		err := q.QueryRowContext(ctx, `SELECT 1, base FROM sync_unwritten WHERE table_name = ?1 AND record_id = ?2`, t.name, id).Scan(&kept, &base)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if kept && !base.Valid || !kept && deleted {
			return nil // it showed no row
		}
		_, ok, err := t.readRow(ctx, direct{q}, id)
		if err == nil && !ok {
			edited = append(edited, id)
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, id := range edited {
		if _, err := q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id) VALUES (?1, ?2)`, t.name, id); err != nil {
			return err
		}
	}
	return nil
}

// eachState calls fn with every synced record of table, a page at a time
// so that fn may run statements of its own on q.
func eachState(ctx context.Context, q querier, table string, fn func(id, data string, deleted bool) error) error {
	after := ""
	for {
		rows, err := q.QueryContext(ctx, `SELECT record_id, record_data, is_deleted FROM sync_states
WHERE table_name = ?1 AND record_id > ?2 ORDER BY record_id LIMIT 500`, table, after)
		if err != nil {
			return err
		}
		type state struct {
			id, data string
			deleted  bool
		}
		var page []state
		for rows.Next() {
			var st state
			if err := rows.Scan(&st.id, &st.data, &st.deleted); err != nil {
				rows.Close()
				return err
			}
			page = append(page, st)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, st := range page {
			if err := fn(st.id, st.data, st.deleted); err != nil {
				return err
			}
		}
		if len(page) < 500 {
			return nil
		}
		after = page[len(page)-1].id
	}
}

// writeNewColumns gives the rows of an ordinary table the synced values of
// columns added to it since the last Open (an app upgrade that added a
// column other devices already write). A row that shows its synced record
// (not one the table refused) takes the values its record holds, in the
// columns where the app cannot have written since: all of them if the
// row is not pending and its table was registered, else those that still
// hold the column's constant default (the app may have set a new column
// between the upgrade and this Open, or while the table was not
// registered). It then records the table's columns. It runs before a
// table registered again is compared with what its rows showed, so that
// a default is not taken for the app's edit.
func writeNewColumns(ctx context.Context, q querier, t *tableInfo, unregistered bool) error {
	key := "columns/" + t.name
	before, err := getMeta(ctx, q, key)
	if err != nil {
		return err
	}
	now := strings.Join(t.fields, ",")
	if before == now {
		return nil
	}
	had := map[string]bool{}
	for _, f := range strings.Split(before, ",") {
		had[f] = true
	}
	var added []string
	for _, f := range t.fields {
		if !had[f] {
			added = append(added, f)
		}
	}
	if before != "" && len(added) > 0 {
		err := engineWrites(ctx, q, func() error { return t.writeColumns(ctx, q, added, unregistered) })
		if err != nil {
			return err
		}
	}
	return setMeta(ctx, q, key, now)
}

// writeColumns writes the synced values of the columns added into the
// rows that show them (see writeNewColumns).
func (t *tableInfo) writeColumns(ctx context.Context, q querier, added []string, unregistered bool) error {
	return eachState(ctx, q, t.name, func(id, data string, deleted bool) error {
		if deleted {
			return nil
		}
		var pending, kept bool
		var base sql.NullString
		if err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sync_pending_changes WHERE table_name = ?1 AND record_id = ?2),
	EXISTS (SELECT 1 FROM sync_unwritten WHERE table_name = ?1 AND record_id = ?2),
	(SELECT base FROM sync_unwritten WHERE table_name = ?1 AND record_id = ?2)`, t.name, id).Scan(&pending, &kept, &base); err != nil {
			return err
		}
		if kept {
			// The row shows base, not the synced record (the table
			// refused it, or was not registered when it changed): the
			// new columns take what base holds, which the next sync
			// compares the row with.
			if !base.Valid {
				return nil
			}
			data, pending = base.String, true
		}
		v, err := jsonv.ParseObject([]byte(data), jsonv.Options{})
		if err != nil {
			return nil // reported when the record is next written
		}
		shown, ok, err := t.readRow(ctx, direct{q}, id)
		if err != nil || !ok {
			return err
		}
		row, err := jsonv.ParseObject([]byte(shown), jsonv.Options{})
		if err != nil {
			return err
		}
		var set jsonv.Value
		for _, f := range added {
			m, ok := v.Get(f)
			if !ok {
				continue
			}
			if pending || unregistered {
				d, constant := t.defaults[f]
				if have, _ := row.Get(f); !constant || !jsonv.Equal(have, d) {
					continue // the app's value
				}
			}
			set.Members = append(set.Members, jsonv.Member{Key: f, Value: m})
		}
		if len(set.Members) == 0 {
			return nil
		}
		sortMembers(set.Members)
		key, err := t.decodeKey(id)
		if err != nil {
			return nil
		}
		// Not writeRow: an append-only row takes a new column's value
		// as any other; its payload did not change.
		refusedRow, err := refused(ctx, q, t.upsertColumns(ctx, direct{q}, id, key, set))
		if refusedRow {
			// The table refuses the record's values: the row keeps
			// what it shows, and the next sync reports and retries it.
			_, err = q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_unwritten (table_name, record_id, base) VALUES (?1, ?2, ?3)`, t.name, id, shown)
		}
		return err
	})
}
