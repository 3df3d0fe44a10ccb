package drivesync

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// Sync runs one sync cycle (seed 000, "同期の詳細手順"):
//
//  1. List the remote and download, validate and spool every patch file
//     not applied yet. Malformed files are rejected and reported; they
//     stop nothing else.
//  2. Read the pending records and diff each against its synced state
//     from before this sync's downloads, so that a field another device
//     changed is never sent back with its old value.
//  3. Stamp the changes maxSeen+1+i, where maxSeen covers the synced
//     state, the downloaded files and any earlier reservation.
//  4. Upload them as one gzip patch file.
//  5. In one transaction: merge the downloaded and own changes into
//     sync_states, write the app's tables from it, clear the pending
//     records that were sent, and commit. If the commit fails, the
//     uploaded file is deleted again.
//
// The app may keep writing while Sync runs: a record it changes during a
// sync stays pending, and its row ends as the merged synced state with
// the app's edits laid on top.
//
// Sync returns a Report even when it fails, describing what was done.
// Rejected remote files are reported in Report.Rejected, not as an error.
func (e *Engine) Sync(ctx context.Context) (Report, error) {
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return Report{}, ctx.Err()
	}
	defer func() { <-e.sem }()
	if e.closed.Load() {
		return Report{}, &Error{Op: "sync", Err: ErrClosed}
	}
	conn, err := e.db.Conn(ctx)
	if err != nil {
		return Report{}, &Error{Op: "sync", Err: err}
	}
	defer conn.Close()
	s := &syncRun{e: e, conn: conn, pending: map[recordKey]pendingEdit{}, rejectedSizes: map[string]int64{}}
	defer s.cleanup()
	err = s.run(ctx)
	return s.report, err
}

type recordKey struct{ table, record string }

// pendingEdit is a record the app wrote while the sync ran. base is the
// content the app's row had before those writes (nil: no row).
type pendingEdit struct{ base *jsonv.Value }

// syncRun holds the state of one Sync call.
type syncRun struct {
	e      *Engine
	conn   *sql.Conn
	report Report

	cursor        time.Time
	listed        map[string]bool
	known         map[string]knownFile
	download      []*downloaded
	rejectedSizes map[string]int64
	maxSeen       int64

	dataVersion int64  // PRAGMA data_version when the pending rows were read
	plan        *spool // every pending record, in version order
	upload      *os.File
	sent        int // changes in the upload file

	dirty   bool // another connection committed since the pending rows were read
	pending map[recordKey]pendingEdit
	stmts   map[string]*sql.Stmt
}

type knownFile struct {
	status string // "applied" or "rejected"
	size   int64
}

type downloaded struct {
	name  string
	size  int64
	at    time.Time
	spool *spool
}

func (s *syncRun) cleanup() {
	for _, d := range s.download {
		if d.spool != nil {
			d.spool.close()
		}
	}
	if s.plan != nil {
		s.plan.close()
	}
	if s.upload != nil {
		s.upload.Close()
		os.Remove(s.upload.Name())
	}
	for _, st := range s.stmts {
		st.Close()
	}
}

func (s *syncRun) hook(point string) error {
	if s.e.testHook == nil {
		return nil
	}
	if err := s.e.testHook(point); err != nil {
		return &Error{Op: point, Err: err}
	}
	return nil
}

func (s *syncRun) run(ctx context.Context) error {
	if err := s.fetch(ctx); err != nil {
		return err
	}
	if err := s.hook("fetched"); err != nil {
		return err
	}
	if err := s.buildPlan(ctx); err != nil {
		return err
	}
	if err := s.hook("planned"); err != nil {
		return err
	}
	if s.plan.n == 0 && len(s.download) == 0 && len(s.report.Rejected) == 0 {
		return nil // nothing to do: no write transaction at all
	}
	if s.sent > 0 {
		if err := s.send(ctx); err != nil {
			return err
		}
	}
	err := s.hook("uploaded")
	if err == nil {
		err = s.commit(ctx)
	}
	if err != nil {
		if s.report.Uploaded != "" {
			// The changes stay pending and will be sent again with new
			// versions; take back the file so others do not apply it
			// twice. If this fails too, applying it is harmless.
			if derr := s.e.cfg.Remote.Delete(context.WithoutCancel(ctx), s.report.Uploaded); derr != nil {
				s.e.log.Warn("drivesync: could not delete uploaded file after failed commit", "file", s.report.Uploaded, "err", derr)
			}
			s.report.Uploaded, s.report.ChangesSent = "", 0
		}
		return err
	}
	return nil
}

