package drivesync

import (
	"context"
	"errors"
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
// pending marks): a file's changes are applied in the file's order, as
// one at a time, which decides between two writes of one record under one
// stamp (see merge). The batch's rows are then written one by one, in
// order, as before: an app's trigger can tell a statement of many rows
// from many statements (RAISE(IGNORE) skips one row of it, RAISE(FAIL)
// keeps the rows before), and writing the rows of new records together
// measured no gain in a bootstrap.
//
// The batch's statement is a plain INSERT: if any of its records has a
// state after all (a record twice in one file, a received write to a
// record this device has), SQLite takes the statement back whole and each
// record of the batch goes the usual way, one at a time. A received write
// is queued whether or not its record has a state (finding out would cost
// the lookup the insert saves), so after a batch that failed the next
// records go one at a time, twice as many after each failure in a row: an
// apply of writes to records this device has wastes at most a batch now
// and then.

// freshHook, set only by this package's tests, sees each batch written:
// its records, and whether SQLite inserted their states.
var freshHook func(n int, inserted bool)

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
		freshHook(len(items), inserted)
	}
	if inserted {
		s.fresh.backoff = 0
	} else {
		s.fresh.backoff = min(max(2*s.fresh.backoff, freshBatchRows), freshBackoffMax)
		s.fresh.skip = s.fresh.backoff
	}
	for _, r := range items {
		switch {
		case !inserted && r.own:
			err = s.applyOwnOne(ctx, r.c)
		case !inserted:
			err = s.applyReceivedOne(ctx, r.c)
		case r.own:
			err = s.freshOwnRow(ctx, r.c)
		default:
			s.countReceived(r.c) // a new record
			s.arrived.created(r.c)
			t := s.e.tables[r.c.table]
			err = s.rowResult(ctx, t, r.c.record, t.writeParsed(ctx, s, r.c.record, string(r.c.patch), r.c.parsed))
		}
		if err != nil {
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
