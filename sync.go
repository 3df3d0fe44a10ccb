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
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// Sync runs one sync cycle:
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
//     records that were sent, and commit.
//
// The app may keep writing while Sync runs: a record it changes during a
// sync stays pending, and its row ends as the merged synced state with
// the app's edits laid on top.
//
// If a sync fails after its upload (or the process dies), the file stays
// on the remote, where other devices may already have applied it; the
// next Sync publishes it if needed and merges it before anything else.
//
// Sync returns a Report even when it fails, describing what was done.
// Rejected remote files are reported in Report.Rejected, not as an error.
func (e *Engine) Sync(ctx context.Context) (Report, error) {
	return e.run(ctx, func(s *syncRun) error {
		if err := s.run(ctx); err != nil {
			return err
		}
		return s.maintain(ctx, false)
	})
}

// run runs fn with a fresh syncRun, one at a time.
func (e *Engine) run(ctx context.Context, fn func(s *syncRun) error) (Report, error) {
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
	// Whatever happened, the connection goes back to the app's pool
	// outside any transaction.
	defer endTx(conn)
	s := &syncRun{e: e, conn: conn, pending: map[recordKey]pendingEdit{}, rejectedSizes: map[string]int64{}, readerKeys: map[string]string{}, headers: map[string]stateHeader{}, covers: map[string]bool{}, byName: map[string]bool{}}
	defer s.cleanup()
	err = fn(s)
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
	files         []RemoteFile // the listing
	listed        map[string]bool
	known         map[string]knownFile
	download      []*downloaded
	rejectedSizes map[string]int64
	readerKeys    map[string]string // what a rejection was decided under (see retryDue)
	since         time.Time         // this listing's start: the previous cursor less the overlap
	maxSeen       int64
	planBase      int64 // sync_meta.max_version when the plan was made

	dataVersion int64  // PRAGMA data_version when the pending rows were read
	plan        *spool // every pending record, in version order
	upload      *os.File
	sent        int // changes in the upload file

	dirty   bool // another connection committed since the pending rows were read
	pending map[recordKey]pendingEdit
	stmts   map[string]*sql.Stmt
	rows    map[recordKey]error // the last write of each app row: nil, or why the table refused it

	store     string                 // the store id of the remote's marker
	limits    Limits                 // the store's limits, from its marker
	rebound   bool                   // bind joined another store
	bootstrap bool                   // sync_states is empty: start from the newest snapshot
	joining   bool                   // JoinRemote was called: load the snapshot, then upload a merge file
	snaps     []RemoteFile           // the snapshots listed, newest first
	headers   map[string]stateHeader // the snapshot headers read
	loaded    []*downloaded          // the snapshots to apply first, if any
	covers    map[string]bool        // the files and snapshots they hold: recorded as applied
	gone      []*downloaded          // listed files deleted before they were downloaded
	byName    map[string]bool        // rejected snapshots read again by name
	checked   []RemoteFile           // new snapshots whose header showed nothing lacking
	forget    []string               // rejected files found gone when read again
}

type knownFile struct {
	status    string // fileApplied, fileChecked or fileRejected
	size      int64
	checkedAt int64  // when it was rejected, by the remote's clock (Unix seconds)
	reader    string // Limits.key when it was rejected
	attempts  int64  // reads that rejected it in a row
}

// held reports whether this device holds what the file holds: it applied
// it, or, for a snapshot, checked that it holds nothing this device lacks.
func (k knownFile) held() bool { return k.status == fileApplied || k.status == fileChecked }

// rejectRetry is how long a rejected file is left alone before it is read
// again: a folder-sync tool may still be writing it. The delay doubles
// with each read that rejects it again, up to rejectRetryMax, so that a
// file that is broken for good costs one download a day.
const (
	rejectRetry    = time.Hour
	rejectRetryMax = 24 * time.Hour
)