func remoteErr(op, file string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Op: op, File: file, Err: err}
	}
	return &Error{Op: op, File: file, Err: fmt.Errorf("%w: %w", ErrRemote, err)}
}

// fetch lists the remote and spools every patch file not applied yet.
func (s *syncRun) fetch(ctx context.Context) error {
	e := s.e
	cur, err := getMeta(ctx, s.conn, metaCursor)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	var since time.Time
	if cur != "" {
		if s.cursor, err = time.Parse(time.RFC3339Nano, cur); err == nil {
			since = s.cursor.Add(-e.cfg.ListOverlap)
		}
	}
	e.progress("list", 0, 1)
	files, err := e.cfg.Remote.List(ctx, since)
	if err != nil {
		return remoteErr("list", "", err)
	}
	e.progress("list", 1, 1)
	s.known = map[string]knownFile{}
	rows, err := s.conn.QueryContext(ctx, `SELECT name, status, size FROM sync_files`)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	for rows.Next() {
		var name string
		var k knownFile
		if err := rows.Scan(&name, &k.status, &k.size); err != nil {
			rows.Close()
			return &Error{Op: "sync", Err: err}
		}
		s.known[name] = k
	}
	rows.Close()
	s.listed = map[string]bool{}
	for _, f := range files {
		at, _, ok := parsePatchName(f.Name)
		if !ok {
			continue // not ours: snapshots of later versions, other apps' files
		}
		s.listed[f.Name] = true
		if at.After(s.cursor) {
			s.cursor = at
		}
		k, seen := s.known[f.Name]
		if seen && (k.status == "applied" || k.size == f.Size) {
			continue // applied, or rejected and unchanged since
		}
		s.download = append(s.download, &downloaded{name: f.Name, size: f.Size, at: at})
	}
	slices.SortFunc(s.download, func(a, b *downloaded) int { return cmp.Compare(a.name, b.name) })
	for i, d := range s.download {
		e.progress("download", i, len(s.download))
		if err := s.fetchFile(ctx, d); err != nil {
			return err
		}
	}
	e.progress("download", len(s.download), len(s.download))
	s.download = slices.DeleteFunc(s.download, func(d *downloaded) bool { return d.spool == nil })
	return nil
}

// fetchFile downloads one file into a spool. A file that turns out to be
// malformed is rejected (reported, d.spool left nil); a remote failure
// fails the sync.
func (s *syncRun) fetchFile(ctx context.Context, d *downloaded) error {
	e := s.e
	_, device, _ := parsePatchName(d.name)
	if d.size > e.cfg.MaxFileSize {
		s.reject(d, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrFileTooLarge, d.size, e.cfg.MaxFileSize))
		return nil
	}
	rc, err := e.cfg.Remote.Open(ctx, d.name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // deleted since the listing: nothing to apply
	}
	if err != nil {
		return remoteErr("download", d.name, err)
	}
	defer rc.Close()
	sp, err := newSpool(e.cfg.TempDir)
	if err != nil {
		return &Error{Op: "download", File: d.name, Err: err}
	}
	var maxV int64
	src := &countingReader{r: &limitedReader{r: rc, n: e.cfg.MaxFileSize, what: "compressed file"}}
	err = decodePatchFile(src, device, e.cfg.MaxExpandedSize, func(c fileChange) error {
		maxV = max(maxV, c.version)
		return sp.add(c)
	})
	if err != nil {
		sp.close()
		if ctx.Err() != nil {
			return &Error{Op: "download", File: d.name, Err: ctx.Err()}
		}
		if src.failed != nil {
			return remoteErr("download", d.name, src.failed)
		}
		switch {
		case errors.Is(err, ErrUnsupportedFormat):
		case errors.Is(err, errTooLarge):
			err = fmt.Errorf("%w: %w", ErrFileTooLarge, err)
		default:
			err = fmt.Errorf("%w: %w", ErrCorruptFile, err)
		}
		s.reject(d, err)
		return nil
	}
	d.spool = sp
	s.maxSeen = max(s.maxSeen, maxV)
	return nil
}

