package drivesync

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drivesync/drivesync/internal/merge"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// The commit phase, the sync's one write transaction: merge the own and
// received changes into sync_states, write the app's rows, settle the
// pending marks and the ledger of files.

// applier is the commit phase at work: what the earlier phases found, and
// what it learns of the app's rows as it writes them.
type applier struct {
	*syncRun
	l *listing
	f *fetched
	p *plan

	dirty   bool // another connection committed since the pending rows were read
	pending map[recordKey]pendingEdit
	// rows holds the last write of the app rows retryUnwritten looks at:
	// nil, or why the table refused it. Those are the rows refused in
	// this sync and the records of tracked (sync_unwritten and
	// sync_immutable when the apply began); a row written fine and
	// tracked by neither needs no entry, so that the map does not grow
	// with every record a sync applies.
	rows    map[recordKey]error
	tracked map[recordKey]bool
	// revived are the records the app edited during the sync while
	// another device's delete arrived, with the hidden fields their rows
	// were rebased on (see rebasePending).
	revived map[recordKey]string
	fresh   freshBatch // records with no state, queued (see freshBatch)
	// received counts the received changes that changed a record's
	// synced state (see countReceived); lastReceived is the last record
	// counted.
	received     int
	lastReceived recordKey
	// arrived are the other devices' writes merged so far, which the
	// conflict log tells from values this device showed.
	arrived *arrivals
}

type recordKey struct{ table, record string }

// pendingEdit is a record the app wrote while the sync ran. base is the
// content the app's row had before those writes (nil: no row).
type pendingEdit struct{ base *jsonv.Value }

// commit applies everything in one write transaction.
func (s *syncRun) commit(ctx context.Context, l *listing, f *fetched, p *plan) error {
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "apply", Err: err}
	}
	a := &applier{syncRun: s, l: l, f: f, p: p, pending: map[recordKey]pendingEdit{}, rows: map[recordKey]error{}, revived: map[recordKey]string{},
		arrived: newArrivals(s.e.deviceID, p.base, max(f.maxSeen, p.base))}
	err := a.apply(ctx)
	if err == nil {
		err = s.hook("applied")
	}
	if err == nil {
		_, err = s.conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		s.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		var de *Error
		if !errors.As(err, &de) {
			err = &Error{Op: "apply", Err: err}
		}
		return err
	}
	s.e.log.Info("drivesync: synced", "downloaded", len(s.report.Downloaded), "received", s.report.ChangesReceived, "sent", s.report.ChangesSent)
	return s.hook("committed")
}

