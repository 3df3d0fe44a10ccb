package drivesync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"time"

	"github.com/drivesync/drivesync/internal/merge"
)

// The maintenance phase: writing snapshots and compacting the remote on
// their authority, and keeping the ledger of files bounded. How a device
// reads snapshots to start or catch up is in catchup.go, their format in
// statefile.go, the store's marker in marker.go.
//
// A snapshot is every record of sync_states, deleted ones included, each
// with its clock: a device that starts from it merges later patch files
// exactly as if it had applied the files the snapshot replaces. It is
// named with the remote's time when it was written and carries in its
// header the time its writer listed the remote ("covers"), the cutoff
// below which compaction may delete the files it holds, the names of the
// patch and merge files it holds ("included") and the names of the older
// snapshots its writer had checked ("knows").
//
// The first device to sync in a month (by the remote's clock) writes one.
// Compaction runs once that snapshot is older than ListOverlap, so that
// every device can list it before any file it replaces disappears. It
// deletes only what the newest such snapshot (the authority) holds: the
// files it includes named before its cutoff, and the snapshots it knows.
// Deletes that fail are retried at the next compaction.
//
// A device reads the header of every snapshot it has not seen. If one
// holds a file or knows a snapshot that the device neither applied nor
// lists now, compaction deleted something the device never had, and it
// loads that snapshot first, merging it into its state. Since everything
// deleted is named by a snapshot still on the remote, or by one that a
// snapshot still on the remote knows (whose writer had checked it, and so
// holds what it held), the check is exact: names, not times, decide it,
// whatever the devices' clocks say and however long a device was away. A
// device with no state at all starts from the newest snapshot.
//
// A merge file has the snapshot format but every device applies it, like a
// patch file: it is how a device that joins another store (JoinRemote)
// publishes what it had, with the original stamps.

// retained returns the oldest name time a snapshot at "at" keeps patch
// files for: Config.Retention before it, by default two months.
func (e *Engine) retained(at time.Time) time.Time {
	if e.cfg.Retention > 0 {
		return at.Add(-e.cfg.Retention)
	}
	return at.AddDate(0, -2, 0)
}