func (s *syncRun) reject(d *downloaded, err error) {
	s.e.log.Warn("drivesync: rejected remote file", "file", d.name, "err", err)
	s.rejectedSizes[d.name] = d.size
	s.report.Rejected = append(s.report.Rejected, FileError{Name: d.name, Err: &Error{Op: "read", File: d.name, Err: err}})
}

// countingReader remembers a read error of the underlying remote stream,
// to tell a network failure from a malformed file.
type countingReader struct {
	r      io.Reader
	failed error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF && !errors.Is(err, errTooLarge) {
		c.failed = err
	}
	return n, err
}

// buildPlan reads every pending record in one read transaction, diffs it
// against its synced state, stamps the changes and writes them to the
// plan spool and the upload file.
func (s *syncRun) buildPlan(ctx context.Context) (err error) {
	e := s.e
	if err := s.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&s.dataVersion); err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if _, err := s.conn.ExecContext(ctx, "BEGIN DEFERRED"); err != nil {
		return &Error{Op: "sync", Err: err}
	}
	defer s.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT") // read-only: ends the snapshot
	seen, err := getMetaInt(ctx, s.conn, metaMaxVersion)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	s.maxSeen = max(s.maxSeen, seen)
	versions := newVersionCounter(s.maxSeen)

	if s.plan, err = newSpool(e.cfg.TempDir); err != nil {
		return err
	}
	var pw *patchWriter
	for _, t := range e.order {
		rows, err := s.conn.QueryContext(ctx, t.pendingSQL(), t.name)
		if err != nil {
			return &Error{Op: "read pending", Table: t.name, Err: err}
		}
		for rows.Next() {
			var id string
			var content, synced sql.NullString
			var rowExists, rowCanonical, deleted sql.NullBool
			if err := rows.Scan(&id, &rowExists, &content, &rowCanonical, &synced, &deleted); err != nil {
				rows.Close()
				return &Error{Op: "read pending", Table: t.name, Err: err}
			}
			c, skip := s.planRecord(t, id, rowExists.Bool, content, rowCanonical.Bool, synced, deleted.Bool)
			if skip {
				continue
			}
			if c.flags&planNoop == 0 {
				c.version = versions.take()
				if pw == nil {
					if pw, err = s.newUpload(); err != nil {
						rows.Close()
						return err
					}
				}
				if err := pw.add(c.table, c.record, c.patch, c.deleted, c.version); err != nil {
					rows.Close()
					return &Error{Op: "write upload", Err: err}
				}
				s.sent++
			}
			if err := s.plan.add(c); err != nil {
				rows.Close()
				return &Error{Op: "write plan", Err: err}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return &Error{Op: "read pending", Table: t.name, Err: err}
		}
	}
	if pw != nil {
		if err := pw.close(); err != nil {
			return &Error{Op: "write upload", Err: err}
		}
		s.maxSeen = versions.last()
	}
	return nil
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
		canonical += fmt.Sprintf(" AND c.%s IS json_extract(c.content, '$.%s')", quoteIdent(col), col)
	}
	return fmt.Sprintf(`SELECT p.record_id, c.id IS NOT NULL,
	CASE WHEN typeof(c.content) = 'text' THEN c.content WHEN %[1]s THEN json(c.content) END,
	CASE WHEN %[1]s THEN %[2]s ELSE 0 END,
	s.record_data, s.is_deleted
FROM sync_pending_changes p
LEFT JOIN %[3]s c ON c.id = p.record_id
LEFT JOIN sync_states s ON s.table_name = p.table_name AND s.record_id = p.record_id
WHERE p.table_name = ?1
ORDER BY p.record_id`, contentOK, canonical, quoteIdent(t.name))
}