func (s *applier) apply(ctx context.Context) error {
	e := s.e
	var dv int64
	if err := s.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&dv); err != nil {
		return err
	}
	// If no other connection committed since the pending rows were read,
	// the app wrote nothing during this sync and no row needs checking.
	s.dirty = dv != s.p.dataVersion
	s.tracked = map[recordKey]bool{}
	tracked, err := s.conn.QueryContext(ctx, `SELECT table_name, record_id FROM sync_unwritten UNION SELECT table_name, record_id FROM sync_immutable`)
	if err != nil {
		return err
	}
	for tracked.Next() {
		var k recordKey
		if err := tracked.Scan(&k.table, &k.record); err != nil {
			tracked.Close()
			return err
		}
		s.tracked[k] = true
	}
	tracked.Close()
	if err := tracked.Err(); err != nil {
		return err
	}
	for key, base := range s.p.skipped {
		// Not sent: the app's edits stay pending, laid over what this
		// sync brings (see rebasePending).
		s.pending[key] = pendingEdit{base: base}
	}
	// The log's marks: with no write since the plan read them, those of
	// the synced tables are the records planned, which clearPending
	// settles; else all join the set, where the checks below look.
	if s.dirty {
		err = foldPending(ctx, s.conn)
	} else {
		err = settlePlanned(ctx, s.conn, e.tableNames())
	}
	if err != nil {
		return err
	}
	writes := s.p.changes.n
	for _, d := range s.f.files {
		writes += d.spool.n
	}
	w, err := beginQuiet(ctx, s.conn, e.order, writes, e.quietDropAt)
	if err != nil {
		return err
	}
	// The step's records are those writes counts: this device's own
	// changes, then every received file's.
	e.progressStart("apply", 1+len(s.f.files), 0, writes)
	// Not parsed ahead: an ordinary table's row almost always holds its
	// planned content already (planRowCanonical), and the parse would
	// go to waste.
	err = s.p.changes.each(func(c fileChange) error {
		e.progressRecords(1)
		if err := s.applyOwn(ctx, c); err != nil {
			return err
		}
		return w.wrote(ctx)
	})
	if err == nil {
		err = s.flushFresh(ctx)
	}
	if err != nil {
		return err
	}
	if err := s.clearPending(ctx); err != nil {
		return err
	}
	e.progressFile(1)
	for i, d := range s.f.files {
		err := d.spool.eachWith(e.parseAhead, func(c fileChange) error {
			e.progressRecords(1)
			if err := s.applyReceived(ctx, c); err != nil {
				return err
			}
			return w.wrote(ctx)
		})
		if err == nil {
			err = s.flushFresh(ctx)
		}
		if err != nil {
			return err
		}
		if s.l.server {
			// The records pulled from a Server, not another device's
			// file, and no file to record. A record that this device
			// holds already as it came (one it pushed in a push that
			// did not follow on from its cursor, pulled back) is no
			// change received.
			s.report.ChangesReceived += s.received
		} else {
			s.report.ChangesReceived += d.spool.n
			s.report.Downloaded = append(s.report.Downloaded, d.name)
			if _, err := s.conn.ExecContext(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size, seq, holds) VALUES (?, 'applied', ?, ?, ?)`, d.name, max(d.size, 0), d.seq, heldText(d.holds)); err != nil {
				return err
			}
		}
		e.progressFile(i + 2)
	}
	if err := s.rebasePending(ctx); err != nil {
		return err
	}
	if err := s.retryUnwritten(ctx); err != nil {
		return err
	}
	for k, base := range s.revived {
		// The next sync sends the app's edits from the hidden fields:
		// they bring the record back.
		if err := s.exec(ctx, `INSERT OR REPLACE INTO sync_unwritten (table_name, record_id, base) VALUES (?1, ?2, ?3)`, k.table, k.record, base); err != nil {
			return err
		}
	}
	if err := s.recordFiles(ctx); err != nil {
		return err
	}
	if err := s.trimConflicts(ctx); err != nil {
		return err
	}
	if err := w.end(ctx); err != nil {
		return err
	}
	e.progressEnd()
	return nil
}

// parseAhead works out, on a spool replay's reading goroutine (see
// spool.eachWith), what writing the row of a change to an ordinary table
// takes from its patch (see parsedRow), for an apply that writes the
// patch as it is: most of the Go work of writing an ordinary row is then
// off the syncing goroutine. A patch that does not parse, or whose id is
// no key, is left to the apply, which reports it. parseAhead reads only
// what Open set.
func (e *Engine) parseAhead(c *fileChange) {
	if t := e.tables[c.table]; t != nil && t.ordinary && !c.deleted {
		c.parsed, _ = t.parseRow(c.record, c.patch)
	}
}

// freshWrite reports whether c, a write of a record that has no state
// yet, gives the record exactly its patch (see merge.FreshClock): a plain
// write, neither a delete nor a replacing one, that removes nothing. A
// patch is canonical JSON, where a null member shows as :null (a string
// holding those bytes only costs the long way).
func freshWrite(c fileChange) bool {
	return c.clock == nil && !c.deleted && c.flags&(changeHard|changeReplaces) == 0 && c.reset.IsZero() &&
		!bytes.Contains(c.patch, []byte(":null"))
}

// freshOwn reports whether c, one of this device's planned changes, is a
// new record sent in one write, with nothing else written during the sync.
func (s *applier) freshOwn(c fileChange) bool {
	return c.flags&(planNoState|planNoop) == planNoState && !s.dirty && freshWrite(c) && int64(len(c.patch)) <= s.limits.MaxRecordSize
}

// freshOwnRow settles the row of c, a freshOwn change whose state is
// stored: it shows the patch.
func (s *applier) freshOwnRow(ctx context.Context, c fileChange) error {
	t := s.e.tables[c.table]
	switch {
	case c.flags&planRowCanonical != 0:
		return nil
	case c.base == nil:
		return s.rowResult(ctx, t, c.record, t.writeRow(ctx, s, c.record, string(c.patch)))
	}
	return s.rowResult(ctx, t, c.record, t.updateRow(ctx, s, c.record, string(c.patch)))
}

// applyOwn merges one of this device's planned changes and settles the
// app's row and pending mark, or, for a freshOwn change, queues it (see
// freshBatch).
func (s *applier) applyOwn(ctx context.Context, c fileChange) error {
	if s.freshOwn(c) {
		ns, _ := storedAsCame(c, s.e.deviceID)
		return s.queueFresh(ctx, freshRecord{c: c, ns: ns, own: true})
	}
	if err := s.flushFresh(ctx); err != nil {
		return err
	}
	return s.applyOwnOne(ctx, c)
}

// applyOwnOne is applyOwn, one change at a time.
func (s *applier) applyOwnOne(ctx context.Context, c fileChange) error {
	t := s.e.tables[c.table]
	if s.freshOwn(c) {
		// A new record sent in one write: its state is its patch (see
		// createState), which is also what its row shows.
		st, err := s.createState(ctx, c, s.e.deviceID)
		switch {
		case err != nil:
			return err
		case st == nil:
			return &Error{Op: "apply", Table: c.table, Record: c.record, Err: errors.New("internal error: a record planned without a state has one")}
		}
		return s.freshOwnRow(ctx, c)
	}
	st := &recordState{node: &merge.Node{}}
	if c.flags&planNoState == 0 {
		// Only this engine writes sync_states, so a record it had no
		// state for when planning still has none.
		var err error
		if st, err = s.loadState(ctx, c.table, c.record); err != nil {
			return err
		}
	}
	if c.flags&planNoop == 0 {
		// The writes the upload carries for this change (see
		// ownWrites), stamped as there.
		writes, err := ownWrites(c, s.limits.MaxRecordSize)
		if err != nil {
			return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
		}
		for _, w := range writes {
			if err := applyChange(st.node, w, s.e.deviceID); err != nil {
				return err
			}
		}
		if err := s.storeState(ctx, st, c); err != nil {
			return err
		}
	}
	if s.dirty {
		want := st.node
		if c.flags&planNoop != 0 && c.base == nil {
			// Planned with no row and no edit (see planRecord): still no
			// row is still no edit.
			want = &merge.Node{}
		}
		same, err := s.rowMatches(ctx, t, c.record, want)
		if err != nil {
			return err
		}
		key := recordKey{c.table, c.record}
		if !same {
			// Written again while we synced: keep it pending and lay
			// those writes (from what the row held when the plan read
			// it) over the merged state at the end.
			pe := pendingEdit{}
			if c.base != nil {
				base, err := jsonv.ParseObject(c.base, jsonv.Options{})
				if err != nil {
					return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
				}
				pe.base = &base
			}
			s.pending[key] = pe
			return nil
		}
		if err := s.exec(ctx, `DELETE FROM sync_pending_changes WHERE table_name = ?1 AND record_id = ?2`, c.table, c.record); err != nil {
			return err
		}
		// The same content, but maybe not the same bytes (null members,
		// key order, a projection column written alone): rewrite it.
		return s.writeRow(ctx, t, c.record, st.node)
	} // else clearPending removes all pending marks at once
	if c.flags&planRowCanonical != 0 || !st.node.Exists() {
		return nil // the row already holds exactly this content, or is gone
	}
	if c.base == nil {
		// No row, and no edit: the record's synced state, which the
		// app's row never showed (see planRecord).
		return s.writeRow(ctx, t, c.record, st.node)
	}
	// The row exists (its content is what was planned): update in place.
	return s.rowResult(ctx, t, c.record, t.updateRow(ctx, s, c.record, string(jsonv.Encode(st.node.Value()))))
}

// clearPending removes, when nothing else wrote during the sync, every
// pending mark the plan covered, in one statement: the pending table then
// holds exactly the records planned or skipped.
func (s *applier) clearPending(ctx context.Context) error {
	if s.dirty {
		return nil // cleared one by one in applyOwn
	}
	for _, t := range s.e.order {
		if err := s.exec(ctx, `DELETE FROM sync_pending_changes WHERE table_name = ?1`, t.name); err != nil {
			return err
		}
	}
	for _, r := range s.report.Skipped {
		if err := s.exec(ctx, `INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id) VALUES (?1, ?2)`, r.Table, r.Record); err != nil {
			return err
		}
	}
	return nil
}

// applyReceived merges one change (or state record) from another file,
// or queues it (see freshBatch).
func (s *applier) applyReceived(ctx context.Context, c fileChange) error {
	if ns, ok := s.freshReceived(c); ok {
		return s.queueFresh(ctx, freshRecord{c: c, ns: ns})
	}
	if err := s.flushFresh(ctx); err != nil {
		return err
	}
	return s.applyReceivedOne(ctx, c)
}

// freshReceived returns the state c gives its record if, having none, the
// record takes c as it came (see storedAsCame) and applyReceivedOne would
// then only write its row: a record to be shown in a registered table
// that is not append-only, with nothing written during the sync.
func (s *applier) freshReceived(c fileChange) (newState, bool) {
	if s.dirty || c.deleted {
		return newState{}, false
	}
	if t := s.e.tables[c.table]; t == nil || t.appendOnly {
		return newState{}, false
	}
	if _, ok := s.pending[recordKey{c.table, c.record}]; ok {
		return newState{}, false
	}
	return storedAsCame(c, c.device)
}

// applyReceivedOne is applyReceived, one change at a time.
func (s *applier) applyReceivedOne(ctx context.Context, c fileChange) error {
	st, before, err := s.mergeIntoState(ctx, c, c.device, s.arrived)
	if err != nil {
		return err
	}
	if st.changed {
		s.countReceived(c)
	}
	t := s.e.tables[c.table]
	if t != nil && t.appendOnly {
		// Whether or not its stamp wins, a payload unlike the row held
		// is a conflict (see keepImmutable).
		err := t.receivedImmutable(ctx, s, c)
		// Logged only when the received write won: one that lost to
		// this device's own (sent in this sync, stamped above it)
		// leaves this device's row the synced one, nothing to keep.
		if errors.Is(err, ErrImmutableConflict) && !c.deleted && st.changed {
			if err := s.logImmutable(ctx, t, c); err != nil {
				return err
			}
		}
		if err := s.rowResult(ctx, t, c.record, err); err != nil {
			return err
		}
	}
	if !st.changed {
		return nil
	}
	if t == nil {
		s.report.Unregistered++
		if s.e.detached[c.table] {
			// The app's row still shows the state from before: keep it,
			// so that registering the table again tells the app's
			// edits from what others wrote (see reattachTable).
			var base any
			if before != nil {
				base = string(jsonv.Encode(*before))
			}
			return s.exec(ctx, `INSERT OR IGNORE INTO sync_unwritten (table_name, record_id, base) VALUES (?1, ?2, ?3)`, c.table, c.record, base)
		}
		return nil // kept in sync_states until the app registers the table
	}
	key := recordKey{c.table, c.record}
	if _, ok := s.pending[key]; ok {
		return nil
	}
	if s.dirty {
		var one int
		err := s.queryRow(ctx, `SELECT 1 FROM sync_pending_changes WHERE table_name = ?1 AND record_id = ?2`, []any{c.table, c.record}, &one)
		if err == nil { // the app wrote this record during the sync
			pe := pendingEdit{base: before}
			// A row the app's table refused still held what it kept,
			// not the synced state: the app's edits are from that.
			var kept sql.NullString
			switch err := s.queryRow(ctx, `SELECT base FROM sync_unwritten WHERE table_name = ?1 AND record_id = ?2`, []any{c.table, c.record}, &kept); {
			case err == nil:
				pe.base = nil
				if kept.Valid {
					v, err := jsonv.ParseObject([]byte(kept.String), jsonv.Options{})
					if err != nil {
						return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
					}
					pe.base = &v
				}
			case !errors.Is(err, sql.ErrNoRows):
				return err
			}
			s.pending[key] = pe
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	if st.node == nil { // a new record from a state file, stored as it came
		if c.deleted {
			return s.rowResult(ctx, t, c.record, t.deleteRow(ctx, s, c.record))
		}
		return s.rowResult(ctx, t, c.record, t.writeParsed(ctx, s, c.record, string(c.patch), c.parsed))
	}
	return s.writeRow(ctx, t, c.record, st.node)
}

// countReceived counts c, a received change that changed its record's
// synced state. A server sends a record over its write limit in parts,
// one after another: the record counts once.
func (s *applier) countReceived(c fileChange) {
	if k := (recordKey{c.table, c.record}); k != s.lastReceived {
		s.received++
		s.lastReceived = k
	}
}

// rebasePending gives every record the app wrote during the sync its
// final row: the merged synced state with the app's own edits (the diff
// from the row it started from to the row it wrote) laid on top. The
// record stays pending, so the next sync sends exactly those edits.
func (s *applier) rebasePending(ctx context.Context) error {
	keys := make([]recordKey, 0, len(s.pending))
	for k := range s.pending {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b recordKey) int {
		return cmp.Or(cmp.Compare(a.table, b.table), cmp.Compare(a.record, b.record))
	})
	for _, k := range keys {
		t := s.e.tables[k.table]
		text, ok, err := t.readRow(ctx, s, k.record)
		if err == nil && !ok {
			continue // deleted by the app: the pending delete goes out next time
		}
		if err != nil {
			continue // not valid JSON: leave the app's row alone (reported)
		}
		mine, perr := jsonv.ParseObject([]byte(text), jsonv.Options{})
		if perr != nil {
			continue
		}
		base := s.pending[k].base
		mine, _ = t.rowRecord(base, mine)
		edits := mine
		if base != nil {
			edits = merge.Diff(*base, mine)
		}
		st, err := s.loadState(ctx, k.table, k.record)
		if err != nil {
			return err
		}
		// A record deleted meanwhile by another device comes back whole
		// with the app's edits of its row: they are stamped after the
		// delete, and the next sync sends them (from the hidden fields,
		// recorded as the row's base) as edits, which bring it back. A
		// row the app created is exactly what it wrote, also over a
		// tombstone (the next sync sends it as a new record).
		var merged *jsonv.Value
		if st.node.Exists() || st.node.HasContent() && base != nil {
			v := st.node.Value()
			merged = &v
		}
		if !st.node.Exists() && merged != nil {
			s.revived[k] = string(jsonv.Encode(*merged))
		}
		if err := s.writeContent(ctx, t, k.record, layEdits(merged, edits)); err != nil {
			return err
		}
	}
	return nil
}

// layEdits applies the app's edits (a merge patch) to a synced state (nil:
// none), as RFC 7396 does: the same merge as everywhere else, with stamps
// ordering the edits after the state.
func layEdits(state *jsonv.Value, edits jsonv.Value) jsonv.Value {
	row := &merge.Node{}
	if state != nil {
		row = merge.NewRecordState(*state, merge.Stamp{Version: 1})
	}
	row.ApplyPatch(edits, merge.Stamp{Version: 2})
	return row.Value()
}

// editsSince returns the app's edits of a row of t that showed base (JSON
// text; NULL: no row) and now holds cur. A column base lacks that holds
// its constant default is no edit: the row took the default when a newer
// app version added the column, after base was kept (see rowRecord).
func (t *tableInfo) editsSince(base sql.NullString, cur jsonv.Value) jsonv.Value {
	if !base.Valid {
		return cur
	}
	b, err := jsonv.ParseObject([]byte(base.String), jsonv.Options{})
	if err != nil {
		return cur
	}
	if t.ordinary {
		cur = jsonv.Value{Members: slices.DeleteFunc(slices.Clone(cur.Members), func(m jsonv.Member) bool {
			_, shown := b.Get(m.Key)
			return !shown && t.isDefault(m)
		})}
	}
	return merge.Diff(b, cur)
}

// recordFiles remembers the files applied, uploaded and rejected, empties
// the outbox, moves the cursor, and forgets files that have left both the
// remote and the listing window.
func (s *applier) recordFiles(ctx context.Context) error {
	if s.l.server {
		for _, up := range s.p.uploads {
			if err := s.takeFromOutbox(ctx, up.name); err != nil {
				return err
			}
		}
		if err := setMeta(ctx, s.conn, metaMaxVersion, strconv.FormatInt(s.p.maxSeen, 10)); err != nil {
			return err
		}
		return setMeta(ctx, s.conn, metaServerCursor, s.l.serverCursor)
	}
	gained := s.f.gained()
	for _, up := range s.p.uploads {
		fi, err := up.f.Stat()
		if err != nil {
			return err
		}
		if err := s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size, seq) VALUES (?1, 'applied', ?2, ?3)`, up.name, fi.Size(), up.seq); err != nil {
			return err
		}
		if err := s.takeFromOutbox(ctx, up.name); err != nil {
			return err
		}
		gained.add(s.e.deviceID, up.seq, up.seq)
	}
	if err := holdAlso(ctx, s.conn, gained); err != nil {
		return err
	}

	for _, r := range s.report.Rejected {
		if err := s.exec(ctx, `INSERT INTO sync_files (name, status, size, detail, checked_at, reader, attempts) VALUES (?1, 'rejected', ?2, ?3, ?4, ?5, 1)
ON CONFLICT (name) DO UPDATE SET size = excluded.size, detail = excluded.detail, checked_at = excluded.checked_at, reader = excluded.reader,
	attempts = CASE WHEN status = 'rejected' THEN attempts + 1 ELSE 1 END, status = 'rejected'`,
			r.Name, s.f.rejected[r.Name].size, r.Err.Error(), s.l.cursor.Unix(), s.f.rejected[r.Name].reader); err != nil {
			return err
		}
	}
	// Held by a snapshot applied: its files as applied, the snapshots it
	// knows as checked. A snapshot this device loaded stays applied.
	for name := range s.f.covers {
		status := fileApplied
		if k, _, _, _ := parseFileName(name); k == kindSnapshot {
			status = fileChecked
		}
		if err := s.exec(ctx, `INSERT INTO sync_files (name, status, size) VALUES (?1, ?2, 0)
ON CONFLICT (name) DO UPDATE SET status = CASE WHEN status = 'applied' THEN 'applied' ELSE excluded.status END`, name, status); err != nil {
			return err
		}
	}
	var newest string // the newest snapshot read in this sync
	for _, f := range s.f.checked {
		if err := s.exec(ctx, `INSERT INTO sync_files (name, status, size) VALUES (?1, 'checked', ?2)
ON CONFLICT (name) DO UPDATE SET status = CASE WHEN status = 'applied' THEN 'applied' ELSE 'checked' END, size = excluded.size`, f.Name, f.Size); err != nil {
			return err
		}
		newest = max(newest, f.Name)
	}
	// What the snapshots whose headers this sync read hold, for
	// findVanished; a header that says nothing holds nothing.
	for name, h := range s.f.headers {
		holds := h.holds
		if holds == nil {
			holds = heldSet{}
		}
		if err := s.exec(ctx, `UPDATE sync_files SET holds = ?2 WHERE name = ?1`, name, heldText(holds)); err != nil {
			return err
		}
	}
	for _, d := range s.f.files {
		if d.kind == kindSnapshot {
			newest = max(newest, d.name)
		}
	}
	for _, name := range s.f.forget {
		if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1 AND status = 'rejected'`, name); err != nil {
			return err
		}
	}
	if newest != "" {
		last, err := getMeta(ctx, s.conn, metaSnapshot)
		if err != nil {
			return err
		}
		lastAt, _ := time.Parse(time.RFC3339Nano, last)
		if _, at, _, _ := parseFileName(newest); at.After(lastAt) {
			if err := setMeta(ctx, s.conn, metaSnapshot, at.Format(time.RFC3339Nano)); err != nil {
				return err
			}
		}
	}
	// A snapshot names the applied files it holds, and compaction
	// deletes only those: a file is remembered until a full listing
	// shows it gone (here, or when a snapshot is written), and a rejected
	// one until it is read again and found gone.
	if s.l.since.IsZero() {
		for name := range s.f.ledger {
			if !s.f.listed[name] {
				if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1`, name); err != nil {
					return err
				}
			}
		}
		if err := setMeta(ctx, s.conn, metaListedAll, s.l.cursor.UTC().Format(time.RFC3339Nano)); err != nil {
			return err
		}
	}
	if err := setMeta(ctx, s.conn, metaMaxVersion, strconv.FormatInt(s.p.maxSeen, 10)); err != nil {
		return err
	}
	return setMeta(ctx, s.conn, metaCursor, s.l.cursor.UTC().Format(time.RFC3339Nano))
}