// retryDue reports whether a rejected file should be read again: its
// reason may have gone, because this app now reads other formats or the
// store other limits, or because enough time has passed.
func (s *syncRun) retryDue(k knownFile) bool {
	if at, ok := strings.CutPrefix(k.reader, s.limits.key()+readAgainAt); ok {
		t, err := time.Parse(time.RFC3339Nano, at)
		return err != nil || !s.cursor.Before(t)
	}
	if k.reader != s.limits.key() {
		return true
	}
	wait := rejectRetryMax
	if k.attempts < 6 {
		wait = min(rejectRetry<<max(k.attempts-1, 0), rejectRetryMax)
	}
	return s.cursor.Sub(time.Unix(k.checkedAt, 0)) >= wait
}

// stillRejected reports whether a listed file rejected earlier should be
// skipped without downloading it again. A new size means new content.
func (s *syncRun) stillRejected(k knownFile, f RemoteFile) bool {
	return k.status == fileRejected && k.size == f.Size && !s.retryDue(k)
}

type downloaded struct {
	name   string
	size   int64 // -1 when read by name, not from a listing
	kind   fileKind
	byName bool   // a rejected file the listing no longer shows, read again
	spool  *spool // nil until downloaded and valid
}

func (s *syncRun) cleanup() {
	for _, d := range s.download {
		if d.spool != nil {
			d.spool.close()
		}
	}
	for _, d := range s.loaded {
		d.spool.close()
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
	// The next cursor is the remote's time before this sync lists: every
	// file created before it is listed now or, if the listing lags,
	// within the overlap next time. It never comes from file names, which
	// a broken or hostile file could set in the future.
	var err error
	if s.cursor, err = s.e.cfg.Remote.Now(ctx); err != nil {
		return remoteErr("list", "", err)
	}
	if err := s.list(ctx); err != nil {
		return err
	}
	if err := s.bind(ctx); err != nil {
		return err
	}
	if s.rebound { // joined another store: list it from the start
		if err := s.list(ctx); err != nil {
			return err
		}
	}
	if err := s.recoverOutbox(ctx); err != nil {
		return err
	}
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
	unwritten, err := s.hasUnwritten(ctx)
	if err != nil {
		return err
	}
	if s.plan.n == 0 && len(s.download) == 0 && len(s.report.Rejected) == 0 && len(s.checked) == 0 && len(s.forget) == 0 && !unwritten {
		// Nothing to apply; still move the cursor, or an idle device
		// would list ever further back, paying for files it applied.
		return s.saveCursor(ctx)
	}
	if s.sent > 0 {
		if err := s.send(ctx); err != nil {
			return err
		}
	}
	if err := s.hook("uploaded"); err != nil {
		return err
	}
	// A failure from here on leaves the uploaded file in place and in the
	// outbox: the next sync adopts it (see outbox.go).
	return s.commit(ctx)
}

func (s *syncRun) saveCursor(ctx context.Context) error {
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "sync", Err: err}
	}
	err := setMeta(ctx, s.conn, metaCursor, s.cursor.UTC().Format(time.RFC3339Nano))
	if err == nil {
		_, err = s.conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		endTx(s.conn)
		return &Error{Op: "sync", Err: err}
	}
	return nil
}

func remoteErr(op, file string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Op: op, File: file, Err: err}
	}
	return &Error{Op: op, File: file, Err: fmt.Errorf("%w: %w", ErrRemote, err)}
}

// list lists the remote from the cursor less the overlap, or from the
// start for a device with no synced state.
func (s *syncRun) list(ctx context.Context) error {
	e := s.e
	cur, err := getMeta(ctx, s.conn, metaCursor)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	// A device that never synced starts from a snapshot; one that synced
	// while the store was empty reads snapshots as any other device.
	s.bootstrap = cur == "" && s.emptyState(ctx)
	s.since = time.Time{}
	if cur != "" && !s.bootstrap {
		if prev, err := time.Parse(time.RFC3339Nano, cur); err == nil {
			s.since = prev.Add(-e.cfg.ListOverlap)
		}
	}
	e.progress("list", 0, 1)
	if s.files, err = e.cfg.Remote.List(ctx, s.since); err != nil {
		return remoteErr("list", "", err)
	}
	e.progress("list", 1, 1)
	return nil
}