// planRecord turns one pending record into a planned change. skip is set
// (and the record reported) when its content cannot be synced.
func (s *syncRun) planRecord(t *tableInfo, id string, rowExists bool, content sql.NullString, rowCanonical bool, synced sql.NullString, syncedDeleted bool) (c fileChange, skip bool) {
	c = fileChange{table: t.name, record: id}
	if !synced.Valid {
		c.flags |= planNoState
	}
	var old *jsonv.Value
	if synced.Valid && !syncedDeleted {
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
	case !rowExists && old == nil:
		c.flags = planNoop | planRowCanonical // created and deleted between syncs
	case !rowExists:
		c.deleted, c.patch = true, []byte("{}")
	default:
		cur, err := jsonv.ParseObject([]byte(content.String), jsonv.Options{})
		if err != nil {
			s.skipRecord(t.name, id, fmt.Errorf("content is not a JSON object: %w", err))
			return c, true
		}
		enc := jsonv.Encode(cur)
		if rowCanonical && string(enc) == content.String {
			c.flags |= planRowCanonical
		}
		if old == nil {
			c.patch = enc
		} else if d := diff(*old, cur); len(d.Members) > 0 {
			c.patch = jsonv.Encode(d)
		} else {
			c.flags |= planNoop
		}
	}
	return c, false
}

func (s *syncRun) skipRecord(table, id string, err error) {
	s.e.log.Warn("drivesync: record not synced", "table", table, "record", id, "err", err)
	s.report.Skipped = append(s.report.Skipped, RecordError{Table: table, Record: id, Err: &Error{Op: "read", Table: table, Record: id, Err: err}})
}

func (s *syncRun) newUpload() (*patchWriter, error) {
	f, err := os.CreateTemp(s.e.cfg.TempDir, "drivesync-upload-*")
	if err != nil {
		return nil, &Error{Op: "write upload", Err: err}
	}
	s.upload = f
	return newPatchWriter(f, s.e.deviceID)
}

// send reserves the versions it is about to publish, then uploads.
// Reserving first means that if the process dies after the upload but
// before the commit, the next sync still numbers its changes above the
// ones in that file, even if the remote lists it late: a stamp never
// names two different writes.
func (s *syncRun) send(ctx context.Context) error {
	e := s.e
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "reserve versions", Err: err}
	}
	if err := setMeta(ctx, s.conn, metaMaxVersion, strconv.FormatInt(s.maxSeen, 10)); err != nil {
		s.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return &Error{Op: "reserve versions", Err: err}
	}
	if _, err := s.conn.ExecContext(ctx, "COMMIT"); err != nil {
		s.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return &Error{Op: "reserve versions", Err: err}
	}
	e.progress("upload", 0, 1)
	for attempt := 0; ; attempt++ {
		now, err := e.cfg.Remote.Now(ctx)
		if err != nil {
			return remoteErr("upload", "", err)
		}
		name := patchFileName(now, e.deviceID)
		if _, err := s.upload.Seek(0, io.SeekStart); err != nil {
			return &Error{Op: "upload", File: name, Err: err}
		}
		err = e.cfg.Remote.Create(ctx, name, s.upload)
		if errors.Is(err, fs.ErrExist) && attempt < 3 {
			time.Sleep(time.Millisecond) // same millisecond as an earlier file
			continue
		}
		if err != nil {
			return remoteErr("upload", name, err)
		}
		s.report.Uploaded, s.report.ChangesSent = name, s.sent
		if now.After(s.cursor) {
			s.cursor = now
		}
		e.progress("upload", 1, 1)
		e.log.Info("drivesync: uploaded", "file", name, "changes", s.sent)
		return nil
	}
}

// commit applies everything in one write transaction.
func (s *syncRun) commit(ctx context.Context) error {
	e := s.e
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "apply", Err: err}
	}
	err := s.apply(ctx)
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
	e.log.Info("drivesync: synced", "downloaded", len(s.report.Downloaded), "received", s.report.ChangesReceived, "sent", s.report.ChangesSent)
	return nil
}