// rowMatches reports whether the app's row holds exactly the content of
// state n (both absent counts as a match).
func (s *applier) rowMatches(ctx context.Context, t *tableInfo, id string, n *merge.Node) (bool, error) {
	text, ok, err := t.readRow(ctx, s, id)
	if err == nil && !ok {
		return !n.Exists(), nil
	}
	if err != nil || !n.Exists() {
		return false, nil
	}
	v, err := jsonv.ParseObject([]byte(text), jsonv.Options{})
	state := n.Value()
	if err != nil {
		return false, nil
	}
	rec, lower := t.rowRecord(&state, v)
	return len(lower) == 0 && jsonv.Equal(rec, state), nil
}

// writeRow makes the app's row show state n, with is_syncing set so the
// triggers stay quiet.
func (s *applier) writeRow(ctx context.Context, t *tableInfo, id string, n *merge.Node) error {
	if !n.Exists() {
		return s.rowResult(ctx, t, id, t.deleteRow(ctx, s, id))
	}
	return s.writeContent(ctx, t, id, n.Value())
}

func (s *applier) writeContent(ctx context.Context, t *tableInfo, id string, v jsonv.Value) error {
	return s.rowResult(ctx, t, id, t.writeRow(ctx, s, id, string(jsonv.Encode(v))))
}

