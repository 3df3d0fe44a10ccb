package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"unicode/utf8"

	"github.com/drivesync/drivesync/internal/merge"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// The plan phase: read every pending record, diff it against its synced
// state from before this sync's downloads, stamp the changes above every
// version this device has seen, and write them to the plan (every
// pending record, which the commit settles) and the patch file to upload.

// plan is what the plan phase made.
type plan struct {
	changes *spool // every pending record, in version order
	// uploads are the patch files of the changes to send, in order: one,
	// or several when the changes do not fit in one file (the store's
	// MaxFileSize, MaxExpandedSize). None if nothing is sent.
	uploads []*upload
	sent    int   // changes in the uploads
	base    int64 // sync_meta.max_version when the plan was made
	// lastSeq is the number of the last file this device published when
	// the plan was made; seq the last one the plan gave (see vanished.go).
	lastSeq, seq int64
	maxSeen      int64 // the largest version seen in the files or stamped here
	dataVersion  int64 // PRAGMA data_version when the pending rows were read
	// skipped are the pending records not sent (Report.Skipped), with what
	// their rows showed before the app's edits (nil: no row): the base of
	// those edits, which stay pending.
	skipped map[recordKey]*jsonv.Value
}

// upload is one patch file to send.
type upload struct {
	f    *os.File
	pw   *patchWriter
	sent int    // changes in it
	name string // its name, once published
	seq  int64  // its number among this device's files
}

// plan reads every pending record in one read transaction, diffs it
// against its synced state, stamps the changes above everything f and
// sync_states hold, and writes them to the plan and the upload file.
func (s *syncRun) plan(ctx context.Context, f *fetched) (*plan, error) {
	e := s.e
	p := &plan{skipped: map[recordKey]*jsonv.Value{}}
	if err := s.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&p.dataVersion); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	// Read after dataVersion: a write the plan does not see makes the
	// apply check every row (see applier.dirty).
	from, err := s.pendingSource(ctx, f)
	if err != nil {
		return nil, err
	}
	if _, err := s.conn.ExecContext(ctx, "BEGIN DEFERRED"); err != nil {
		endTx(s.conn)
		return nil, &Error{Op: "sync", Err: err}
	}
	defer s.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT") // read-only: ends the snapshot
	if p.base, err = getMetaInt(ctx, s.conn, metaMaxVersion); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	if p.lastSeq, err = s.lastFileSeq(ctx); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	// Past every number of this device's id that the state holds once
	// this sync applies: files numbered under another count (see the
	// top of vanished.go).
	p.seq = max(p.lastSeq, f.heldNow().highest(e.deviceID))
	p.maxSeen = max(f.maxSeen, p.base)
	versions := newVersionCounter(p.maxSeen)
	if p.changes, err = newSpool(e.cfg.TempDir); err != nil {
		return nil, err
	}
	s.onDone(p.changes.close)
	resets, err := s.resets(ctx, f, from)
	if err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	open := map[int]*upload{} // the files being written, by format
	var entries []byte
	for _, t := range e.order {
		rows, err := s.conn.QueryContext(ctx, t.pendingSQL(from), t.name)
		if err != nil {
			return nil, &Error{Op: "read pending", Table: t.name, Err: err}
		}
		scan, fill, closeScan, err := t.pendingScanner(ctx, s.conn)
		if err != nil {
			rows.Close()
			return nil, &Error{Op: "read pending", Table: t.name, Err: err}
		}
		readErr := func(err error) error { return &Error{Op: "read pending", Table: t.name, Err: err} }
		err = eachRow(rows, scan, fill, (*pendingRow).size, readErr, func(r *pendingRow) error {
			if err := r.readRecord(t); err != nil {
				return readErr(err)
			}
			if (r.id == "" || len(r.id) > merge.MaxRecordIDLen || !utf8.ValidString(r.id)) && (r.rowExists || r.synced.Valid) {
				// Every reader refuses such a change, and with it
				// the file or batch that holds it: it is not sent.
				// An id that is not UTF-8 would be sent with its
				// bad bytes replaced, as another record (or, grown
				// past the limit, refused). Once the app deletes the
				// row, nothing is left to send: the plan settles the
				// record.
				s.skipRecord(t.name, r.id, fmt.Errorf("the record id (%d bytes) must be 1-%d bytes of UTF-8", len(r.id), merge.MaxRecordIDLen))
				p.skipped[recordKey{t.name, r.id}] = r.shown()
				return nil
			}
			c, skip, err := s.planRecord(ctx, t, *r, resets[recordKey{t.name, r.id}])
			if err != nil {
				return &Error{Op: "read pending", Table: t.name, Record: r.id, Err: err}
			}
			if skip {
				p.skipped[recordKey{t.name, r.id}] = r.shown()
				return nil
			}
			if c.flags&planNoop == 0 {
				c.version = versions.take()
				writes, err := ownWrites(c, s.limits.MaxRecordSize)
				if err != nil {
					return &Error{Op: "write upload", Table: t.name, Record: r.id, Err: err}
				}
				// The parts of a change are one write: they go in one
				// file. A change that does not fit in the current file
				// starts the next; one that fits in no file is not sent.
				if skip, err = s.place(p, open, writes, &entries); err != nil {
					return err
				}
				if skip {
					s.skipRecord(t.name, r.id, fmt.Errorf("the change takes %d bytes, more than a patch file may hold (the store's MaxExpandedSize is %d, MaxFileSize %d)", len(entries), s.limits.MaxExpandedSize, s.limits.MaxFileSize))
					p.skipped[recordKey{t.name, r.id}] = r.shown()
					return nil
				}
				p.sent += len(writes)
			}
			if err := p.changes.add(c); err != nil {
				return &Error{Op: "write plan", Err: err}
			}
			return nil
		})
		closeScan()
		if err != nil {
			return nil, err
		}
	}
	// A file that took only changes too large for any file is not sent,
	// and takes no number: the numbers of the files sent have no gap.
	for _, format := range slices.Sorted(maps.Keys(open)) {
		if up := open[format]; up.sent > 0 {
			if err := p.closeUpload(up); err != nil {
				return nil, err
			}
		}
	}
	p.uploads = slices.DeleteFunc(p.uploads, func(up *upload) bool { return up.sent == 0 })
	if len(p.uploads) > 0 {
		p.maxSeen = versions.last()
	}
	return p, nil
}