// fetch spools every listed file not applied yet, starting with a
// snapshot when the device needs one (see snapshot.go).
func (s *syncRun) fetch(ctx context.Context) error {
	e := s.e
	join, err := getMeta(ctx, s.conn, metaJoin)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	s.joining = join != ""
	if err := s.checkCopied(ctx); err != nil {
		return err
	}
	s.known = map[string]knownFile{}
	rows, err := s.conn.QueryContext(ctx, `SELECT name, status, size, checked_at, reader, attempts FROM sync_files`)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	for rows.Next() {
		var name string
		var k knownFile
		if err := rows.Scan(&name, &k.status, &k.size, &k.checkedAt, &k.reader, &k.attempts); err != nil {
			rows.Close()
			return &Error{Op: "sync", Err: err}
		}
		s.known[name] = k
	}
	rows.Close()
	s.listed = map[string]bool{}
	var snaps []RemoteFile
	for _, f := range s.files {
		kind, _, _, ok := parseFileName(f.Name)
		if !ok || s.listed[f.Name] {
			continue // not ours (other apps' files), or listed twice
		}
		s.listed[f.Name] = true
		if kind == kindSnapshot {
			snaps = append(snaps, f)
			continue
		}
		if k, seen := s.known[f.Name]; seen && (k.held() || s.stillRejected(k, f)) {
			continue
		}
		s.download = append(s.download, &downloaded{name: f.Name, size: f.Size, kind: kind})
	}
	// A remote may list only files created since the cursor: a rejected
	// file is read again by name once its reason may have gone, however
	// old it is.
	for name, k := range s.known {
		kind, _, _, ok := parseFileName(name)
		if !ok || k.status != fileRejected || s.listed[name] || !s.retryDue(k) {
			continue
		}
		if kind == kindSnapshot {
			snaps = append(snaps, RemoteFile{Name: name, Size: -1})
			s.byName[name] = true
			continue
		}
		s.download = append(s.download, &downloaded{name: name, size: -1, kind: kind, byName: true})
	}
	slices.SortFunc(s.download, func(a, b *downloaded) int { return cmp.Compare(a.name, b.name) })
	if err := s.chooseSnapshot(ctx, snaps); err != nil {
		return err
	}
	for i, d := range s.download {
		e.progress("download", i, len(s.download))
		if err := s.fetchFile(ctx, d); err != nil {
			return err
		}
	}
	e.progress("download", len(s.download), len(s.download))
	if err := s.coverMissing(ctx); err != nil {
		return err
	}
	s.download = slices.DeleteFunc(s.download, func(d *downloaded) bool { return d.spool == nil })
	s.download = append(s.loaded, s.download...) // snapshots first
	s.loaded = nil                               // owned by s.download now
	return nil
}

// fetchFile downloads one file into a spool. A file that turns out to be
// malformed is rejected (reported, d.spool left nil); a remote failure
// fails the sync.
func (s *syncRun) fetchFile(ctx context.Context, d *downloaded) error {
	e := s.e
	if d.kind == kindMerge {
		_, err := s.fetchStateFile(ctx, d, s.limits.MaxSnapshotSize)
		return err
	}
	_, device, _ := parsePatchName(d.name)
	if d.size > s.limits.MaxFileSize {
		s.reject(d, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrFileTooLarge, d.size, s.limits.MaxFileSize))
		return nil
	}
	rc, err := e.cfg.Remote.Open(ctx, d.name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.vanished(d)
		return nil
	case unreadableFile(ctx, err):
		s.reject(d, err)
		return nil
	case err != nil:
		return remoteErr("download", d.name, err)
	}
	defer rc.Close()
	sp, err := newSpool(e.cfg.TempDir)
	if err != nil {
		return &Error{Op: "download", File: d.name, Err: err}
	}
	var maxV int64
	var spoolErr error
	src := &countingReader{r: &limitedReader{r: rc, n: s.limits.MaxFileSize, what: "compressed file"}}
	err = decodePatchFile(src, device, s.limits.MaxExpandedSize, s.limits.MaxRecordSize, func(c fileChange) error {
		maxV = max(maxV, c.version)
		spoolErr = sp.add(c)
		return spoolErr
	})
	if err == nil {
		_, at, _, _ := parseFileName(d.name)
		err = s.checkVersions(at, maxV)
	}
	if err != nil {
		sp.close()
		return s.readFailed(ctx, d, src, spoolErr, err)
	}
	d.spool = sp
	s.maxSeen = max(s.maxSeen, maxV)
	return nil
}