// rowResult turns a failed row write into the sync's error, except when
// the app's own constraints refuse the row (a UNIQUE, NOT NULL or CHECK
// on a projection column, a foreign key): SQLite then undoes only that
// statement, the record stays in sync_states, and retryUnwritten tries
// the row again at the end of this sync and of later ones.
func (s *applier) rowResult(ctx context.Context, t *tableInfo, id string, err error) error {
	key := recordKey{t.name, id}
	if err == nil {
		if _, ok := s.rows[key]; ok || s.tracked[key] {
			s.rows[key] = nil
		}
		return nil
	}
	err = &Error{Op: "write", Table: t.name, Record: id, Err: err}
	if ok, err := refused(ctx, s.conn, err); !ok {
		return err
	}
	s.e.log.Warn("drivesync: row refused by the table's constraints", "table", t.name, "record", id, "err", err)
	s.rows[key] = err
	return nil
}

// hasUnwritten reports whether an earlier sync left rows unwritten: a
// sync with nothing else to do still tries them again, since what refused
// them may have changed outside the synced tables (a parent row of a
// foreign key, a dropped index).
func (s *syncRun) hasUnwritten(ctx context.Context) (bool, error) {
	var found bool
	if err := s.conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sync_unwritten)`).Scan(&found); err != nil {
		return false, &Error{Op: "sync", Err: err}
	}
	return found, nil
}

// retryUnwritten writes again every row the app's table refused, in this
// sync or an earlier one, that was not written since: a change to another
// row (the one that held a UNIQUE value, a parent row) may have made it
// acceptable, and no change of the record itself may ever come to write
// it. Rows are tried until a round writes none, so that one freed value
// can free the next. A record the app has pending is left to its own
// sync, which must not overwrite the app's edits. What is still refused
// is remembered for the next sync and reported in Report.Unwritten.
func (s *applier) retryUnwritten(ctx context.Context) error {
	retry := map[recordKey]bool{}
	bases := map[recordKey]sql.NullString{}
	rows, err := s.conn.QueryContext(ctx, `SELECT table_name, record_id, base FROM sync_unwritten`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var k recordKey
		var base sql.NullString
		if err := rows.Scan(&k.table, &k.record, &base); err != nil {
			rows.Close()
			return err
		}
		retry[k] = true
		bases[k] = base
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for k, err := range s.rows {
		if err != nil {
			retry[k] = true
		}
	}
	// An append-only conflict is reported at every sync until it ends,
	// whatever this sync wrote (see keepImmutable).
	conflicts, err := s.conn.QueryContext(ctx, `SELECT table_name, record_id FROM sync_immutable`)
	if err != nil {
		return err
	}
	for conflicts.Next() {
		var k recordKey
		if err := conflicts.Scan(&k.table, &k.record); err != nil {
			conflicts.Close()
			return err
		}
		if t := s.e.tables[k.table]; t != nil && t.appendOnly {
			retry[k] = true
			if s.rows[k] == nil {
				delete(s.rows, k) // to be written, and so checked, again
			}
		}
	}
	conflicts.Close()
	if err := conflicts.Err(); err != nil {
		return err
	}
	keys := make([]recordKey, 0, len(retry))
	for k := range retry {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b recordKey) int {
		return cmp.Or(cmp.Compare(a.table, b.table), cmp.Compare(a.record, b.record))
	})
	keep := map[recordKey]bool{} // not tried now: still owed a write
	for wrote := true; wrote; {
		wrote = false
		for _, k := range keys {
			if err, done := s.rows[k]; done && err == nil {
				continue
			}
			t := s.e.tables[k.table]
			if t == nil {
				keep[k] = true // written when the app registers the table again
				continue
			}
			if _, ok := s.pending[k]; ok {
				keep[k] = true
				continue
			}
			var one int
			err := s.queryRow(ctx, `SELECT 1 FROM sync_pending_changes WHERE table_name = ?1 AND record_id = ?2`, []any{k.table, k.record}, &one)
			if err == nil {
				keep[k] = true
				continue
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			st, err := s.loadState(ctx, k.table, k.record)
			if err != nil {
				return err
			}
			if err := s.writeRow(ctx, t, k.record, st.node); err != nil {
				return err
			}
			wrote = wrote || s.rows[k] == nil
		}
	}
	if err := s.writeTogether(ctx, keys, keep); err != nil {
		return err
	}
	if err := s.exec(ctx, `DELETE FROM sync_unwritten`); err != nil {
		return err
	}
	for _, k := range keys {
		refusal := s.rows[k]
		if !keep[k] && refusal == nil {
			continue
		}
		// What the app's row shows: the app's edits of a refused row are
		// the difference from it (see planRecord). A row left alone
		// (pending, or its table unregistered) keeps its base; one the
		// engine just failed to write shows what it showed before.
		base, known := bases[k]
		pe, pending := s.pending[k]
		switch t := s.e.tables[k.table]; {
		case pending && refusal != nil:
			// A row with the app's pending edits that the table
			// refused to rebase on what this sync brought: it still
			// shows what it showed before, the edits on top of their
			// base (the row itself would hide the edits from the next
			// plan).
			base = sql.NullString{}
			if pe.base != nil {
				base = sql.NullString{String: string(jsonv.Encode(*pe.base)), Valid: true}
			}
		case !(known && keep[k]) && t != nil:
			text, ok, err := t.readRow(ctx, s, k.record)
			if err != nil {
				return err
			}
			base = sql.NullString{String: text, Valid: ok}
		}
		if err := s.exec(ctx, `INSERT INTO sync_unwritten (table_name, record_id, base) VALUES (?1, ?2, ?3)`, k.table, k.record, base); err != nil {
			return err
		}
		if refusal != nil {
			s.report.Unwritten = append(s.report.Unwritten, RecordError{Table: k.table, Record: k.record, Err: refusal})
		}
	}
	return nil
}

// writeTogether writes at once the rows of a table that its UNIQUE
// constraints still refuse one at a time. Rows that trade the values of a
// UNIQUE column (two items swapping their positions) can never be written
// one by one: each row's new value is held by the other until that one
// changes. In a savepoint, the rows of those records are deleted, then
// written from their synced states, each in a savepoint of its own; if
// the table refuses some even so, the whole is rolled back and tried
// again without them (see tryTogether). A table whose deletes reach past
// its own rows is left alone: a foreign key that cascades from it
// (foreign keys on) or an app trigger on its deletes or inserts would see
// the rows go. Rows refused for another reason (a CHECK, NOT NULL, a
// foreign key) are no part of it: no order of writes changes that.
func (s *applier) writeTogether(ctx context.Context, keys []recordKey, keep map[recordKey]bool) error {
	var groups [][]recordKey // keys are sorted by table
	for _, k := range keys {
		t := s.e.tables[k.table]
		if err := s.rows[k]; err == nil || keep[k] || t == nil || t.appendOnly || uniqueRefusal(err) == "" {
			continue
		}
		if n := len(groups); n > 0 && groups[n-1][0].table == k.table {
			groups[n-1] = append(groups[n-1], k)
		} else {
			groups = append(groups, []recordKey{k})
		}
	}
	for _, group := range groups {
		if len(group) < 2 {
			continue
		}
		t := s.e.tables[group[0].table]
		alone, err := deletesStayInTable(ctx, s.conn, t.name)
		if err != nil {
			return err
		}
		if !alone {
			continue
		}
		defer_, err := deferKeys(ctx, s.conn, t)
		if err != nil {
			return err
		}
		// Each try takes rows out of the group or moves rows to its
		// front, each row at most once: at most two tries per row.
		promoted := map[recordKey]bool{}
		for len(group) >= 2 {
			refusals, err := s.tryTogether(ctx, t, group, defer_)
			if err != nil {
				return err
			}
			if len(refusals) == 0 {
				s.e.log.Info("drivesync: rows the table refused one at a time written together", "table", t.name, "rows", len(group))
				for _, k := range group {
					s.rows[k] = nil
				}
				break
			}
			var first, rest []recordKey
			for i, k := range group {
				refusal, ok := refusals[i]
				switch {
				case !ok:
					rest = append(rest, k)
				case i > 0 && !promoted[k] && uniqueRefusal(refusal) != "" && uniqueRefusal(refusal) != uniqueRefusal(s.rows[k]):
					// Refused over another value than on its own: a
					// row written before it took one it keeps (that
					// row is the one refused on its own). It goes
					// first, once.
					promoted[k] = true
					first = append(first, k)
				}
				// Else refused as on its own, by a row outside the
				// group, or twice: it leaves the group.
			}
			group = append(first, rest...)
		}
	}
	return nil
}

// uniqueRefusalRE finds, in a refusal, the UNIQUE constraint that SQLite's
// message names: "UNIQUE constraint failed: items.pos".
var uniqueRefusalRE = regexp.MustCompile(`UNIQUE constraint failed: [^()]*[^() ]`)

// uniqueRefusal returns the UNIQUE constraint refusal err names, "" if
// none.
func uniqueRefusal(err error) string {
	if err == nil {
		return ""
	}
	return uniqueRefusalRE.FindString(err.Error())
}

// tryTogether writes group's rows of t together in a savepoint (see
// writeTogether): it deletes them all, then writes each from its synced
// state in a savepoint of its own. If the table refuses none, the writes
// stay; else they are all rolled back, and it returns the refusals by
// index in group. A row whose delete is refused keeps its row and is
// refused too. With deferKeys, foreign keys are checked at commit, not at
// each delete.
func (s *applier) tryTogether(ctx context.Context, t *tableInfo, group []recordKey, deferKeys bool) (map[int]error, error) {
	if err := s.exec(ctx, `SAVEPOINT drivesync_together`); err != nil {
		return nil, err
	}
	if deferKeys {
		if err := s.exec(ctx, `PRAGMA defer_foreign_keys = ON`); err != nil {
			return nil, err
		}
		defer s.exec(context.WithoutCancel(ctx), `PRAGMA defer_foreign_keys = OFF`)
	}
	refusals := map[int]error{}
	// each runs op on row i in a savepoint of its own, and notes a
	// refusal.
	each := func(i int, op func() error) error {
		if err := s.exec(ctx, `SAVEPOINT drivesync_row`); err != nil {
			return err
		}
		err := op()
		if ok, rerr := refused(ctx, s.conn, err); rerr != nil {
			// A trigger that raises ROLLBACK ends the transaction,
			// which refused reports as an error.
			return rerr
		} else if ok {
			refusals[i] = err
			if err := s.exec(ctx, `ROLLBACK TO drivesync_row`); err != nil {
				return err
			}
		}
		return s.exec(ctx, `RELEASE drivesync_row`)
	}
	states := make([]*recordState, len(group))
	for i, k := range group {
		st, err := s.loadState(ctx, k.table, k.record)
		if err != nil {
			return nil, err
		}
		states[i] = st
		if !st.node.Exists() {
			// Not a row a UNIQUE refused; and with foreign keys
			// deferred, its delete could leave children pointing
			// nowhere unnoticed. It stays out.
			refusals[i] = rowErrorf("table %s, record %s: deleted, not written together", t.name, k.record)
			continue
		}
		if err := each(i, func() error { return t.deleteRow(ctx, s, k.record) }); err != nil {
			return nil, err
		}
	}
	for i, k := range group {
		if _, ok := refusals[i]; ok {
			continue
		}
		if err := each(i, func() error { return t.writeRow(ctx, s, k.record, string(jsonv.Encode(states[i].node.Value()))) }); err != nil {
			return nil, err
		}
	}
	if len(refusals) > 0 {
		if err := s.exec(ctx, `ROLLBACK TO drivesync_together`); err != nil {
			return nil, err
		}
	}
	return refusals, s.exec(ctx, `RELEASE drivesync_together`)
}

// deferKeys reports whether writeTogether may defer foreign keys to the
// commit while it deletes and writes again rows of t: foreign keys are
// on, t has none of its own (a row written again could point nowhere),
// and every foreign key that references t names its primary key, which a
// row written again keeps. A delete then breaks no reference for longer
// than the savepoint: the row comes back with its key. Without deferring,
// a row with a child (a plain REFERENCES) could never be deleted, and its
// swap never written.
func deferKeys(ctx context.Context, q querier, t *tableInfo) (bool, error) {
	var on, own, other int
	err := q.QueryRowContext(ctx, `SELECT (SELECT foreign_keys FROM pragma_foreign_keys),
	(SELECT count(*) FROM pragma_foreign_key_list(?1)),
	(SELECT count(*) FROM sqlite_master m, pragma_foreign_key_list(m.name) f
		WHERE m.type = 'table' AND f."table" = ?1 COLLATE NOCASE AND (f."to" IS NOT NULL AND NOT EXISTS
			(SELECT 1 FROM pragma_table_info(?1) c WHERE c.name = f."to" COLLATE NOCASE AND c.pk > 0)))`, t.name).Scan(&on, &own, &other)
	return err == nil && on == 1 && own == 0 && other == 0, err
}

// deletesStayInTable reports whether deleting a row of table and
// inserting it again touches nothing else: no app trigger on the table,
// in the schema or a TEMP one, that fires for the engine's writes (one
// guarded as the README asks does not), and no foreign key that acts on
// its deletes while foreign keys are on. A trigger that fires for the
// engine's writes would see rows go and come back, or, on updates, miss
// their new values: a delete and an insert do not fire it.
func deletesStayInTable(ctx context.Context, q querier, table string) (bool, error) {
	var cascades int
	err := q.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sqlite_master m, pragma_foreign_key_list(m.name) f
		WHERE m.type = 'table' AND f."table" = ?1 COLLATE NOCASE AND f.on_delete NOT IN ('NO ACTION', 'RESTRICT'))
		* (SELECT foreign_keys FROM pragma_foreign_keys)`, table).Scan(&cascades)
	if err != nil || cascades > 0 {
		return false, err
	}
	rows, err := q.QueryContext(ctx, `SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE AND substr(name, 1, length(?2)) <> ?2
UNION ALL SELECT sql FROM sqlite_temp_master WHERE type = 'trigger' AND tbl_name = ?1 COLLATE NOCASE`, table, triggerPrefix)
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

