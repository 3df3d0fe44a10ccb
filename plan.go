package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// The plan phase: read every pending record, diff it against its synced
// state from before this sync's downloads, stamp the changes above every
// version this device has seen, and write them to the plan (every
// pending record, which the commit settles) and the patch file to upload.

// plan is what the plan phase made.
type plan struct {
	changes     *spool   // every pending record, in version order
	upload      *os.File // the patch file of the changes to send; nil if none
	sent        int      // changes in the upload
	base        int64    // sync_meta.max_version when the plan was made
	maxSeen     int64    // the largest version seen in the files or stamped here
	dataVersion int64    // PRAGMA data_version when the pending rows were read
}

// plan reads every pending record in one read transaction, diffs it
// against its synced state, stamps the changes above everything f and
// sync_states hold, and writes them to the plan and the upload file.
func (s *syncRun) plan(ctx context.Context, f *fetched) (*plan, error) {
	e := s.e
	p := &plan{}
	if err := s.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&p.dataVersion); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	if _, err := s.conn.ExecContext(ctx, "BEGIN DEFERRED"); err != nil {
		endTx(s.conn)
		return nil, &Error{Op: "sync", Err: err}
	}
	defer s.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT") // read-only: ends the snapshot
	var err error
	if p.base, err = getMetaInt(ctx, s.conn, metaMaxVersion); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	p.maxSeen = max(f.maxSeen, p.base)
	versions := newVersionCounter(p.maxSeen)
	if p.changes, err = newSpool(e.cfg.TempDir); err != nil {
		return nil, err
	}
	s.onDone(p.changes.close)
	var pw *patchWriter
	for _, t := range e.order {
		rows, err := s.conn.QueryContext(ctx, t.pendingSQL(), t.name)
		if err != nil {
			return nil, &Error{Op: "read pending", Table: t.name, Err: err}
		}
		for rows.Next() {
			var r pendingRow
			if err := rows.Scan(&r.id, &r.rowExists, &r.content, &r.rowCanonical, &r.synced, &r.syncedDeleted, &r.refused, &r.base); err != nil {
				rows.Close()
				return nil, &Error{Op: "read pending", Table: t.name, Err: err}
			}
			c, skip := s.planRecord(t, r)
			if skip {
				continue
			}
			if c.flags&planNoop == 0 {
				c.version = versions.take()
				if pw == nil {
					if pw, err = s.newUpload(p); err != nil {
						rows.Close()
						return nil, err
					}
				}
				if err := pw.add(c.table, c.record, c.patch, c.deleted, c.version); err != nil {
					rows.Close()
					return nil, &Error{Op: "write upload", Err: err}
				}
				p.sent++
			}
			if err := p.changes.add(c); err != nil {
				rows.Close()
				return nil, &Error{Op: "write plan", Err: err}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, &Error{Op: "read pending", Table: t.name, Err: err}
		}
	}
	if pw != nil {
		if err := pw.close(); err != nil {
			return nil, &Error{Op: "write upload", Err: err}
		}
		p.maxSeen = versions.last()
	}
	return p, nil
}

// pendingSQL reads, for table ?1, every pending record with its current
// content (JSON text, or NULL for a deleted row or invalid JSON), whether
// the row already holds content and projections exactly as the engine
// writes them (then a sync need not rewrite it), and its synced state.
func (t *tableInfo) pendingSQL() string {
	contentOK := "json_valid(c.content, 6)"
	canonical := "typeof(c.content) = 'text'"
	if t.jsonb {
		canonical = "typeof(c.content) = 'blob' AND json_valid(c.content, 8) AND c.content = jsonb(json(c.content))"
	}
	for _, col := range t.columns {
		canonical += fmt.Sprintf(" AND c.%s IS %s", quoteIdent(col), projection("c.content", col))
	}
	return fmt.Sprintf(`SELECT p.record_id, c.id IS NOT NULL,
	CASE WHEN typeof(c.content) = 'text' THEN c.content WHEN %[1]s THEN json(c.content) END,
	CASE WHEN %[1]s THEN %[2]s ELSE 0 END,
	s.record_data, coalesce(s.is_deleted, 0), u.record_id IS NOT NULL, u.base
FROM sync_pending_changes p
LEFT JOIN %[3]s c ON c.id = p.record_id
LEFT JOIN sync_states s ON s.table_name = p.table_name AND s.record_id = p.record_id
LEFT JOIN sync_unwritten u ON u.table_name = p.table_name AND u.record_id = p.record_id
WHERE p.table_name = ?1
ORDER BY p.record_id`, contentOK, canonical, quoteIdent(t.name))
}

