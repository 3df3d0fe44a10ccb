package drivesync

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// Append-only tables (Table.AppendOnly): a row, once written, is never
// changed, by the app or by the engine.
//
// The capture triggers refuse the app's UPDATE and DELETE of a row. The
// synced record merges as any other (so every device's state is the same
// bytes): two devices that wrote different payloads under one key end with
// the later payload in sync_states, and each keeps its own row. A row the
// app wrote is never changed; one the engine placed (sync_placed: the
// device had no row of that key) follows the synced record, so that every
// device that wrote nothing under a key holds the same payload, in
// whatever order the others' arrived. A received payload that differs
// from a row of the app's is a conflict, kept in sync_immutable until the
// app deletes its row of that key (the triggers allow that, for a record
// in conflict only), and reported at every sync meanwhile. The row
// deleted, the next sync places the synced payload in it; a deleted row is
// never sent as a delete of the record.

// immutableTriggers are the triggers that keep an append-only table's rows
// as written.
func immutableTriggers(t *tableInfo, when string, name func(string) string) map[string]string {
	tbl := quoteIdent(t.name)
	refuse := quoteString(fmt.Sprintf("drivesync: table %s is append-only (Table.AppendOnly): a row cannot be changed or deleted once written; write a new row (such as a new generation) instead", t.name))
	conflicted := fmt.Sprintf("EXISTS (SELECT 1 FROM sync_immutable WHERE table_name = %s AND record_id = %s)", quoteString(t.name), t.keyExpr("OLD"))
	// A row the app inserts is the app's, even over one the engine placed
	// (INSERT OR REPLACE deletes that without a delete trigger).
	unplace := fmt.Sprintf("DELETE FROM sync_placed WHERE table_name = %s AND record_id = %s;", quoteString(t.name), t.keyExpr("NEW"))
	return map[string]string{
		name("@immutable_insert"): fmt.Sprintf("CREATE TRIGGER %s AFTER INSERT ON %s %s BEGIN %s END", quoteIdent(name("@immutable_insert")), tbl, when, unplace),
		// '@' is in no table name: no capture trigger has these names.
		name("@immutable_update"): fmt.Sprintf("CREATE TRIGGER %s BEFORE UPDATE ON %s %s BEGIN SELECT RAISE(ABORT, %s); END", quoteIdent(name("@immutable_update")), tbl, when, refuse),
		name("@immutable_delete"): fmt.Sprintf("CREATE TRIGGER %s BEFORE DELETE ON %s %s AND NOT %s BEGIN SELECT RAISE(ABORT, %s); END", quoteIdent(name("@immutable_delete")), tbl, when, conflicted, refuse),
	}
}

// digest names a payload in conflict reports.
func digest(v jsonv.Value) string {
	sum := sha256.Sum256(jsonv.Encode(v))
	return hex.EncodeToString(sum[:8])
}

// keepImmutable decides the write of record id, whose synced payload is
// v, to an append-only table: written is false if the device has no row,
// or one the engine placed (the caller writes it, and then marks it
// placed: see place); else the app's row stays as it is, and err reports
// a conflict if its payload is not v's, or was not in a conflict recorded
// before.
func (t *tableInfo) keepImmutable(ctx context.Context, r runner, id string, v jsonv.Value) (written bool, err error) {
	shown, ok, err := t.readRow(ctx, r, id)
	if err != nil {
		return true, err
	}
	placed, err := t.placed(ctx, r, id)
	if err != nil {
		return true, err
	}
	if !ok || placed {
		return false, nil
	}
	row, err := jsonv.ParseObject([]byte(shown), jsonv.Options{})
	if err != nil {
		return true, err
	}
	mine, _ := t.rowRecord(&v, row)
	if !jsonv.Equal(mine, v) {
		return true, t.immutableConflict(ctx, r, id, digest(mine), digest(v))
	}
	var theirs string
	switch err := r.queryRow(ctx, `SELECT theirs FROM sync_immutable WHERE table_name = ?1 AND record_id = ?2`, []any{t.name, id}, &theirs); {
	case errors.Is(err, sql.ErrNoRows):
		return true, nil // the same payload: nothing new
	case err != nil:
		return true, err
	}
	return true, t.immutableConflict(ctx, r, id, digest(mine), theirs)
}