// engineGuard is the WHEN clause the README gives a trigger that must
// skip the engine's writes, without its blanks.
const engineGuard = "(SELECTIS_SYNCINGFROMSYNC_CONTROL)=0"

// skipsEngineWrites reports whether a CREATE TRIGGER statement's WHEN
// clause is exactly the README's guard: the trigger never fires while the
// engine writes. Any other condition is taken to fire.
func skipsEngineWrites(def string) bool {
	words := strings.Fields(strings.ToUpper(def))
	when := slices.Index(words, "WHEN")
	begin := slices.Index(words, "BEGIN")
	return when >= 0 && begin > when && strings.Join(words[when+1:begin], "") == engineGuard
}

// recordState is a record's merge state as loaded from sync_states.
type recordState struct {
	node    *merge.Node
	data    *jsonv.Value // synced content before this change, nil if none
	stored  string       // stored record_data + clock, to skip no-op writes
	changed bool
}

func (s *syncRun) loadState(ctx context.Context, table, record string) (*recordState, error) {
	var data, clock string
	var deleted bool
	err := s.queryRow(ctx, `SELECT record_data, clock, is_deleted FROM sync_states WHERE table_name = ?1 AND record_id = ?2`, []any{table, record}, &data, &clock, &deleted)
	if errors.Is(err, sql.ErrNoRows) {
		return &recordState{node: &merge.Node{}}, nil
	}
	if err != nil {
		return nil, err
	}
	st := &recordState{stored: data + "\x00" + clock}
	content, err := jsonv.ParseObject([]byte(data), jsonv.Options{})
	if err != nil {
		return nil, &Error{Op: "load state", Table: table, Record: record, Err: err}
	}
	if !deleted {
		st.data = &content
	}
	if st.node, err = merge.DecodeState(content, []byte(clock), deleted); err != nil {
		return nil, &Error{Op: "load state", Table: table, Record: record, Err: err}
	}
	return st, nil
}