// pruneLedger keeps sync_files bounded by what the remote holds: once a
// month (by the remote's clock) it lists the whole remote and forgets the
// applied files and checked snapshots that are gone. Listings since the
// cursor never show a file's deletion, and a device that never writes a
// snapshot (whose writer prunes the same way) would otherwise remember
// every file it ever applied. A file forgotten too early (a listing that
// lags) is downloaded and applied again, which changes nothing. Rejected
// files are kept: they leave through being read again (see
// recoverForgotten).
func (s *syncRun) pruneLedger(ctx context.Context, l *listing, f *fetched) error {
	month := l.cursor.UTC().Format("2006-01")
	done, err := getMeta(ctx, s.conn, metaPruned)
	if err != nil || done == month {
		return err
	}
	files, err := s.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return remoteErr("list", "", err)
	}
	present := map[string]bool{}
	for _, f := range files {
		present[f.Name] = true
	}
	var gone []string
	for name, k := range f.ledger {
		if k.held() && !present[name] {
			gone = append(gone, name)
		}
	}
	uploaded, err := s.uploadsGone(ctx, l, present)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	return s.inTx(ctx, func() error {
		for _, name := range gone {
			if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1 AND status IN ('applied', 'checked')`, name); err != nil {
				return err
			}
		}
		for _, name := range uploaded {
			if err := s.exec(ctx, `DELETE FROM sync_uploaded WHERE name = ?1`, name); err != nil {
				return err
			}
		}
		return setMeta(ctx, s.conn, metaPruned, month)
	})
}

// uploadsGone returns the names in sync_uploaded (the names this
// database uploaded) that the ledger's monthly pruning forgets with it,
// keeping the table bounded by what the remote holds: those the whole
// listing no longer shows and that are older than where this sync listed
// from, or than ListOverlap before its listing of everything (a file a
// listing did not show yet is younger). checkCopied asks
// only whether a listed file's name is this database's, and a file gone
// from the remote is not listed again;
// a copy of the database names its files itself, so forgetting a name
// of ours never hides a copy's file, however late a sync tool delivers
// it. The newest patch name stays (the next names follow it, see
// nameTime), and so do the names of uploads still in the outbox, and
// those uploaded before this database last joined a store (another
// store's, see keepUploads).
func (s *syncRun) uploadsGone(ctx context.Context, l *listing, present map[string]bool) ([]string, error) {
	before := l.since
	if before.IsZero() { // a listing of everything: as far back as listings lag
		before = l.cursor.Add(-s.e.cfg.ListOverlap)
	}
	kept, err := uploadsKept(ctx, s.conn)
	if err != nil {
		return nil, err
	}
	rows, err := s.conn.QueryContext(ctx, `SELECT name FROM sync_uploaded
WHERE name IS NOT (SELECT max(name) FROM sync_uploaded WHERE name GLOB '*/patch_*')
AND name NOT IN (SELECT name FROM sync_outbox)`)
	if err != nil {
		return nil, err
	}
	var gone []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, err
		}
		if _, at, _, ok := parseFileName(name); ok && at.Before(before) && at.After(kept) && !present[name] {
			gone = append(gone, name)
		}
	}
	rows.Close()
	return gone, rows.Err()
}

// maintain runs after a successful sync: the month's first snapshot, the
// compaction a snapshot of this device made due, and the merge file a
// JoinRemote asked for. force (Engine.Snapshot) writes a snapshot and
// compacts now.
func (s *syncRun) maintain(ctx context.Context, l *listing, f *fetched, force bool) error {
	e := s.e
	if err := s.pruneLedger(ctx, l, f); err != nil {
		return err
	}
	if f.joining {
		if _, err := s.writeState(ctx, l, kindMerge); err != nil {
			return err
		}
		if err := s.setMetas(ctx, metaJoin, "", metaMergeSeq, ""); err != nil {
			return err
		}
	}
	last, err := getMeta(ctx, s.conn, metaSnapshot)
	if err != nil {
		return &Error{Op: "snapshot", Err: err}
	}
	heal, err := s.healVanished(ctx, l, f)
	if err != nil {
		return err
	}
	lastAt, _ := time.Parse(time.RFC3339Nano, last)
	y1, m1, _ := lastAt.UTC().Date()
	y2, m2, _ := l.cursor.UTC().Date()
	if force || heal || ((y1 != y2 || m1 != m2) && !s.emptyState(ctx)) {
		name, err := s.writeState(ctx, l, kindSnapshot)
		if (errors.Is(err, errUnreadableState) || errors.Is(err, ErrFileTooLarge)) && !force {
			// Nothing is lost: the patch files stay, uncompacted. Try
			// again next month rather than at every sync: a state too
			// large for the store's limit or for what the remote takes
			// (a sync server's file limit) is as large at the next. A
			// snapshot for vanished files is tried again a day later.
			e.log.Error("drivesync: the snapshot was not written; the remote keeps every patch file until one can be", "err", err, "vanished", s.report.Vanished)
			if heal {
				if err := s.noteHealFailed(ctx, l); err != nil {
					return err
				}
			}
			return s.setMetas(ctx, metaSnapshot, l.cursor.UTC().Format(time.RFC3339Nano))
		}
		if err != nil {
			return err
		}
		s.report.Snapshot = name
		_, at, _, _ := parseFileName(name)
		if err := s.setMetas(ctx, metaSnapshot, at.Format(time.RFC3339Nano), metaCompact, name); err != nil {
			return err
		}
	}
	due, err := getMeta(ctx, s.conn, metaCompact)
	if err != nil {
		return &Error{Op: "compact", Err: err}
	}
	_, dueAt, _, _ := parseFileName(due)
	if due != "" && !l.cursor.Before(dueAt.Add(e.cfg.ListOverlap)) || force {
		used, err := s.compact(ctx)
		if err != nil {
			return err
		}
		if used != "" && used >= due {
			return s.setMetas(ctx, metaCompact, "")
		}
	}
	return nil
}

// writeState uploads sync_states as a snapshot or merge file.
func (s *syncRun) writeState(ctx context.Context, l *listing, kind fileKind) (string, error) {
	e := s.e
	op := "snapshot"
	if kind == kindMerge {
		op = "merge"
	}
	h := stateHeader{device: e.deviceID, store: s.store, covers: l.cursor}
	if kind == kindSnapshot {
		h.cutoff = e.retained(l.cursor)
		if b := l.cursor.Add(-2 * e.cfg.ListOverlap); b.Before(h.cutoff) {
			h.cutoff = b // files a little older may still be arriving
		}
		var err error
		if h.included, h.knows, err = s.heldFiles(ctx); err != nil {
			return "", err
		}
	}
	if kind == kindMerge {
		var err error
		if h.seq, err = s.mergeSeq(ctx); err != nil {
			return "", err
		}
	}
	f, err := os.CreateTemp(e.cfg.TempDir, "drivesync-"+op+"-*")
	if err != nil {
		return "", &Error{Op: op, Err: err}
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := s.conn.ExecContext(ctx, "BEGIN DEFERRED"); err != nil {
		endTx(s.conn)
		return "", &Error{Op: op, Err: err}
	}
	var unfit []recordKey
	var onUnfit func(recordKey)
	if kind == kindMerge {
		onUnfit = func(k recordKey) { unfit = append(unfit, k) }
	} else if h.holds, err = loadHeld(ctx, s.conn); err != nil {
		// In the transaction that reads the states: the numbers a
		// snapshot claims are exactly those of the records it holds.
		endTx(s.conn)
		return "", &Error{Op: op, Err: err}
	}
	n, err := writeStateFile(ctx, s.conn, f, h, s.limits.MaxRecordSize, onUnfit)
	endTx(s.conn) // a read transaction: ends the snapshot of the database
	if err == nil && len(unfit) > 0 {
		err = s.pruneUnfit(ctx, unfit)
	}
	if err == nil {
		err = s.verifyState(f)
	} else if errors.Is(err, errTooLarge) { // a value no entry can hold
		err = classifyFileErr(err)
	} else {
		return "", &Error{Op: op, Err: err}
	}
	if err != nil {
		return "", &Error{Op: op, Err: fmt.Errorf("%w: %w (not uploaded: other devices could not read it)", errUnreadableState, err)}
	}
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr(op, "", err)
	}
	if now.Before(l.cursor) {
		now = l.cursor
	}
	// Named no earlier than its versions allow: this device's own
	// changes may be named after the remote's clock (see
	// waitForVersions), and the state holds them.
	top, err := getMetaInt(ctx, s.conn, metaMaxVersion)
	if err != nil {
		return "", &Error{Op: op, Err: err}
	}
	if now, err = waitForVersions(ctx, top, now); err != nil {
		return "", err
	}
	// Past the last name of its kind when that is near: a remote clock
	// that stands still would name every forced snapshot alike. One far
	// ahead (a clock that ran ahead and came back) is not followed: the
	// month of the last snapshot decides when the next is due.
	if next, err := s.nameTime(ctx, kind, now); err != nil {
		return "", &Error{Op: op, Err: err}
	} else if next.Sub(now) <= time.Minute {
		now = next
	}
	for attempt := 0; ; attempt++ {
		name := remoteFileName(kind, now, e.deviceID)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", &Error{Op: op, Err: err}
		}
		if err := s.inTx(ctx, func() error { return noteUpload(ctx, s.conn, name) }); err != nil {
			return "", err
		}
		err := e.createFile(ctx, name, f, false)
		if err == nil {
			e.log.Info("drivesync: wrote a "+op+" file", "file", name, "records", n)
			// Its own state: nothing to apply, and a snapshot it checked.
			var size int64
			if fi, err := f.Stat(); err == nil {
				size = fi.Size()
			}
			return name, s.inTx(ctx, func() error {
				if err := s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size, seq, holds) VALUES (?1, 'applied', ?2, ?3, ?4)`, name, size, h.seq, heldText(h.holds)); err != nil {
					return err
				}
				return holdAlso(ctx, s.conn, heldSet{}.with(e.deviceID, h.seq))
			})
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return "", remoteErr(op, name, err)
		}
		now = now.Add(time.Millisecond)
	}
}