// place records that the engine wrote the row of record id, which the
// app had not: it follows the record, and a conflict of it is over.
func (t *tableInfo) place(ctx context.Context, r runner, id string) error {
	if err := r.exec(ctx, `INSERT OR IGNORE INTO sync_placed (table_name, record_id) VALUES (?1, ?2)`, t.name, id); err != nil {
		return err
	}
	return r.exec(ctx, `DELETE FROM sync_immutable WHERE table_name = ?1 AND record_id = ?2`, t.name, id)
}

// placed reports whether the engine placed the row of record id.
func (t *tableInfo) placed(ctx context.Context, r runner, id string) (bool, error) {
	var one int
	err := r.queryRow(ctx, `SELECT 1 FROM sync_placed WHERE table_name = ?1 AND record_id = ?2`, []any{t.name, id}, &one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// keepImmutableFromDelete keeps an append-only row whose record another
// device deleted (an app version without AppendOnly): a conflict.
func (t *tableInfo) keepImmutableFromDelete(ctx context.Context, r runner, id string) error {
	shown, ok, err := t.readRow(ctx, r, id)
	if err != nil || !ok {
		return err
	}
	row, err := jsonv.ParseObject([]byte(shown), jsonv.Options{})
	if err != nil {
		return err
	}
	return t.immutableConflict(ctx, r, id, digest(row), "deleted")
}

// receivedImmutable checks a change another device wrote to an
// append-only record against the row this device holds: a payload unlike
// it, or a delete, is a conflict.
func (t *tableInfo) receivedImmutable(ctx context.Context, r runner, c fileChange) error {
	shown, ok, err := t.readRow(ctx, r, c.record)
	if err != nil || !ok {
		return err
	}
	if placed, err := t.placed(ctx, r, c.record); placed || err != nil {
		return err // the engine's row: it follows the record
	}
	row, err := jsonv.ParseObject([]byte(shown), jsonv.Options{})
	if err != nil {
		return err
	}
	if c.deleted {
		mine, _ := t.rowRecord(nil, row)
		return t.immutableConflict(ctx, r, c.record, digest(mine), "deleted")
	}
	theirs, err := jsonv.ParseObject(c.patch, jsonv.Options{})
	if err != nil {
		return err
	}
	// A change may come in parts (see ownWrites), and from an app version
	// with columns this one lacks: each column it writes that the row has
	// must hold the same value.
	mine, _ := t.rowRecord(&theirs, row)
	for _, m := range theirs.Members {
		if !t.hasField(m.Key) {
			continue
		}
		if have, ok := mine.Get(m.Key); !ok || !jsonv.Equal(have, m.Value) {
			return t.immutableConflict(ctx, r, c.record, digest(mine), digest(theirs))
		}
	}
	return nil
}

func (t *tableInfo) immutableConflict(ctx context.Context, r runner, id, mine, theirs string) error {
	if err := r.exec(ctx, `INSERT INTO sync_immutable (table_name, record_id, mine, theirs) VALUES (?1, ?2, ?3, ?4)
ON CONFLICT DO UPDATE SET mine = excluded.mine, theirs = excluded.theirs`, t.name, id, mine, theirs); err != nil {
		return err
	}
	return &rowError{
		msg: fmt.Sprintf("table %s, record %s: append-only row differs from the one another device wrote under the same key (this device's payload %s, the other's %s): each keeps its own row; delete this device's row of the key to take the synced one", t.name, id, mine, theirs),
		err: ErrImmutableConflict,
	}
}