func (s *syncRun) apply(ctx context.Context) error {
	e := s.e
	var dv int64
	if err := s.conn.QueryRowContext(ctx, `PRAGMA data_version`).Scan(&dv); err != nil {
		return err
	}
	// If no other connection committed since the pending rows were read,
	// the app wrote nothing during this sync and no row needs checking.
	s.dirty = dv != s.dataVersion
	for _, r := range s.report.Skipped {
		s.pending[recordKey{r.Table, r.Record}] = pendingEdit{} // never overwrite them
	}
	if _, err := s.conn.ExecContext(ctx, `UPDATE sync_control SET is_syncing = 1`); err != nil {
		return err
	}
	total := 1 + len(s.download)
	e.progress("apply", 0, total)
	if err := s.plan.each(func(c fileChange) error { return s.applyOwn(ctx, c) }); err != nil {
		return err
	}
	if err := s.clearPending(ctx); err != nil {
		return err
	}
	for i, d := range s.download {
		_, device, _ := parsePatchName(d.name)
		err := d.spool.each(func(c fileChange) error { return s.applyReceived(ctx, c, device) })
		if err != nil {
			return err
		}
		s.report.Downloaded = append(s.report.Downloaded, d.name)
		s.report.ChangesReceived += d.spool.n
		if _, err := s.conn.ExecContext(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size) VALUES (?, 'applied', ?)`, d.name, d.size); err != nil {
			return err
		}
		e.progress("apply", i+1, total)
	}
	if err := s.rebasePending(ctx); err != nil {
		return err
	}
	if err := s.recordFiles(ctx); err != nil {
		return err
	}
	_, err := s.conn.ExecContext(ctx, `UPDATE sync_control SET is_syncing = 0`)
	e.progress("apply", total, total)
	return err
}

// applyOwn merges one of this device's planned changes and settles the
// app's row and pending mark.
func (s *syncRun) applyOwn(ctx context.Context, c fileChange) error {
	t := s.e.tables[c.table]
	st := &recordState{node: &node{}}
	if c.flags&planNoState == 0 {
		// Only this engine writes sync_states, so a record it had no
		// state for when planning still has none.
		var err error
		if st, err = s.loadState(ctx, c.table, c.record); err != nil {
			return err
		}
	}
	if c.flags&planNoop == 0 {
		if err := s.mergeChange(ctx, st, c, s.e.deviceID); err != nil {
			return err
		}
	}
	if s.dirty {
		same, err := s.rowMatches(ctx, t, c.record, st.node)
		if err != nil {
			return err
		}
		key := recordKey{c.table, c.record}
		if !same {
			// Written again while we synced: keep it pending and lay
			// those writes over the merged state at the end.
			pe := pendingEdit{}
			if st.node.exists() {
				base := st.node.value()
				pe.base = &base
			}
			s.pending[key] = pe
			return nil
		}
		if err := s.exec(ctx, `DELETE FROM sync_pending_changes WHERE table_name = ?1 AND record_id = ?2`, c.table, c.record); err != nil {
			return err
		}
	} // else clearPending removes all pending marks at once
	if c.flags&planRowCanonical != 0 || !st.node.exists() {
		return nil // the row already holds exactly this content, or is gone
	}
	// The row exists (its content is what was planned): update in place.
	if err := s.exec(ctx, t.updateSQL, c.record, string(jsonv.Encode(st.node.value()))); err != nil {
		return &Error{Op: "write", Table: t.name, Record: c.record, Err: err}
	}
	return nil
}

// clearPending removes, when nothing else wrote during the sync, every
// pending mark the plan covered, in one statement: the pending table then
// holds exactly the records planned or skipped.
func (s *syncRun) clearPending(ctx context.Context) error {
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

// applyReceived merges one change from another file.
func (s *syncRun) applyReceived(ctx context.Context, c fileChange, device string) error {
	st, err := s.createState(ctx, c, device)
	if err != nil {
		return err
	}
	var before *jsonv.Value
	if st == nil { // the record has a state: merge into it
		if st, err = s.loadState(ctx, c.table, c.record); err != nil {
			return err
		}
		before = st.data
		if err := s.mergeChange(ctx, st, c, device); err != nil || !st.changed {
			return err
		}
	}
	t := s.e.tables[c.table]
	if t == nil {
		s.report.Unregistered++
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
			pe := pendingEdit{}
			if before != nil {
				pe.base = before
			}
			s.pending[key] = pe
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
	}
	return s.writeRow(ctx, t, c.record, st.node)
}

// rebasePending gives every record the app wrote during the sync its
// final row: the merged synced state with the app's own edits (the diff
// from the row it started from to the row it wrote) laid on top. The
// record stays pending, so the next sync sends exactly those edits.
func (s *syncRun) rebasePending(ctx context.Context) error {
	keys := make([]recordKey, 0, len(s.pending))
	for k := range s.pending {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b recordKey) int {
		return cmp.Or(cmp.Compare(a.table, b.table), cmp.Compare(a.record, b.record))
	})
	for _, k := range keys {
		t := s.e.tables[k.table]
		var text string
		err := s.queryRow(ctx, t.readSQL, []any{k.record}, &text)
		if errors.Is(err, sql.ErrNoRows) {
			continue // deleted by the app: the pending delete goes out next time
		}
		if err != nil {
			continue // not valid JSON: leave the app's row alone (reported)
		}
		mine, perr := jsonv.ParseObject([]byte(text), jsonv.Options{})
		if perr != nil {
			continue
		}
		edits := mine
		if base := s.pending[k].base; base != nil {
			edits = diff(*base, mine)
		}
		st, err := s.loadState(ctx, k.table, k.record)
		if err != nil {
			return err
		}
		merged := []byte("{}")
		if st.node.exists() {
			merged = jsonv.Encode(st.node.value())
		}
		out, err := jsonpatch.MergePatch(merged, jsonv.Encode(edits))
		if err != nil {
			return &Error{Op: "rebase", Table: k.table, Record: k.record, Err: err}
		}
		v, err := jsonv.ParseObject(out, jsonv.Options{})
		if err != nil {
			return &Error{Op: "rebase", Table: k.table, Record: k.record, Err: err}
		}
		if err := s.exec(ctx, t.upsertSQL, k.record, string(jsonv.Encode(v))); err != nil {
			return &Error{Op: "write", Table: k.table, Record: k.record, Err: err}
		}
	}
	return nil
}

// recordFiles remembers the files applied, uploaded and rejected, moves
// the cursor, and forgets files that have left the remote and the
// listing window.
func (s *syncRun) recordFiles(ctx context.Context) error {
	if s.report.Uploaded != "" {
		fi, err := s.upload.Stat()
		if err != nil {
			return err
		}
		if err := s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size) VALUES (?1, 'applied', ?2)`, s.report.Uploaded, fi.Size()); err != nil {
			return err
		}
	}
	for _, r := range s.report.Rejected {
		if err := s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size, detail) VALUES (?1, 'rejected', ?2, ?3)`, r.Name, s.rejectedSizes[r.Name], r.Err.Error()); err != nil {
			return err
		}
	}
	since := s.cursor.Add(-s.e.cfg.ListOverlap)
	for name := range s.known {
		at, _, ok := parsePatchName(name)
		if !s.listed[name] && (!ok || at.Before(since)) {
			if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1`, name); err != nil {
				return err
			}
		}
	}
	if err := setMeta(ctx, s.conn, metaMaxVersion, strconv.FormatInt(s.maxSeen, 10)); err != nil {
		return err
	}
	if s.cursor.IsZero() {
		return nil
	}
	return setMeta(ctx, s.conn, metaCursor, s.cursor.UTC().Format(time.RFC3339Nano))
}