// pendingSource returns what the plan reads the pending records from:
// the set and the log together, or the set alone when the log is empty,
// or when the downloads delete records: resets then looks records up one
// by one, which the log, having no index, cannot answer. The log is then
// folded into the set first.
func (s *syncRun) pendingSource(ctx context.Context, f *fetched) (string, error) {
	var logged bool
	if err := s.conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sync_pending_log)`).Scan(&logged); err != nil {
		return "", &Error{Op: "sync", Err: err}
	}
	if !logged {
		return "sync_pending_changes", nil
	}
	for _, d := range f.files {
		if d.spool.deletes > 0 {
			return "sync_pending_changes", s.inTx(ctx, func() error { return foldPending(ctx, s.conn) })
		}
	}
	return pendingUnion, nil
}

// pendingSQL reads, for table ?1, every pending record of from (see
// pendingSource) with its current content (JSON text, or NULL for a
// deleted row or invalid JSON), whether the row already holds content and
// projections exactly as the engine writes them (then a sync need not
// rewrite it), and its synced state. The records come in from's order,
// by record id, as SQLite steps through it: an ORDER BY here would have
// SQLite read and sort every record before the first one, leaving the
// reading goroutine of eachRow nothing to do. Nothing depends on that
// order but speed (the commit then writes sync_states in key order);
// TestPendingInRecordOrder checks that SQLite keeps it.
func (t *tableInfo) pendingSQL(from string) string {
	if t.ordinary {
		return `SELECT p.record_id, s.record_data, s.clock, coalesce(s.is_deleted, 0), coalesce(s.sync_version, 0), coalesce(s.device_id, ''),
	u.record_id IS NOT NULL, u.base
FROM ` + from + ` p
LEFT JOIN sync_states s ON s.table_name = p.table_name AND s.record_id = p.record_id
LEFT JOIN sync_unwritten u ON u.table_name = p.table_name AND u.record_id = p.record_id
WHERE p.table_name = ?1`
	}
	contentOK := "json_valid(c.content, 6)"
	canonical := "typeof(c.content) = 'text'"
	if t.jsonb {
		// Its bytes are compared by planRecord, for rows whose text is
		// canonical (see sameSQL).
		canonical = "typeof(c.content) = 'blob'"
	}
	for _, col := range t.columns {
		canonical += fmt.Sprintf(" AND c.%s IS %s", quoteIdent(col), t.projection("c.content", col))
	}
	return fmt.Sprintf(`SELECT p.record_id, c.id, c.id IS NOT NULL,
	CASE WHEN typeof(c.content) = 'text' THEN c.content WHEN %[1]s THEN json(c.content) END,
	CASE WHEN %[1]s THEN %[2]s ELSE 0 END,
	s.record_data, s.clock, coalesce(s.is_deleted, 0), coalesce(s.sync_version, 0), coalesce(s.device_id, ''),
	u.record_id IS NOT NULL, u.base