// checkVersions rejects a received file, named at "at", whose largest
// version v is above what its time allows (see versionsAllowed). A file
// named later than this device's clock is judged by the clock; it is read
// again once the clock has reached the time its versions need.
func (s *syncRun) checkVersions(at time.Time, v int64) error {
	if v > versionsAllowed(at) {
		return fmt.Errorf("version %d is above %d, the most a file named at %s may carry: the file is broken or hostile", v, versionsAllowed(at), at.UTC().Format(time.RFC3339))
	}
	if v > versionsAllowed(s.cursor) {
		return &versionsAheadError{v: v, at: versionTime(v)}
	}
	return nil
}

// versionsAheadError rejects a file until this device's clock reaches at.
type versionsAheadError struct {
	v  int64
	at time.Time
}

func (e *versionsAheadError) Error() string {
	return fmt.Sprintf("version %d is ahead of this device's clock; it is read again at %s", e.v, e.at.UTC().Format(time.RFC3339))
}

// noteUpload records a file name this database uploads, before it tries:
// a file of its device id that it did not record was written by a copy of
// this database (see checkCopied).
func noteUpload(ctx context.Context, q querier, name string) error {
	_, err := q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_uploaded (name) VALUES (?)`, name)
	return err
}

// checkCopied looks for files on the remote that carry this database's
// device id but that this database never uploaded: the database file was
// copied to another machine, and both copies sync under one id. Two
// writes stamped alike by the two copies would split the devices for
// good, so before this sync stamps anything, this database takes a new
// device id (versions go on from max_version, so no stamp is reused). An
// app that sets Config.DeviceID itself is told to give the copy its own.
// Files named before this database began recording its uploads are not
// judged.
func (s *syncRun) checkCopied(ctx context.Context) error {
	e := s.e
	since, err := getMeta(ctx, s.conn, metaUploads)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if since == "" {
		return s.setMetas(ctx, metaUploads, s.cursor.UTC().Format(time.RFC3339Nano))
	}
	from, err := time.Parse(time.RFC3339Nano, since)
	if err != nil {
		return &Error{Op: "sync", Err: fmt.Errorf("sync_meta %s: %w", metaUploads, err)}
	}
	var foreign string
	for _, f := range s.files {
		_, at, device, ok := parseFileName(f.Name)
		if !ok || device != e.deviceID || at.Before(from) {
			continue
		}
		var one int
		err := s.conn.QueryRowContext(ctx, `SELECT 1 FROM sync_uploaded WHERE name = ?`, f.Name).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			foreign = f.Name
			break
		}
		if err != nil {
			return &Error{Op: "sync", Err: err}
		}
	}
	if foreign == "" {
		return nil
	}
	if e.cfg.DeviceID != "" {
		return &Error{Op: "sync", File: foreign, Err: fmt.Errorf("this file carries this database's device id %q, but this database did not write it: the database file was copied to another device, which syncs under the same id. Give each copy its own Config.DeviceID (or leave it empty, and each database takes its own)", e.deviceID)}
	}
	id := uuid.NewString()
	if err := s.setMetas(ctx, metaDeviceID, id); err != nil {
		return err
	}
	e.log.Warn("drivesync: another copy of this database syncs under its device id; taking a new device id", "old", e.deviceID, "new", id, "file", foreign)
	e.idMu.Lock()
	e.deviceID = id
	e.idMu.Unlock()
	return nil
}

// vanished handles a file that was gone when this sync opened it. A
// listed file was deleted since the listing (compacted): a listed snapshot
// must bring what it held (see coverMissing). A rejected file read again
// by name was compacted long ago: it is forgotten, and a snapshot that
// holds it is loaded (see recoverForgotten).
func (s *syncRun) vanished(d *downloaded) {
	if d.byName {
		s.forget = append(s.forget, d.name)
		return
	}
	s.gone = append(s.gone, d)
}

// readFailed sorts out why reading remote file d failed: a cancelled
// context, the remote or the local spool fails the sync (returned); a
// malformed file is rejected (nil).
func (s *syncRun) readFailed(ctx context.Context, d *downloaded, src *countingReader, spoolErr, err error) error {
	switch {
	case ctx.Err() != nil:
		return &Error{Op: "download", File: d.name, Err: ctx.Err()}
	case src.failed != nil:
		return remoteErr("download", d.name, src.failed)
	case spoolErr != nil: // a local disk problem, not the file's fault
		return &Error{Op: "download", File: d.name, Err: spoolErr}
	}
	s.reject(d, classifyFileErr(err))
	return nil
}

// readAgainAt joins the reader key of a file rejected for versions ahead
// of this device's clock and the time it may be read again.
const readAgainAt = ", read again at "

func (s *syncRun) reject(d *downloaded, err error) {
	s.e.log.Warn("drivesync: rejected remote file", "file", d.name, "err", err)
	s.rejectedSizes[d.name] = d.size
	s.readerKeys[d.name] = s.limits.key()
	if ahead := (*versionsAheadError)(nil); errors.As(err, &ahead) {
		s.readerKeys[d.name] += readAgainAt + ahead.at.UTC().Format(time.RFC3339Nano)
	}
	s.report.Rejected = append(s.report.Rejected, FileError{Name: d.name, Err: &Error{Op: "read", File: d.name, Err: err}})
}

// countingReader counts the bytes read and remembers a read error of the
// underlying stream, to tell a network failure from a malformed file.
type countingReader struct {
	r      io.Reader
	n      int64
	failed error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
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
		endTx(s.conn)
		return &Error{Op: "sync", Err: err}
	}
	defer s.conn.ExecContext(context.WithoutCancel(ctx), "COMMIT") // read-only: ends the snapshot
	if s.planBase, err = getMetaInt(ctx, s.conn, metaMaxVersion); err != nil {
		return &Error{Op: "sync", Err: err}
	}
	s.maxSeen = max(s.maxSeen, s.planBase)
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
			var p pendingRow
			if err := rows.Scan(&p.id, &p.rowExists, &p.content, &p.rowCanonical, &p.synced, &p.syncedDeleted, &p.refused, &p.base); err != nil {
				rows.Close()
				return &Error{Op: "read pending", Table: t.name, Err: err}
			}
			c, skip := s.planRecord(t, p)
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

func (s *syncRun) newUpload() (*patchWriter, error) {
	f, err := os.CreateTemp(s.e.cfg.TempDir, "drivesync-upload-*")
	if err != nil {
		return nil, &Error{Op: "write upload", Err: err}
	}
	s.upload = f
	return newPatchWriter(f, s.e.deviceID)
}

// waitForVersions returns a remote time at which this sync's versions are
// allowed (see versionsAllowed), so that every device takes the file. An
// honest store is always far below the bound; after a hostile file took
// the versions near it, a device waits for the clock up to a minute, and
// beyond that fails the sync, keeping its changes pending.
func (s *syncRun) waitForVersions(ctx context.Context, now time.Time) (time.Time, error) {
	// Readers judge by the time the file's name carries: milliseconds.
	if s.maxSeen <= versionsAllowed(now.Truncate(time.Millisecond)) {
		return now, nil
	}
	ready := versionTime(s.maxSeen).Truncate(time.Millisecond).Add(time.Millisecond)
	wait := ready.Sub(now)
	if wait > time.Minute {
		return now, &Error{Op: "reserve versions", Err: fmt.Errorf("this store's versions (%d) are ahead of the remote's clock until %s: sync again then", s.maxSeen, ready.UTC().Format(time.RFC3339))}
	}
	select {
	case <-ctx.Done():
		return now, &Error{Op: "reserve versions", Err: ctx.Err()}
	case <-time.After(wait):
	}
	return ready, nil
}

// renameOutbox gives the stored upload a new name, later than old.
func (s *syncRun) renameOutbox(ctx context.Context, old string) (string, error) {
	now, err := s.e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr("upload", old, err)
	}
	if at, _, _ := parsePatchName(old); !now.After(at) {
		now = at.Add(time.Millisecond)
	}
	name := patchFileName(now, s.e.deviceID)
	if _, err := s.conn.ExecContext(ctx, `UPDATE sync_outbox SET name = ? WHERE name = ?`, name, old); err != nil {
		return "", &Error{Op: "upload", File: old, Err: err}
	}
	if err := noteUpload(ctx, s.conn, name); err != nil {
		return "", &Error{Op: "upload", File: name, Err: err}
	}
	return name, nil
}

// send reserves the versions it is about to publish and stores the file
// in the outbox, in one transaction, then uploads it. Reserving first means
// that however the sync ends, later changes are numbered above the ones in
// this file: a stamp never names two different writes. The reservation
// also checks that no other Engine on this database reserved versions
// since the plan read them.
func (s *syncRun) send(ctx context.Context) error {
	e := s.e
	if s.maxSeen > maxVersion {
		return &Error{Op: "reserve versions", Err: fmt.Errorf("versions would pass %d: this store cannot take more changes", int64(maxVersion))}
	}
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return remoteErr("upload", "", err)
	}
	if now, err = s.waitForVersions(ctx, now); err != nil {
		return err
	}
	name := patchFileName(now, e.deviceID)
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "reserve versions", Err: err}
	}
	err = func() error {
		stored, err := getMetaInt(ctx, s.conn, metaMaxVersion)
		if err != nil {
			return err
		}
		if stored != s.planBase {
			return errors.New("another Engine synced this database at the same time; use one Engine per database, then sync again")
		}
		if err := setMeta(ctx, s.conn, metaMaxVersion, strconv.FormatInt(s.maxSeen, 10)); err != nil {
			return err
		}
		if err := saveOutbox(ctx, s.conn, name, s.upload); err != nil {
			return err
		}
		if err := noteUpload(ctx, s.conn, name); err != nil {
			return err
		}
		_, err = s.conn.ExecContext(ctx, "COMMIT")
		return err
	}()
	if err != nil {
		s.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return &Error{Op: "reserve versions", Err: err}
	}
	e.progress("upload", 0, 1)
	for attempt := 0; ; attempt++ {
		if _, err := s.upload.Seek(0, io.SeekStart); err != nil {
			return &Error{Op: "upload", File: name, Err: err}
		}
		err := e.cfg.Remote.Create(ctx, name, s.upload)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return remoteErr("upload", name, err)
		}
		// Another file has this name (a clock that went back): the
		// outbox must not later take that file for ours. Rename.
		if name, err = s.renameOutbox(ctx, name); err != nil {
			return err
		}
	}
	s.report.Uploaded, s.report.ChangesSent = name, s.sent
	e.progress("upload", 1, 1)
	e.log.Info("drivesync: uploaded", "file", name, "changes", s.sent)
	return nil
}

// setMetas sets sync_meta key/value pairs in one transaction.
func (s *syncRun) setMetas(ctx context.Context, kv ...string) error {
	return s.inTx(ctx, func() error {
		for i := 0; i < len(kv); i += 2 {
			if err := setMeta(ctx, s.conn, kv[i], kv[i+1]); err != nil {
				return err
			}
		}
		return nil
	})
}

// inTx runs fn in a write transaction of its own.
func (s *syncRun) inTx(ctx context.Context, fn func() error) error {
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if err := fn(); err != nil {
		endTx(s.conn)
		return &Error{Op: "sync", Err: err}
	}
	if _, err := s.conn.ExecContext(ctx, "COMMIT"); err != nil {
		endTx(s.conn)
		return &Error{Op: "sync", Err: err}
	}
	return nil
}