// rowMatches reports whether the app's row holds exactly the content of
// state n (both absent counts as a match).
func (s *syncRun) rowMatches(ctx context.Context, t *tableInfo, id string, n *node) (bool, error) {
	var text string
	err := s.queryRow(ctx, t.readSQL, []any{id}, &text)
	if errors.Is(err, sql.ErrNoRows) {
		return !n.exists(), nil
	}
	if err != nil || !n.exists() {
		return false, nil
	}
	v, err := jsonv.ParseObject([]byte(text), jsonv.Options{})
	return err == nil && jsonv.Equal(v, n.value()), nil
}

// writeRow makes the app's row show state n, with is_syncing set so the
// triggers stay quiet.
func (s *syncRun) writeRow(ctx context.Context, t *tableInfo, id string, n *node) error {
	var err error
	if n.exists() {
		err = s.exec(ctx, t.upsertSQL, id, string(jsonv.Encode(n.value())))
	} else {
		err = s.exec(ctx, t.deleteSQL, id)
	}
	if err != nil {
		return &Error{Op: "write", Table: t.name, Record: id, Err: err}
	}
	return nil
}

// recordState is a record's merge state as loaded from sync_states.
type recordState struct {
	node    *node
	data    *jsonv.Value // synced content before this change, nil if none
	stored  string       // stored record_data + clock, to skip no-op writes
	changed bool
}