// storeState stores st, the state of c's record, if it changed.
func (s *syncRun) storeState(ctx context.Context, st *recordState, c fileChange) error {
	data, clock := merge.EncodeState(st.node)
	if data+"\x00"+clock == st.stored {
		return nil
	}
	st.changed = true
	st.stored = data + "\x00" + clock
	err := s.exec(ctx, `INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (table_name, record_id) DO UPDATE SET record_data = excluded.record_data, clock = excluded.clock,
	sync_version = excluded.sync_version, device_id = excluded.device_id, is_deleted = excluded.is_deleted`,
		c.table, c.record, data, clock, st.node.Newest().Version, st.node.Newest().Device, !st.node.Exists())
	if err != nil {
		return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	return nil
}

// mergeIntoState merges c, written by device, into the record's stored
// state and returns it with the content it had before (nil if none).
// arrived keeps what a change of another device brings (see arrivals);
// it is nil for this device's own.
func (s *syncRun) mergeIntoState(ctx context.Context, c fileChange, device string, arrived *arrivals) (st *recordState, before *jsonv.Value, err error) {
	if st, err = s.createState(ctx, c, device); err != nil || st != nil {
		if st != nil {
			arrived.created(c)
		}
		return st, nil, err
	}
	if st, err = s.loadState(ctx, c.table, c.record); err != nil {
		return nil, nil, err
	}
	before = st.data
	if c.clock != nil {
		return st, before, s.mergeState(ctx, st, c, arrived)
	}
	// Another device's write over values it had not seen: the conflict
	// log keeps those it overwrites. The patch is parsed once for both.
	var cands []overwritten
	var seen map[string]merge.Stamp
	at := merge.Stamp{Version: c.version, Device: device}
	if !c.deleted && c.seen != nil && device != s.e.deviceID && st.node.Exists() {
		seen = parseSeen(c.seen)
	}
	if seen != nil {
		p, err := jsonv.ParseObject(c.patch, jsonv.Options{KeepNulls: true})
		if err != nil {
			return nil, nil, &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
		}
		cands = overwrites(st.node, p, seen, at, arrived)
		applyWrite(st.node, c, device, p)
	} else if err := applyChange(st.node, c, device); err != nil {
		return nil, nil, err
	}
	if err := s.storeState(ctx, st, c); err != nil {
		return nil, nil, err
	}
	if st.changed {
		arrived.addWrite(at) // a write applied again changes nothing
	}
	return st, before, s.logConflicts(ctx, c, st.node, cands)
}

// mergeState merges c, a record's state from a state file or a sync
// server, into st, the record's stored state, and stores it.
func (s *syncRun) mergeState(ctx context.Context, st *recordState, c fileChange, arrived *arrivals) error {
	o, err := changeState(c)
	if err != nil {
		return err
	}
	// A sync server's state, with what its writes had seen.
	var cands []overwritten
	if c.seen != nil && st.node.Exists() {
		if entries := merge.ParseStateSeen(c.seen); entries != nil {
			cands = s.stateOverwrites(st.node, entries, arrived)
		}
	}
	arrived.placedBy(c, st.node, o)
	st.node.Merge(o)
	if err := s.storeState(ctx, st, c); err != nil {
		return err
	}
	return s.logConflicts(ctx, c, st.node, cands)
}

// createState stores the state c alone gives, if the record has none
// yet, and returns it; it returns nil if the record already has a state.
// A received record is usually new, so trying the insert first saves a
// lookup. A state file's record is stored as it came (validated and
// canonical), with a nil node, and so is a fresh write's (see freshWrite).
func (s *syncRun) createState(ctx context.Context, c fileChange, device string) (*recordState, error) {
	var n *merge.Node
	ns, ok := storedAsCame(c, device)
	if !ok {
		n = &merge.Node{}
		if err := applyChange(n, c, device); err != nil {
			return nil, err
		}
		ns.data, ns.clock = merge.EncodeState(n)
		ns.at, ns.gone = n.Newest(), !n.Exists()
	}
	st, err := s.stmt(ctx, `INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (table_name, record_id) DO NOTHING`)
	if err != nil {
		return nil, err
	}
	res, err := st.ExecContext(ctx, c.table, c.record, ns.data, ns.clock, ns.at.Version, ns.at.Device, ns.gone)
	if err != nil {
		return nil, &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	if k, err := res.RowsAffected(); err != nil || k == 0 {
		return nil, err
	}
	return &recordState{node: n, changed: true}, nil
}

// A newState is what createState stores for a record that has no state.
type newState struct {
	data, clock string
	at          merge.Stamp // the newest stamp: sync_version, device_id
	gone        bool
}

// storedAsCame returns the state c, stamped by device, gives a record that
// has none, if it is c as it came: a state file's record (validated and
// canonical), or a fresh write (see freshWrite), whose record is its
// patch with every path at the write's stamp; either has its row written
// with the patch. ok is false for a change whose state must be built by
// merging it into an empty record.
func storedAsCame(c fileChange, device string) (ns newState, ok bool) {
	switch {
	case freshWrite(c):
		at := merge.Stamp{Version: c.version, Device: device}
		return newState{string(c.patch), merge.FreshClock(at), at, false}, true
	case c.clock != nil:
		return newState{string(c.patch), string(c.clock), merge.Stamp{Version: c.version, Device: c.device}, c.deleted}, true
	}
	return newState{}, false
}