// pruneUnfit stores what the merge file holds of the records it could
// not carry whole, not even in parts: the joined store's record limit is
// below some of their values (this database's old store allowed more),
// and merge.PruneRecord made each a removal. The store never holds those values,
// so this database must not either, or its snapshots could never be
// written. The app rows keep them, pending: each sync reports the record
// in Report.Skipped until the app makes it fit, and then they go out as
// new edits.
func (s *syncRun) pruneUnfit(ctx context.Context, unfit []recordKey) error {
	err := s.inTx(ctx, func() error {
		for _, k := range unfit {
			st, err := s.loadState(ctx, k.table, k.record)
			if err != nil {
				return err
			}
			merge.PruneRecord(st.node, s.limits.MaxRecordSize)
			if err := s.storeState(ctx, st, fileChange{table: k.table, record: k.record}); err != nil {
				return err
			}
			if err := s.exec(ctx, `INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id) VALUES (?1, ?2)`, k.table, k.record); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range unfit {
		if !slices.ContainsFunc(s.report.Skipped, func(r RecordError) bool { return r.Table == k.table && r.Record == k.record }) {
			s.skipRecord(k.table, k.record, fmt.Errorf("%w: a value is over the joined store's MaxRecordSize (%d bytes): make it smaller and it syncs", errTooLarge, s.limits.MaxRecordSize))
		}
	}
	return nil
}

// errUnreadableState marks a snapshot or merge file this device wrote that
// fails the checks every reader applies under the store's limits.
var errUnreadableState = errors.New("this device's state does not fit the store's limits")

// verifyState reads back a state file this device wrote, exactly as every
// device that downloads it will: a file that would be rejected must never
// be uploaded, and above all never become the authority that compaction
// deletes the files it replaces on.
func (s *syncRun) verifyState(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > s.limits.MaxSnapshotSize {
		return fmt.Errorf("%w: %d bytes, over the store's MaxSnapshotSize (%d)", ErrFileTooLarge, fi.Size(), s.limits.MaxSnapshotSize)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err = decodeStateFile(bufio.NewReader(f), s.e.deviceID, s.limits, func(fileChange) error { return nil })
	if err != nil {
		return classifyFileErr(err)
	}
	return nil
}

// heldFiles returns the patch and merge files on the remote that this
// device applied, and the snapshots on it that this device checked (see
// chooseSnapshot); it forgets applied files the remote no longer has.
func (s *syncRun) heldFiles(ctx context.Context) (held, knows []string, err error) {
	files, err := s.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return nil, nil, remoteErr("snapshot", "", err)
	}
	present := map[string]bool{}
	for _, f := range files {
		present[f.Name] = true
	}
	rows, err := s.conn.QueryContext(ctx, `SELECT name, status FROM sync_files WHERE status IN ('applied', 'checked') ORDER BY name`)
	if err != nil {
		return nil, nil, &Error{Op: "snapshot", Err: err}
	}
	var gone []string
	for rows.Next() {
		var name, status string
		if err := rows.Scan(&name, &status); err != nil {
			rows.Close()
			return nil, nil, &Error{Op: "snapshot", Err: err}
		}
		// Oldest first, and no more than the store lets a header list:
		// a file left out is neither compacted nor skipped by a new
		// device, which costs bytes but loses nothing.
		switch k, _, _, ok := parseFileName(name); {
		case !present[name]:
			gone = append(gone, name)
		case !ok:
			// Another store's file, which an older engine applied as
			// its own: not held, so nothing compacts it.
		case k == kindSnapshot:
			if int64(len(knows)) < s.limits.MaxHeldFiles {
				knows = append(knows, name)
			}
		case status == fileApplied && int64(len(held)) < s.limits.MaxHeldFiles:
			held = append(held, name)
		}
	}
	rows.Close()
	err = s.inTx(ctx, func() error {
		for _, name := range gone {
			if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1`, name); err != nil {
				return err
			}
		}
		return nil
	})
	return held, knows, err
}

// compact deletes what the newest snapshot older than ListOverlap
// replaces, and returns its name ("" if there is none yet). A failed
// delete is logged and left for the next compaction.
func (s *syncRun) compact(ctx context.Context) (string, error) {
	e := s.e
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr("compact", "", err)
	}
	files, err := e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return "", remoteErr("compact", "", err)
	}
	s.noteRemoteSize(files)
	// The authority must be readable by every device: a snapshot this
	// device read whole (or wrote), or one whose writer read it back under
	// the store's limits before uploading it (its header says so). A
	// header alone proves nothing of the records behind it, and deleting
	// the files a snapshot replaces on the word of one no device can read
	// would lose them.
	applied := map[string]bool{}
	rows, err := s.conn.QueryContext(ctx, `SELECT name FROM sync_files WHERE status = 'applied' AND name LIKE '%/snapshot\_%' ESCAPE '\'`)
	if err != nil {
		return "", &Error{Op: "compact", Err: err}
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return "", &Error{Op: "compact", Err: err}
		}
		applied[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", &Error{Op: "compact", Err: err}
	}
	var candidates []string
	for _, f := range files {
		kind, at, _, ok := parseFileName(f.Name)
		if ok && kind == kindSnapshot && !at.After(now.Add(-e.cfg.ListOverlap)) {
			candidates = append(candidates, f.Name)
		}
	}
	slices.Sort(candidates)
	var authority string
	var h stateHeader
	for i := len(candidates) - 1; i >= 0 && authority == ""; i-- {
		name := candidates[i]
		hh, err := s.readHeader(ctx, name)
		switch {
		case errors.As(err, new(rejection)) || errors.Is(err, fs.ErrNotExist):
			e.log.Warn("drivesync: a snapshot cannot be read; not compacting on its authority", "file", name, "err", err)
		case err != nil:
			return "", err
		case applied[name] || hh.verified:
			authority, h = name, hh
		}
	}
	if authority == "" {
		return "", nil
	}
	// Only what the authority holds: the files it names, and the older
	// snapshots its writer had checked (a snapshot written by a device
	// that had not yet seen an older one does not replace it).
	held, knows := map[string]bool{}, map[string]bool{}
	for _, name := range h.included {
		held[name] = true
	}
	for _, name := range h.knows {
		knows[name] = true
	}
	for _, f := range files {
		kind, at, _, ok := parseFileName(f.Name)
		if !ok {
			continue
		}
		old := (kind == kindSnapshot && knows[f.Name]) || (held[f.Name] && at.Before(h.cutoff))
		if !old {
			continue
		}
		if err := e.cfg.Remote.Delete(ctx, f.Name); err != nil {
			if ctx.Err() != nil {
				return "", &Error{Op: "compact", Err: ctx.Err()}
			}
			e.log.Warn("drivesync: could not delete an old file; the next compaction retries", "file", f.Name, "err", err)
			continue
		}
		s.report.Deleted++
	}
	e.log.Info("drivesync: compacted", "snapshot", authority, "deleted", s.report.Deleted)
	return authority, nil
}

// Snapshot syncs, then writes a snapshot of this database's synced state
// and compacts the remote now: it deletes the patch files and snapshots
// that the newest snapshot older than Config.ListOverlap replaces (the one
// just written replaces files once every device can see it: at the first
// sync after that). A sync writes a snapshot by itself once a month;
// Snapshot is for an app's maintenance button, and for tests.
//
// Through a Server there are no snapshots: Snapshot syncs.
func (e *Engine) Snapshot(ctx context.Context) (Report, error) {
	return e.run(ctx, func(s *syncRun) error {
		if e.cfg.Server != nil {
			_, _, err := s.syncServer(ctx)
			return err
		}
		l, f, err := s.sync(ctx)
		if err != nil {
			return err
		}
		return s.maintain(ctx, l, f, true)
	})
}

// keepUploads records, as a database binds to another store, the time of
// the newest name it uploaded: names up to it were uploaded to stores it
// bound to before, and uploadsGone, which prunes by what the bound store
// lists, keeps them. Later names are later still (see nameTime).
func keepUploads(ctx context.Context, q querier) error {
	kept, err := uploadsKept(ctx, q)
	if err != nil {
		return err
	}
	rows, err := q.QueryContext(ctx, `SELECT name FROM sync_uploaded`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		if _, at, _, ok := parseFileName(name); ok && at.After(kept) {
			kept = at
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil || kept.IsZero() {
		return err
	}
	return setMeta(ctx, q, metaUploadsKept, kept.UTC().Format(time.RFC3339Nano))
}

// uploadsKept returns the time keepUploads recorded, zero if none.
func uploadsKept(ctx context.Context, q querier) (time.Time, error) {
	v, err := getMeta(ctx, q, metaUploadsKept)
	if err != nil || v == "" {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("sync_meta %s: %w", metaUploadsKept, err)
	}
	return t, nil
}
