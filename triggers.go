package drivesync

import (
	"context"
	"fmt"
	"maps"
	"strings"
)

// Capture: each synced table gets AFTER INSERT, UPDATE and DELETE triggers
// that mark the record as pending, by appending its table and id to
// sync_pending_log (see pending.go); the content is read when the engine
// syncs. Each write fires one trigger of one statement, which also checks
// what the app wrote: a trigger more, or a WHEN clause that queries a
// table, would cost every write about as much as the mark itself.

const triggerPrefix = "sync_trg_"

func triggerSQL(t *tableInfo) map[string]string {
	table := t.name
	tbl, lit := quoteIdent(table), quoteString(table)
	mark := func(id string) string {
		return fmt.Sprintf("INSERT INTO sync_pending_log (table_name, record_id) VALUES (%s, %s);", lit, id)
	}
	name := func(op string) string { return triggerPrefix + table + "_" + op }
	if t.ordinary {
		defs := ordinaryTriggers(t, mark, name)
		if t.appendOnly {
			maps.Copy(defs, immutableTriggers(t, "WHEN (SELECT is_syncing FROM sync_control) = 0", name))
		}
		return defs
	}
	// Content must be a JSON object (text or JSONB): refuse anything else
	// when the app writes it, rather than find it at sync time and leave
	// the record pending for ever. JSONB, which the engine recommends, is
	// checked without parsing the whole value. The engine's own writes
	// are objects, and pass.
	//
	// BEFORE triggers, because they see what the statement writes: an
	// AFTER trigger misses the content of an INSERT OR IGNORE (or an
	// UPSERT) over an existing row, and sees the column's default where
	// OR REPLACE swapped one in for a NULL. A statement that then writes
	// nothing leaves a mark of a record it did not change, which a sync
	// finds unchanged.
	//
	// A NULL id (which SQLite lets a TEXT PRIMARY KEY hold) is refused
	// in the same CASE, naming the app's column: devices find a record
	// by its id, and the mark would otherwise fail on the engine's own
	// NOT NULL, naming a table the app never wrote.
	notObject := "CASE WHEN json_valid(NEW.content, 6) THEN json_type(NEW.content) <> 'object' ELSE 1 END"
	checked := fmt.Sprintf("CASE WHEN NEW.id IS NULL THEN RAISE(ABORT, %s) WHEN %s THEN RAISE(ABORT, %s) ELSE NEW.id END",
		quoteString("drivesync: "+table+".id must not be NULL: give every row an id, such as a UUID (devices find a record by its id)"), notObject,
		quoteString("drivesync: "+table+".content must be a JSON object (such as {\"title\":\"...\"}): store the record as an object, written with jsonb(?) or as JSON text"))
	return map[string]string{
		name("insert"): fmt.Sprintf("CREATE TRIGGER %s BEFORE INSERT ON %s BEGIN %s END", quoteIdent(name("insert")), tbl, mark(checked)),
		name("update"): fmt.Sprintf("CREATE TRIGGER %s BEFORE UPDATE ON %s BEGIN %s END", quoteIdent(name("update")), tbl, mark(checked)),
		// A row whose id is NULL was never a record (an older engine
		// registered the table with it): deleting it, or giving it an id,
		// leaves no mark of the NULL.
		name("delete"): fmt.Sprintf("CREATE TRIGGER %s AFTER DELETE ON %s WHEN OLD.id IS NOT NULL BEGIN %s END", quoteIdent(name("delete")), tbl, mark("OLD.id")),
		// Changing a record's id deletes the old record and creates a new
		// one; only statements that set id pay for this trigger.
		name("rekey"): fmt.Sprintf("CREATE TRIGGER %s AFTER UPDATE OF id ON %s WHEN OLD.id IS NOT NEW.id COLLATE BINARY AND OLD.id IS NOT NULL BEGIN %s END", quoteIdent(name("rekey")), tbl, mark("OLD.id")),
	}
}