FROM %[4]s p
LEFT JOIN %[3]s c ON c.id = p.record_id COLLATE BINARY
LEFT JOIN sync_states s ON s.table_name = p.table_name AND s.record_id = p.record_id
LEFT JOIN sync_unwritten u ON u.table_name = p.table_name AND u.record_id = p.record_id
WHERE p.table_name = ?1`, contentOK, canonical, quoteIdent(t.name), from)
}

// pendingScanner returns what reads each pending record of rows from
// pendingSQL into a pendingRow, what completes a run of scanned records
// (nil when scan reads them whole), and what closes both once rows are
// read. An ordinary table's rows are read by their keys, up to
// lookupKeys at a time, with a statement of the scanner's own: fill runs
// on eachRow's reading goroutine, which shares nothing else with the
// sync's.
func (t *tableInfo) pendingScanner(ctx context.Context, conn *sql.Conn) (scan func(*sql.Rows, *pendingRow) error, fill func([]pendingRow, func(*pendingRow) bool) error, done func(), err error) {
	if !t.ordinary {
		return func(rows *sql.Rows, r *pendingRow) error {
			return rows.Scan(&r.id, &r.rawID, &r.rowExists, &r.content, &r.rowCanonical, &r.synced, &r.clock, &r.syncedDeleted, &r.syncedNewest.Version, &r.syncedNewest.Device, &r.refused, &r.base)
		}, nil, func() {}, nil
	}
	n := t.lookupKeys()
	lookup, err := conn.PrepareContext(ctx, t.lookupSQL(n))
	if err != nil {
		return nil, nil, nil, err
	}
	scan = func(rows *sql.Rows, r *pendingRow) error {
		if err := rows.Scan(&r.id, &r.synced, &r.clock, &r.syncedDeleted, &r.syncedNewest.Version, &r.syncedNewest.Device, &r.refused, &r.base); err != nil {
			return err
		}
		// The engine writes an ordinary row's values as they are: the
		// row is always as it would write it.
		r.rowCanonical = true
		if !utf8.ValidString(r.id) {
			// Its id would not cross a patch file unchanged (JSON
			// strings hold UTF-8): the app must give the row a valid
			// key.
			r.keyErr = fmt.Errorf("key %q is TEXT that is not valid UTF-8: give the row a key in UTF-8 (or a BLOB)", r.id)
			return nil
		}
		key, err := t.decodeKey(r.id)
		if err != nil {
			// No row can have this id (a record another device
			// named): there is nothing of the app's to send.
			r.noKey = true
			return nil
		}
		r.key = key
		return nil
	}
	args := make([]any, 0, n*(1+len(t.keys)))
	vals := make([]any, 1+2*len(t.fields))
	dest := make([]any, len(vals))
	for i := range vals {
		dest[i] = &vals[i]
	}
	// read looks up the rows of run, at most n records, and emits each
	// record as soon as its row is read: the CROSS JOIN returns the rows
	// in the keys' order, so a key passed over has no row. A row out of
	// that order fails the sync (a record emitted as having no row would
	// be sent as deleted); it is never taken for the want of one.
	read := func(run []pendingRow, emit func(*pendingRow) bool) (bool, error) {
		next := 0 // the first record of run not emitted yet
		upTo := func(end int) bool {
			for ; next < end; next++ {
				if !emit(&run[next]) {
					return false
				}
				run[next].cols = nil // emit took it: the run holds one row at most
			}
			return true
		}
		args = args[:0]
		for i := range run {
			if run[i].key != nil {
				args = append(args, i)
				args = append(args, run[i].key...)
			}
		}
		if len(args) == 0 {
			return upTo(len(run)), nil
		}
		for len(args) < cap(args) {
			args = append(args, nil) // no key equals NULL
		}
		rows, err := lookup.QueryContext(ctx, args...)
		if err != nil {
			return false, err
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(dest...); err != nil {
				return false, err
			}
			i, ok := vals[0].(int64)
			switch {
			case !ok || i < 0 || i >= int64(len(run)) || int(i) < next-1:
				return false, fmt.Errorf("internal error: a row looked up by key came back as key %v, after key %d", vals[0], next-1)
			case int(i) == next-1:
				continue // a key is unique: as readKey, the first row
			}
			if !upTo(int(i)) {
				return false, nil
			}
			run[i].rowExists, run[i].cols = true, slices.Clone(vals[1:])
			if !upTo(int(i) + 1) {
				return false, nil
			}
		}
		if err := rows.Err(); err != nil {
			return false, err
		}
		return upTo(len(run)), nil
	}
	return scan, func(rs []pendingRow, emit func(*pendingRow) bool) error {
		for len(rs) > 0 {
			run := rs[:min(n, len(rs))]
			if ok, err := read(run, emit); !ok {
				return err
			}
			rs = rs[len(run):]
		}
		return nil
	}, func() { lookup.Close() }, nil
}

// size is about how many bytes r holds.
func (r *pendingRow) size() int {
	n := len(r.id) + len(r.content.String) + len(r.synced.String) + len(r.clock.String) + len(r.base.String)
	for _, v := range r.cols {
		switch v := v.(type) {
		case []byte:
			n += len(v)
		case string:
			n += len(v)
		default:
			n += 8
		}
	}
	return n
}

// pendingRow is one pending record as pendingSQL reads it.
type pendingRow struct {
	id            string
	rawID         any // the row's id as stored (a BLOB stays a BLOB)
	rowExists     bool
	content       sql.NullString // the app's row as JSON text; NULL if none or not valid JSON
	rowCanonical  bool           // the row holds content and projections as the engine writes them
	synced        sql.NullString // the synced state's content, if any
	clock         sql.NullString // and its clock
	syncedDeleted bool
	syncedNewest  merge.Stamp // the synced state's newest write or delete
	// refused: the app's constraints refused the engine's last write of
	// the row, which still shows base (NULL: no row), not the synced
	// state.
	refused bool
	base    sql.NullString
	// noKey: an ordinary table's record whose id is no key of the table;
	// keyErr: a row whose key cannot be sent.
	noKey  bool
	keyErr error
	key    []any // an ordinary table's key, decoded from id
	// cols are an ordinary table's row as lookupSQL reads it, until
	// readRecord makes it row and content.
	cols []any
	row  *jsonv.Value
}

// readRecord makes r.cols, an ordinary table's row as read, the record it
// holds: r.row, and r.content as JSON text. The reading goroutine only
// reads, so that the plan's two goroutines take about as long.
func (r *pendingRow) readRecord(t *tableInfo) error {
	if r.cols == nil {
		return nil
	}
	v, err := t.rowValue(r.cols)
	if err != nil {
		return err
	}
	// v is the record its text parses as: rowValue's members are
	// sorted, named by plain identifiers and never null.
	r.cols, r.row, r.content = nil, &v, sql.NullString{String: string(jsonv.Encode(v)), Valid: true}
	return nil
}

// shown returns what the record's row showed before the app's pending
// edits: what the engine last wrote to it, the synced state, or, if the
// app's table refused that write, what it kept (nil: no row).
func (r pendingRow) shown() *jsonv.Value {
	text := r.synced
	if r.refused {
		text = r.base
	} else if r.syncedDeleted {
		return nil
	}
	if !text.Valid {
		return nil
	}
	v, err := jsonv.ParseObject([]byte(text.String), jsonv.Options{})
	if err != nil {
		return nil
	}
	return &v
}

// resets returns the reset of each replacing write that this sync's
// downloads decide, by record: the newest write or delete of the record
// that the device has seen once they are applied, so that the reset ends
// everything they leave deleted and nothing they leave shown.
//
// Two kinds of record are concerned:
//
//   - a record this device created (a row with no synced state) that the
//     downloads end deleted: another device created and deleted it, and
//     this device had not received that. The row is a new record, as one
//     written over a delete this device saw is: it goes out as a
//     replacing write, so that no field of the deleted record comes back.
//     A record the downloads leave shown was created on both devices at
//     once, and the two merge;
//   - a record written again over a delete this device saw (its synced
//     state is deleted) that the downloads also change: they may re-create
//     it and delete it again, and that record must not come back either.
//     A re-creation they leave shown merges with this one, as two creates
//     do: the reset is then their newest delete.
//
// A record written over a delete that the downloads do not touch resets
// at its synced state's newest stamp (see planRecord). Only records that
// a downloaded change deletes are looked up for the first kind, and the
// records' changes are merged only for those concerned.
func (s *syncRun) resets(ctx context.Context, f *fetched, from string) (map[recordKey]merge.Stamp, error) {
	if len(f.files) == 0 {
		return nil, nil
	}
	candidates := map[recordKey]*merge.Node{}
	// Records written again over a delete: few, and loaded only if the
	// downloads touch them.
	over := map[recordKey]bool{}
	rows, err := s.conn.QueryContext(ctx, `SELECT p.table_name, p.record_id FROM `+from+` p
