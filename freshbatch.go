package drivesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// Batching the states of new records. Most records of a large apply have
// no state yet: a new device's bootstrap, another device's new records,
// this device's own new records on their upload. Each takes one
// sync_states insert, and SQLite inserts freshBatchRows rows in one
// statement for less than it takes for them one by one: one statement
// is bound, stepped and reset where there were many.
//
// A record is queued only when its whole apply is that insert and then a
// write of its row that depends on nothing the insert decides (see
// freshOwn and freshReceived). A batch is written when it is full, before
// any change that is not queued, and at the end of each loop that queues
// (before anything else of the apply reads or writes sync_states or the
// pending marks): the changes of a file are applied in the file's order,
// as one at a time, which decides between two writes of one record under
// one stamp (see merge). Its rows are then written one by one, in order,
// as before. The batch's statement is a
// plain INSERT: if any of its records has a state after all (a record
// twice in one file, a received write to a record this device has),
// SQLite takes the statement back whole and each record of the batch
// goes the usual way, one at a time. A received write is queued whether
// or not its record has a state (finding out would cost the lookup the
// insert saves), so after a batch that failed the next records go one at
// a time, twice as many after each failure in a row: an apply of writes
// to records this device has wastes at most a batch now and then.

// freshHook, set only by this package's tests, sees each statement that
// writes several records: what it wrote ("states" or "rows"), how many,
// and whether SQLite took it.
var freshHook func(what string, n int, ok bool)

// freshBatchRows is the number of rows a batch's statement inserts at
// most. 32 rows of 7 values is far below SQLite's limit of variables.
const freshBatchRows = 32

// A freshRecord is a queued record: its change, the state it gets, and
// whether it is one of this device's planned changes (else a received one).
type freshRecord struct {
	c   fileChange
	ns  newState
	own bool
}

// A freshBatch is the records queued, and about the bytes they hold;
// skip and backoff count the records to apply one at a time after a
// batch failed (see insertFresh).
type freshBatch struct {
	items   []freshRecord
	size    int
	skip    int
	backoff int
}

// freshBackoffMax bounds the records applied one at a time after failed
// batches.
const freshBackoffMax = 64 * freshBatchRows

// queueFresh queues r, and writes the batch once it holds freshBatchRows
// records or about aheadBytes bytes. After a failed batch, it applies r
// at once instead, one at a time.
func (s *applier) queueFresh(ctx context.Context, r freshRecord) error {
	if s.fresh.skip > 0 {
		s.fresh.skip--
		if r.own {
			return s.applyOwnOne(ctx, r.c)
		}
		return s.applyReceivedOne(ctx, r.c)
	}
	s.fresh.items = append(s.fresh.items, r)
	s.fresh.size += len(r.c.record) + 2*len(r.c.patch) + len(r.ns.clock) + len(r.c.base)
	if r.c.parsed != nil {
		s.fresh.size += 4 * len(r.c.patch) // as spool.eachWith reckons it
	}
	if len(s.fresh.items) < freshBatchRows && s.fresh.size < aheadBytes {
		return nil
	}
	return s.flushFresh(ctx)
}

// flushFresh writes the queued records: their states in one statement,
// then their rows.
func (s *applier) flushFresh(ctx context.Context) error {
	items := s.fresh.items
	s.fresh.items, s.fresh.size = nil, 0
	if len(items) == 0 {
		return nil
	}
	inserted, err := s.insertFresh(ctx, items)
	if err != nil {
		return err
	}
	if freshHook != nil {
		freshHook("states", len(items), inserted)
	}
	if inserted {
		s.fresh.backoff = 0
	} else {
		s.fresh.backoff = min(max(2*s.fresh.backoff, freshBatchRows), freshBackoffMax)
		s.fresh.skip = s.fresh.backoff
	}
	for i := 0; i < len(items); {
		r := items[i]
		t := s.e.tables[r.c.table]
		n := 1
		switch {
		case !inserted && r.own:
			err = s.applyOwnOne(ctx, r.c)
		case !inserted:
			err = s.applyReceivedOne(ctx, r.c)
		case r.own:
			err = s.freshOwnRow(ctx, r.c)
		default:
			for i+n < len(items) && !items[i+n].own && items[i+n].c.table == r.c.table {
				n++
			}
			together := false
			if n > 1 {
				together, err = s.docRowsTogether(ctx, t)
			}
			switch {
			case err != nil:
			case together:
				err = s.upsertDocs(ctx, t, items[i:i+n])
			default:
				n = 1
				err = s.rowResult(ctx, t, r.c.record, t.writeParsed(ctx, s, r.c.record, string(r.c.patch), r.c.parsed))
			}
		}
		if err != nil {
			return err
		}
		i += n
	}
	return nil
}