func (s *syncRun) loadState(ctx context.Context, table, record string) (*recordState, error) {
	var data, clock string
	var deleted bool
	err := s.queryRow(ctx, `SELECT record_data, clock, is_deleted FROM sync_states WHERE table_name = ?1 AND record_id = ?2`, []any{table, record}, &data, &clock, &deleted)
	if errors.Is(err, sql.ErrNoRows) {
		return &recordState{node: &node{}}, nil
	}
	if err != nil {
		return nil, err
	}
	st := &recordState{stored: data + "\x00" + clock}
	var content jsonv.Value
	if !deleted {
		if content, err = jsonv.ParseObject([]byte(data), jsonv.Options{}); err != nil {
			return nil, &Error{Op: "load state", Table: table, Record: record, Err: err}
		}
		st.data = &content
	}
	if st.node, err = decodeState(content, []byte(clock), deleted); err != nil {
		return nil, &Error{Op: "load state", Table: table, Record: record, Err: err}
	}
	return st, nil
}

// mergeChange applies c, stamped by device, to st and stores the result.
func (s *syncRun) mergeChange(ctx context.Context, st *recordState, c fileChange, device string) error {
	if err := applyChange(st.node, c, device); err != nil {
		return err
	}
	data, clock := encodeState(st.node)
	if data+"\x00"+clock == st.stored {
		return nil
	}
	st.changed = true
	st.stored = data + "\x00" + clock
	err := s.exec(ctx, `INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (table_name, record_id) DO UPDATE SET record_data = excluded.record_data, clock = excluded.clock,
	sync_version = excluded.sync_version, device_id = excluded.device_id, is_deleted = excluded.is_deleted`,
		c.table, c.record, data, clock, st.node.stamp.version, st.node.stamp.device, !st.node.exists())
	if err != nil {
		return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	return nil
}

// createState stores the state c alone gives, if the record has none
// yet, and returns it; it returns nil if the record already has a state.
// A received record is usually new, so trying the insert first saves a
// lookup.
func (s *syncRun) createState(ctx context.Context, c fileChange, device string) (*recordState, error) {
	n := &node{}
	if err := applyChange(n, c, device); err != nil {
		return nil, err
	}
	data, clock := encodeState(n)
	st, err := s.stmt(ctx, `INSERT INTO sync_states (table_name, record_id, record_data, clock, sync_version, device_id, is_deleted)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (table_name, record_id) DO NOTHING`)
	if err != nil {
		return nil, err
	}
	res, err := st.ExecContext(ctx, c.table, c.record, data, clock, n.stamp.version, n.stamp.device, !n.exists())
	if err != nil {
		return nil, &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	if k, err := res.RowsAffected(); err != nil || k == 0 {
		return nil, err
	}
	return &recordState{node: n, changed: true}, nil
}

func applyChange(n *node, c fileChange, device string) error {
	at := stamp{version: c.version, device: device}
	if c.deleted {
		n.applyDelete(at)
		return nil
	}
	p, err := jsonv.ParseObject(c.patch, jsonv.Options{KeepNulls: true})
	if err != nil {
		return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	n.applyPatch(p, at)
	return nil
}

// encodeState returns what sync_states stores for a record.
func encodeState(n *node) (data, clock string) {
	data = "{}"
	if n.exists() {
		data = string(jsonv.Encode(n.value()))
	}
	return data, string(encodeClock(n))
}

// stmt returns a statement prepared once per sync on the sync's conn.
func (s *syncRun) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if st := s.stmts[query]; st != nil {
		return st, nil
	}
	st, err := s.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if s.stmts == nil {
		s.stmts = map[string]*sql.Stmt{}
	}
	s.stmts[query] = st
	return st, nil
}

func (s *syncRun) exec(ctx context.Context, query string, args ...any) error {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(ctx, args...)
	return err
}

func (s *syncRun) queryRow(ctx context.Context, query string, args []any, dest ...any) error {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return err
	}
	return st.QueryRowContext(ctx, args...).Scan(dest...)
}
