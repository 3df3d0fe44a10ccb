package drivesync

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// Pending marks. The capture triggers append the table and record id of
// each write to sync_pending_log: a small row at the end of a table,
// whatever the record id, where a mark in an index keyed by random ids
// would cost a page of its own. The engine works from
// sync_pending_changes, the set of pending records: it folds the log into
// the set at the start of each of its write transactions and before it
// reads the pending records, and readers outside those (Status,
// AutoSync) read both.
//
// The engine's own writes to the app's tables fire the same triggers
// (a WHEN clause that told them apart would cost every app write a
// query): it writes inside quiet windows of its write transactions, which
// start with no mark of the app's in the log and delete what the window
// appended, now and then (so that the log stays in SQLite's page cache)
// and at its end.

// pendingUnion is the set of pending records, as a subquery of
// (table_name, record_id) in that order, for readers that do not fold.
const pendingUnion = `(SELECT table_name, record_id FROM sync_pending_changes UNION SELECT table_name, record_id FROM sync_pending_log ORDER BY table_name, record_id)`

// foldPending moves the marks of sync_pending_log into
// sync_pending_changes, in the set's order. q must hold the write lock.
func foldPending(ctx context.Context, q querier) error {
	if _, err := q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id)
SELECT table_name, record_id FROM sync_pending_log ORDER BY table_name, record_id`); err != nil {
		return err
	}
	_, err := q.ExecContext(ctx, `DELETE FROM sync_pending_log`)
	return err
}

// settlePlanned removes the log's marks of tables, whose every pending
// record a sync planned and no write changed since, as the sync settles
// them (see clearPending). The marks of other tables join the set. q must
// hold the write lock.
func settlePlanned(ctx context.Context, q querier, tables string) error {
	if _, err := q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id)
SELECT table_name, record_id FROM sync_pending_log WHERE table_name NOT IN (SELECT value FROM json_each(?1))
ORDER BY table_name, record_id`, tables); err != nil {
		return err
	}
	_, err := q.ExecContext(ctx, `DELETE FROM sync_pending_log`)
	return err
}

// quietDropAt is the number of writes from which a quiet window drops the
// capture triggers of the tables it writes for its length, and creates
// them again before it ends: a trigger costs each write a few
// microseconds, while dropping and creating them costs a few
// milliseconds, and makes every connection read the schema again once.
const quietDropAt = 4096

// quietWindow is a quiet window: the engine writes the app's tables in
// q's write transaction, whose log held no mark of the app's when it
// began.
type quietWindow struct {
	q       querier
	dropped []*tableInfo // the tables whose capture triggers are dropped
	writes  int
}

// beginQuiet starts a quiet window for about writes writes to tables,
// which drops their triggers from dropAt writes.
// sync_control.is_syncing tells the append-only tables' triggers, and the
// app's own, that the engine writes. The transaction must not commit
// before the window ends: that creates the dropped triggers again.
func beginQuiet(ctx context.Context, q querier, tables []*tableInfo, writes, dropAt int) (*quietWindow, error) {
	w := &quietWindow{q: q}
	if _, err := q.ExecContext(ctx, `UPDATE sync_control SET is_syncing = 1`); err != nil {
		return nil, err
	}
	if len(tables) == 0 || writes < dropAt {
		return w, nil
	}
	for _, t := range tables {
		for _, name := range slices.Sorted(maps.Keys(triggerSQL(t))) {
			if _, err := q.ExecContext(ctx, "DROP TRIGGER IF EXISTS "+quoteIdent(name)); err != nil {
				return nil, err
			}
		}
		w.dropped = append(w.dropped, t)
	}
	return w, nil
}

// wrote counts one of the engine's writes, and deletes the marks of the
// last so many.
func (w *quietWindow) wrote(ctx context.Context) error {
	if w.writes++; w.writes%1024 != 0 || len(w.dropped) > 0 {
		return nil
	}
	_, err := w.q.ExecContext(ctx, `DELETE FROM sync_pending_log`)
	return err
}

// end ends the window: the triggers dropped are created again, and the
// marks the engine's writes appended, which are not the app's edits, go.
func (w *quietWindow) end(ctx context.Context) error {
	for _, t := range w.dropped {
		defs := triggerSQL(t)
		for _, name := range slices.Sorted(maps.Keys(defs)) {
			if _, err := w.q.ExecContext(ctx, defs[name]); err != nil {
				return fmt.Errorf("drivesync: create trigger on %s: %w", t.name, err)
			}
		}
	}
	w.dropped = nil
	if _, err := w.q.ExecContext(ctx, `DELETE FROM sync_pending_log`); err != nil {
		return err
	}
	_, err := w.q.ExecContext(ctx, `UPDATE sync_control SET is_syncing = 0`)
	return err
}