// pendingRow is one pending record as pendingSQL reads it.
type pendingRow struct {
	id            string
	rowExists     bool
	content       sql.NullString // the app's row as JSON text; NULL if none or not valid JSON
	rowCanonical  bool           // the row holds content and projections as the engine writes them
	synced        sql.NullString // the synced state's content, if any
	syncedDeleted bool
	// refused: the app's constraints refused the engine's last write of
	// the row, which still shows base (NULL: no row), not the synced
	// state.
	refused bool
	base    sql.NullString
}

// planRecord turns one pending record into a planned change. skip is set
// (and the record reported) when its content cannot be synced.
func (s *syncRun) planRecord(t *tableInfo, p pendingRow) (c fileChange, skip bool) {
	id, rowExists, content, rowCanonical, synced, syncedDeleted := p.id, p.rowExists, p.content, p.rowCanonical, p.synced, p.syncedDeleted
	c = fileChange{table: t.name, record: id}
	if !synced.Valid {
		c.flags |= planNoState
	}
	// old is the synced content: shown, or hidden under a tombstone. A
	// row written over a tombstone is diffed against the hidden fields,
	// so that the record comes back as exactly the row.
	var old *jsonv.Value
	if synced.Valid {
		v, err := jsonv.ParseObject([]byte(synced.String), jsonv.Options{})
		if err != nil {
			s.skipRecord(t.name, id, fmt.Errorf("synced state is corrupt: %w", err))
			return c, true
		}
		old = &v
	}
	if rowExists && !content.Valid {
		s.skipRecord(t.name, id, errors.New("content is not valid JSON"))
		return c, true
	}
	switch {
	case !rowExists && (old == nil || syncedDeleted):
		c.flags = planNoop | planRowCanonical // created and deleted between syncs, or still deleted
	case !rowExists:
		c.deleted, c.patch = true, []byte("{}")
	default:
		cur, err := jsonv.ParseObject([]byte(content.String), jsonv.Options{})
		if err != nil {
			s.skipRecord(t.name, id, fmt.Errorf("content is not a JSON object: %w", err))
			return c, true
		}
		if p.refused {
			// The row still shows what it showed before the refused
			// write: the app's edits are its difference from that,
			// laid over the synced state. Diffing the row against the
			// synced state would send back the old values of fields
			// other devices changed.
			cur = layEdits(old, editsSince(p.base, cur))
			rowCanonical = false // the row is rewritten with the result
		}
		enc := jsonv.Encode(cur)
		if rowCanonical && string(enc) == content.String {
			c.flags |= planRowCanonical
		}
		switch {
		case old == nil:
			c.patch = enc
		case syncedDeleted:
			// Even an empty patch is a write: it brings the record back.
			c.patch = jsonv.Encode(diff(*old, cur))
		default:
			if d := diff(*old, cur); len(d.Members) > 0 {
				c.patch = jsonv.Encode(d)
			} else {
				c.flags |= planNoop
			}
		}
	}
	// What readers bound is the patch: a record that merges from several
	// devices may grow past the limit, and must still take small edits.
	if n := int64(len(c.patch)); n > s.limits.MaxRecordSize {
		s.skipRecord(t.name, id, fmt.Errorf("the change has %d bytes, over the store's MaxRecordSize (%d)", n, s.limits.MaxRecordSize))
		return c, true
	}
	return c, false
}

func (s *syncRun) skipRecord(table, id string, err error) {
	s.e.log.Warn("drivesync: record not synced", "table", table, "record", id, "err", err)
	s.report.Skipped = append(s.report.Skipped, RecordError{Table: table, Record: id, Err: &Error{Op: "read", Table: table, Record: id, Err: err}})
}

func (s *syncRun) newUpload(p *plan) (*patchWriter, error) {
	f, err := os.CreateTemp(s.e.cfg.TempDir, "drivesync-upload-*")
	if err != nil {
		return nil, &Error{Op: "write upload", Err: err}
	}
	p.upload = f
	s.onDone(func() {
		f.Close()
		os.Remove(f.Name())
	})
	return newPatchWriter(f, s.e.deviceID)
}