// ordinaryTriggers are an ordinary table's: the record id is the row's
// key (see keyExpr), and a key that has none is refused in the app's own
// statement. The check runs after the row is stored, on the values as the
// column's affinity made them.
func ordinaryTriggers(t *tableInfo, mark func(string) string, name func(string) string) map[string]string {
	tbl := quoteIdent(t.name)
	// One statement: the key of row r is checked as the mark of record
	// id is computed.
	checked := t.keyChecked
	keys := make([]string, len(t.keys))
	moved := make([]string, len(t.keys))
	for i, k := range t.keys {
		keys[i] = quoteIdent(k)
		// A key is another record's when its type changes too: in a
		// column without affinity the INTEGER 1 and the REAL 1.0 are
		// equal, and 1.0 is no key at all.
		// 'a' and 'A' are two keys under a column's COLLATE NOCASE too
		// (see ordinarySQL).
		moved[i] = fmt.Sprintf("OLD.%[1]s IS NOT NEW.%[1]s COLLATE BINARY OR typeof(OLD.%[1]s) <> typeof(NEW.%[1]s)", quoteIdent(k))
	}
	if t.rowidKey {
		// The rowid's other names set the key too.
		keys = append(keys, "rowid", "oid", "_rowid_")
	}
	return map[string]string{
		name("insert"): fmt.Sprintf("CREATE TRIGGER %s AFTER INSERT ON %s BEGIN %s END", quoteIdent(name("insert")), tbl, mark(checked("NEW", t.keyExpr("NEW")))),
		name("update"): fmt.Sprintf("CREATE TRIGGER %s AFTER UPDATE ON %s BEGIN %s END", quoteIdent(name("update")), tbl, mark(t.keyExpr("NEW"))),
		name("delete"): fmt.Sprintf("CREATE TRIGGER %s AFTER DELETE ON %s BEGIN %s END", quoteIdent(name("delete")), tbl, mark(t.keyExpr("OLD"))),
		// A changed key deletes the old record and creates a new one.
		// The new key is checked here: an update that leaves the key as
		// it was (checked when its row was inserted) compiles neither
		// the check nor this trigger.
		name("rekey"): fmt.Sprintf("CREATE TRIGGER %s AFTER UPDATE OF %s ON %s WHEN %s BEGIN %s END", quoteIdent(name("rekey")), strings.Join(keys, ", "), tbl, strings.Join(moved, " OR "), mark(checked("NEW", t.keyExpr("OLD")))),
	}
}

// installTriggers (re)creates the capture triggers of the registered
// tables, drops those of tables no longer registered, and returns the
// tables that had no triggers before: newly registered ones.
func installTriggers(ctx context.Context, q querier, tables []*tableInfo) (fresh []*tableInfo, err error) {
	existing := map[string]string{}
	rows, err := q.QueryContext(ctx, `SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'sync\_trg\_%' ESCAPE '\'`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, sql string
		if err := rows.Scan(&name, &sql); err != nil {
			rows.Close()
			return nil, err
		}
		existing[name] = sql
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, t := range tables {
		defs := triggerSQL(t)
		if _, ok := existing[triggerPrefix+t.name+"_insert"]; !ok {
			fresh = append(fresh, t)
		}
		for name, def := range defs {
			want[name] = true
			if existing[name] == def {
				continue // unchanged: leave the schema (and app statements) alone
			}
			if _, err := q.ExecContext(ctx, "DROP TRIGGER IF EXISTS "+quoteIdent(name)); err != nil {
				return nil, err
			}
			if _, err := q.ExecContext(ctx, def); err != nil {
				return nil, fmt.Errorf("drivesync: create trigger on %s: %w", t.name, err)
			}
		}
	}
	for name := range existing {
		if !want[name] && strings.HasPrefix(name, triggerPrefix) {
			if _, err := q.ExecContext(ctx, "DROP TRIGGER IF EXISTS "+quoteIdent(name)); err != nil {
				return nil, err
			}
		}
	}
	return fresh, nil
}