// docRowsTogether reports whether the rows of new received records of t
// may be written in one statement: t is a document table that no trigger
// but the engine's own watches (see noAppTriggers). Such a statement writes each row as its
// own statement would, and a row the table refuses (a constraint, which
// the engine's writes resolve with ABORT) takes the statement back whole;
// an app's trigger could skip a row (RAISE(IGNORE)) or keep the rows
// before the one it fails (RAISE(FAIL)), which a statement of one row
// tells apart. The answer holds for the transaction, which no other
// connection's schema change can enter.
func (s *applier) docRowsTogether(ctx context.Context, t *tableInfo) (bool, error) {
	if t.ordinary || t.appendOnly {
		return false, nil
	}
	if ok, known := s.together[t.name]; known {
		return ok, nil
	}
	ok, err := noAppTriggers(ctx, s.conn, t)
	if err != nil {
		return false, err
	}
	if s.together == nil {
		s.together = map[string]bool{}
	}
	s.together[t.name] = ok
	return ok, nil
}

// noAppTriggers reports whether no trigger but the engine's own fires on
// the engine's writes to t: none in the database, and none in the TEMP
// schema of q's connection (an app with one connection may have made
// one there), except those whose WHEN clause skips the engine's writes.
func noAppTriggers(ctx context.Context, q querier, t *tableInfo) (bool, error) {
	own, _ := json.Marshal(slices.Sorted(maps.Keys(triggerSQL(t)))) // strings: no error
	rows, err := q.QueryContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE AND name NOT IN (SELECT value FROM json_each(?2))
UNION ALL SELECT sql FROM sqlite_temp_schema WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE`, t.name, string(own))
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var def string
		if err := rows.Scan(&def); err != nil {
			return false, err
		}
		if !skipsEngineWrites(def) {
			return false, nil
		}
	}
	return true, rows.Err()
}

// upsertDocs writes the rows of items, new received records of document
// table t (see docRowsTogether), in one statement. If t refuses one, the
// statement wrote none, and each is written alone: those refused are
// reported, the others written.
func (s *applier) upsertDocs(ctx context.Context, t *tableInfo, items []freshRecord) error {
	query := t.docUpsertSQL(len(items))
	st, err := s.stmt(ctx, query)
	if err != nil {
		return err
	}
	args := make([]any, 0, 2*len(items))
	for _, r := range items {
		args = append(args, r.c.record, string(r.c.patch))
	}
	res, err := st.ExecContext(ctx, args...)
	if freshHook != nil {
		freshHook("rows", len(items), err == nil)
	}
	if err != nil {
		if ok, err := refused(ctx, s.conn, err); !ok {
			return err
		}
		for _, r := range items {
			if err := s.rowResult(ctx, t, r.c.record, t.writeParsed(ctx, s, r.c.record, string(r.c.patch), r.c.parsed)); err != nil {
				return err
			}
		}
		return nil
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(items)) {
		return &Error{Op: "write", Table: t.name, Err: errors.Join(err, fmt.Errorf("internal error: %d rows written of %d", n, len(items)))}
	}
	for _, r := range items {
		if err := s.rowResult(ctx, t, r.c.record, nil); err != nil {
			return err
		}
	}
	return nil
}

// insertFresh inserts the states of items in one statement. It reports
// false, having inserted none, if SQLite refused one of them (a record
// that has a state).
func (s *applier) insertFresh(ctx context.Context, items []freshRecord) (bool, error) {
	st, err := s.stmt(ctx, freshInsertSQL(len(items)))
	if err != nil {
		return false, err
	}
	args := make([]any, 0, 7*len(items))
	for _, r := range items {
		args = append(args, r.c.table, r.c.record, r.ns.data, r.ns.clock, r.ns.at.Version, r.ns.at.Device, r.ns.gone)
	}
	res, err := st.ExecContext(ctx, args...)
	if sqliteerr.IsConstraint(err) {
		return false, nil
	}
	if err != nil {
		return false, &Error{Op: "apply", Err: err}
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(items)) {
		return false, &Error{Op: "apply", Err: errors.Join(err, errors.New("internal error: a batch of new states was not inserted whole"))}
	}
	return true, nil
}

var fullFreshInsertSQL = sync.OnceValue(func() string { return buildFreshInsertSQL(freshBatchRows) })

// freshInsertSQL is the statement that inserts the states of n records.
func freshInsertSQL(n int) string {
	if n == freshBatchRows {
		return fullFreshInsertSQL()
	}
	return buildFreshInsertSQL(n)
}

func buildFreshInsertSQL(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?)")
	}
	return b.String()
}