JOIN sync_states s ON s.table_name = p.table_name AND s.record_id = p.record_id WHERE s.is_deleted`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var k recordKey
		if err := rows.Scan(&k.table, &k.record); err != nil {
			rows.Close()
			return nil, err
		}
		over[k] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	deletes := false
	for _, d := range f.files {
		deletes = deletes || d.spool.deletes > 0
	}
	created := false
	if deletes {
		// The log was folded (see pendingSource): the set holds every
		// pending record.
		if err := s.conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sync_pending_changes p
WHERE NOT EXISTS (SELECT 1 FROM sync_states s WHERE s.table_name = p.table_name AND s.record_id = p.record_id))`).Scan(&created); err != nil {
			return nil, err
		}
	}
	if !created && len(over) == 0 {
		return nil, nil
	}
	for _, d := range f.files {
		if d.spool.deletes == 0 && len(over) == 0 {
			continue
		}
		err := d.spool.each(func(c fileChange) error {
			k := recordKey{c.table, c.record}
			if candidates[k] != nil {
				return nil
			}
			if over[k] {
				st, err := s.loadState(ctx, k.table, k.record)
				if err == nil {
					candidates[k] = st.node
				}
				return err
			}
			if !c.deleted || !created {
				return nil
			}
			var mine bool
			err := s.queryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sync_pending_changes WHERE table_name = ?1 AND record_id = ?2)
AND NOT EXISTS (SELECT 1 FROM sync_states WHERE table_name = ?1 AND record_id = ?2)`, []any{c.table, c.record}, &mine)
			if err == nil && mine {
				candidates[k] = &merge.Node{}
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if len(candidates) == 0 {
		return nil, nil
	}
	for _, d := range f.files {
		err := d.spool.each(func(c fileChange) error {
			if n := candidates[recordKey{c.table, c.record}]; n != nil {
				return applyChange(n, c, c.device)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	resets := map[recordKey]merge.Stamp{}
	for k, n := range candidates {
		switch {
		case !n.Exists():
			resets[k] = n.Newest()
		case over[k]:
			resets[k] = n.Gone
		}
	}
	return resets, nil
}

// planRecord turns one pending record into a planned change. skip is set
// (and the record reported) when its content cannot be synced. A nonzero
// reset is the reset of its replacing write that this sync's downloads
// decide (see resets).
func (s *syncRun) planRecord(ctx context.Context, t *tableInfo, p pendingRow, reset merge.Stamp) (c fileChange, skip bool, err error) {
	id, rowExists, content, rowCanonical, synced, syncedDeleted := p.id, p.rowExists, p.content, p.rowCanonical, p.synced, p.syncedDeleted
	c = fileChange{table: t.name, record: id}
	if p.keyErr != nil {
		s.skipRecord(t.name, id, p.keyErr)
		return c, true, nil
	}
	if !synced.Valid {
		c.flags |= planNoState
	}
	// old is the synced content: shown, or hidden under a tombstone.
	var old *jsonv.Value
	if synced.Valid {
		v, err := jsonv.ParseObject([]byte(synced.String), jsonv.Options{})
		if err != nil {
			s.skipRecord(t.name, id, fmt.Errorf("synced state is corrupt: %w", err))
			return c, true, nil
		}
		old = &v
	}
	if rowExists && !content.Valid {
		s.skipRecord(t.name, id, errors.New("content is not valid JSON"))
		return c, true, nil
	}
	switch {
	case p.noKey:
		c.flags = planNoop | planRowCanonical
	case !rowExists && (old == nil || syncedDeleted):
		c.flags = planNoop | planRowCanonical // created and deleted between syncs, or still deleted
	case !rowExists && t.appendOnly:
		// The app deleted its row of a record in conflict: the record
		// is not deleted, and the row takes the synced payload.
		c.flags = planNoop
	case !rowExists && p.refused && !p.base.Valid:
		// No row, and none shown before either (a record created and
		// deleted while its table was unregistered, or refused): no
		// edit, and the synced state, which the app never saw, is
		// written now (see retryUnwritten).
		c.flags = planNoop
	case !rowExists:
		c.deleted, c.patch = true, []byte("{}")
	default:
		var cur jsonv.Value
		if p.row != nil {
			cur = *p.row // an ordinary row, read as its record
		} else if cur, err = jsonv.ParseObject([]byte(content.String), jsonv.Options{}); err != nil {
			s.skipRecord(t.name, id, fmt.Errorf("content is not a JSON object: %w", err))
			return c, true, nil
		}
		c.base = []byte(content.String)
		var overruled []string
		if !p.refused {
			shown := old
			if syncedDeleted {
				shown = nil // a new record
			}
			cur, overruled = t.rowRecord(shown, cur)
		}
		if p.refused {
			// The row still shows what it showed before a write the
			// engine could not make (the table refused it, or did not
			// sync then): the app's edits are its difference from
			// that, laid over the synced state. Diffing the row
			// against the synced state would send back the old values
			// of fields other devices changed.
			edits := t.editsSince(p.base, cur)
			if len(edits.Members) == 0 {
				// No edit: the row only shows a state the engine will
				// write now (see retryUnwritten).
				c.flags = planNoop
				break
			}
			if p.base.Valid || !syncedDeleted {
				cur, overruled = t.rowRecord(old, layEdits(old, edits))
				rowCanonical = false // the row is rewritten with the result
			} else {
				cur, overruled = t.rowRecord(nil, cur)
			}
			// Else the row showed no row, and the record is deleted: a
			// row written over it is a new record, whatever the engine
			// failed to write before.
		}
		enc := jsonv.Encode(cur)
		if rowCanonical && len(overruled) == 0 && (string(enc) == content.String || t.ordinary && !p.refused) {
			c.flags |= planRowCanonical
			if t.jsonb && !t.ordinary {
				// The text is canonical; JSONB also needs the bytes
				// the engine writes, which the query does not compare
				// (rows that fail on text, most rows an app writes,
				// would pay for it in vain).
				var same bool
				if err := s.queryRow(ctx, t.sameSQL, []any{p.rawID, content.String}, &same); err != nil && !errors.Is(err, sql.ErrNoRows) {
					return c, false, err
				}
				if !same {
					c.flags &^= planRowCanonical
				}
			}
		}
		for _, col := range overruled {
			// The row is written with the rule's value by this sync.
			err := fmt.Errorf("column %s was written below its value, and %v keeps the largest: the row shows it again", col, t.rules[col])
			s.e.log.Info("drivesync: a local write overruled by a merge rule", "table", t.name, "record", id, "column", col)
			s.report.Overruled = append(s.report.Overruled, RecordError{Table: t.name, Record: id, Err: &Error{Op: "merge", Table: t.name, Record: id, Err: err}})
		}
		switch {
		case old == nil && reset.Version > 0:
			// Created over a record other devices deleted, unseen
			// here: a new record (see resets).
			c.patch = enc
			c.flags |= changeReplaces
			c.reset = reset
		case old == nil:
			c.patch = enc
		case t.appendOnly && old != nil && !syncedDeleted:
			// A row of an append-only table is never sent as an edit:
			// one unlike its record is a conflict (see keepImmutable),
			// reported when the commit writes the record.
			c.flags = c.flags&^planRowCanonical | planNoop
			if jsonv.Equal(cur, *old) {
				c.flags |= planRowCanonical
			}
		case syncedDeleted && p.refused && p.base.Valid:
			// Edits of a row that did not show the delete: they bring
			// the record back whole, with them on top.
			c.patch = jsonv.Encode(merge.Diff(*old, cur))
		case syncedDeleted:
			// A row written over a record this device saw deleted is a
			// new record: the patch replaces it whole, and no field
			// written before, hidden under the tombstone or not yet
			// received and stamped before the delete, comes back.
			c.patch = enc
			c.flags |= changeReplaces
			if c.reset = reset; reset.Version == 0 {
				c.reset = p.syncedNewest
			}
		default:
			if d := merge.Diff(*old, cur); len(d.Members) > 0 {
				c.patch = jsonv.Encode(d)
				if n, err := merge.DecodeState(*old, []byte(p.clock.String), false); err == nil {
					c.seen = seenList(n, d)
				}
			} else {
				c.flags |= planNoop
			}
		}
	}
	// What readers bound is each write: a record that merges from several
	// devices may grow past the limit and must still take edits, and a
	// change over it goes out as several writes of its members.
	if c.flags&planNoop == 0 && !c.deleted {
		if _, err := ownWrites(c, s.limits.MaxRecordSize); err != nil {
			s.skipRecord(t.name, id, err)
			return c, true, nil
		}
	}
	return c, false, nil
}

// ownWrites returns the writes that carry planned change c in a patch
// file, each within the store's record limit: c itself if it fits, else
// its members split into several patches (an object member too large for
// one, into patches of its own members), which together write exactly
// what c writes. Every part carries c's version: the parts are one write,
// so that a concurrent write of another device orders against all of them
// alike, as against c (with versions of their own, a write stamped
// between two parts would win over some and lose to others, leaving what
// neither device wrote, or a partial object). Applied in order, parts of
// one stamp merge as the whole patch does, since they write disjoint
// members. A replacing change resets the record before its first write.
// It fails only when a single value is over the limit.
func ownWrites(c fileChange, limit int64) ([]fileChange, error) {
	if c.deleted || int64(len(c.patch)) <= limit {
		return []fileChange{c}, nil
	}
	p, err := jsonv.ParseObject(c.patch, jsonv.Options{KeepNulls: true})
	if err != nil {
		return nil, err
	}
	parts, err := splitPatch(p, limit)
	if err != nil {
		return nil, err
	}
	writes := make([]fileChange, len(parts))
	for i, part := range parts {
		w := c
		w.patch = jsonv.Encode(part)
		if i > 0 {
			w.flags &^= changeReplaces
			w.reset = merge.Stamp{}
		}
		writes[i] = w
	}
	return writes, nil
}

// splitPatch splits merge patch p into patches whose encodings fit in
// limit bytes and that, applied in order, write what p writes: its members
// in groups, a member too large for one group split the same way below
// its key. It fails for a value that is not an object and does not fit.
func splitPatch(p jsonv.Value, limit int64) ([]jsonv.Value, error) {
	var parts []jsonv.Value
	var cur []jsonv.Member
	var size int64 = 2 // {}
	flush := func() {
		if len(cur) > 0 {
			parts = append(parts, jsonv.Value{Members: cur})
			cur, size = nil, 2
		}
	}
	for _, m := range p.Members {
		one := jsonv.Value{Members: []jsonv.Member{m}}
		n := int64(len(jsonv.Encode(one))) - 2 // the member, without its braces
		switch {
		case n+2 <= limit:
			if size+n+1 > limit {
				flush()
			}
			cur = append(cur, m)
			size += n + 1
		case m.Value.IsObject() && len(m.Value.Members) > 0:
			flush()
			key := int64(len(jsonv.AppendString(nil, m.Key))) + 3 // "key":{...}, in its own braces
			sub, err := splitPatch(m.Value, limit-key)
			if err != nil {
				return nil, fmt.Errorf("%s.%w", m.Key, err)
			}
			for _, s := range sub {
				parts = append(parts, jsonv.Value{Members: []jsonv.Member{{Key: m.Key, Value: s}}})
			}
		default:
			return nil, fmt.Errorf("%s has %d bytes, over the store's MaxRecordSize (%d)", m.Key, n, limit)
		}
	}
	flush()
	return parts, nil
}

func (s *syncRun) skipRecord(table, id string, err error) {
	s.e.log.Warn("drivesync: record not synced", "table", table, "record", id, "err", err)
	s.report.Skipped = append(s.report.Skipped, RecordError{Table: table, Record: id, Err: &Error{Op: "read", Table: table, Record: id, Err: err}})
}

// place writes the writes of one change to the file being written in
// the format they need (open holds them, by format), or to a new one if
// they do not fit in it. skip reports a change too large for an empty
// file; entries is a buffer, left holding their encoding.
//
// A file's format is the oldest that holds its changes, so that devices
// on an older app version read every change but the rare replacing write
// (format 3): those go in files of their own.
func (s *syncRun) place(p *plan, open map[int]*upload, writes []fileChange, entries *[]byte) (skip bool, err error) {
	format := entryFormat(writes[0])
	for {
		up := open[format]
		if up == nil {
			if up, err = s.newUpload(p, format); err != nil {
				return false, err
			}
			open[format] = up
		}
		*entries = (*entries)[:0]
		for _, w := range writes {
			*entries = up.pw.entry(*entries, w)
		}
		fits, err := up.pw.add(*entries)
		switch {
		case err != nil:
			return false, &Error{Op: "write upload", Err: err}
		case fits:
			up.sent += len(writes)
			return false, nil
		case up.pw.n == 0 && slices.ContainsFunc(writes, func(w fileChange) bool { return w.seen != nil }):
			// Too large for an empty file with what its writer had seen
			// (see conflicts.go): the change goes without it.
			for i := range writes {
				writes[i].seen = nil
			}
			continue
		case up.pw.n == 0:
			return true, nil
		}
		if err := p.closeUpload(up); err != nil {
			return false, err
		}
		delete(open, format)
	}
}

// closeUpload ends a file that holds changes, giving it the next number.
func (p *plan) closeUpload(up *upload) error {
	p.seq++
	up.seq = p.seq
	if err := up.pw.close(p.seq); err != nil {
		return &Error{Op: "write upload", Err: err}
	}
	return nil
}

func (s *syncRun) newUpload(p *plan, format int) (*upload, error) {
	f, err := os.CreateTemp(s.e.cfg.TempDir, "drivesync-upload-*")
	if err != nil {
		return nil, &Error{Op: "write upload", Err: err}
	}
	s.onDone(func() {
		f.Close()
		os.Remove(f.Name())
	})
	pw, err := newPatchWriter(f, s.e.deviceID, format, s.limits)
	if err != nil {
		return nil, &Error{Op: "write upload", Err: err}
	}
	up := &upload{f: f, pw: pw}
	p.uploads = append(p.uploads, up)
	return up, nil
}

// eachRow calls fn with every row of rows, scanned by scan, in order, on
// the caller's goroutine, and closes rows. The rows are stepped and
// scanned a batch ahead of fn, on a goroutine of their own (see
// readAhead; size reckons a row's bytes): SQLite's reading on one core,
// fn on the other. fill, if not nil, completes a run of rows scanned (up
// to fillRows of them, and about aheadBytes) on that goroutine too: it
// must emit every row of the run, in order, as soon as it is complete,
// unless emit returns false, when it must return at once. The first
// error of either, in the rows' order, ends it; an error reading the
// rows is returned through readErr. fn may use the rows' connection:
// database/sql takes its turns.
func eachRow[T any](rows *sql.Rows, scan func(*sql.Rows, *T) error, fill func([]T, func(*T) bool) error, size func(*T) int, readErr func(error) error, fn func(*T) error) error {
	defer rows.Close()
	return readAhead(func(send func(T, int) bool) error {
		var run []T
		runBytes := 0
		// flush completes the rows scanned and sends them; false: the
		// loop ends, with err.
		flush := func() (ok bool, err error) {
			emitted, stopped := 0, false
			emit := func(r *T) bool {
				if stopped = stopped || !send(*r, size(r)); !stopped {
					emitted++
				}
				return !stopped
			}
			if fill == nil {
				for i := range run {
					if !emit(&run[i]) {
						break
					}
				}
			} else if err := fill(run, emit); err != nil {
				return false, readErr(err)
			}
			if !stopped && emitted != len(run) {
				// A row fn never saw would lose its pending mark.
				return false, readErr(fmt.Errorf("internal error: %d of %d rows read", emitted, len(run)))
			}
			clear(run)
			run, runBytes = run[:0], 0
			return !stopped, nil
		}
		for rows.Next() {
			var r T
			if err := scan(rows, &r); err != nil {
				if ok, err := flush(); !ok {
					return err
				}
				return readErr(err)
			}
			run, runBytes = append(run, r), runBytes+size(&r)
			if fill == nil || len(run) == fillRows || runBytes >= aheadBytes {
				if ok, err := flush(); !ok {
					return err
				}
			}
		}
		if ok, err := flush(); !ok {
			return err
		}
		if err := rows.Err(); err != nil {
			return readErr(err)
		}
		return nil
	}, fn)
}

// fillRows is how many rows eachRow has its fill complete at most at
// once.
const fillRows = 64
