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
	"strings"
	"time"
)

// Snapshots, compaction and bootstrap; the state file format is in
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

// chooseSnapshot checks every snapshot this device has not seen before,
// newest first, and loads those that hold what it lacks. A device with no
// state, or one joining a store, loads the newest readable one; any device
// loads a snapshot that holds a file, or knows an older snapshot, that it
// has not applied and will not download in this sync (one it rejected
// counts as not applied). Compaction deletes only files that a snapshot
// still on the remote holds, and snapshots that such a snapshot's writer
// had checked (see compact), so a device that finds nothing missing in the
// new snapshots it lists has lost nothing to compaction, however long it
// was away and whatever the devices' clocks say.
//
// A snapshot is recorded as checked (s.checked) or loaded only once it
// was read; one that cannot be read is rejected and read again later,
// like any rejected file.
func (s *syncRun) chooseSnapshot(ctx context.Context, snaps []RemoteFile) error {
	slices.SortFunc(snaps, func(a, b RemoteFile) int { return strings.Compare(b.Name, a.Name) }) // newest first
	s.snaps = snaps
	force := s.bootstrap || s.joining
	for _, f := range snaps {
		if k, known := s.known[f.Name]; known && !s.byName[f.Name] && (k.held() || s.stillRejected(k, f)) {
			continue
		}
		if s.covers[f.Name] {
			s.checked = append(s.checked, f) // a snapshot loaded here knows it: it holds what f holds
			continue
		}
		if force && len(s.loaded) == 0 {
			if err := s.loadSnapshot(ctx, f); err != nil {
				return err
			}
			continue
		}
		h, err := s.header(ctx, f.Name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			s.snapshotGone(f)
			continue
		case errors.As(err, new(rejection)):
			s.reject(&downloaded{name: f.Name, size: f.Size}, err.(rejection).err)
			continue
		case err != nil:
			return err
		}
		name, ok := s.lacks(h)
		if !ok {
			s.checked = append(s.checked, f)
			continue
		}
		s.e.log.Info("drivesync: a snapshot holds a file this device has not applied and cannot download; loading the snapshot", "snapshot", f.Name, "file", name)
		if err := s.loadSnapshot(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// snapshotGone handles a snapshot deleted before this sync could read it:
// compaction removes only snapshots that a newer one knows, so the newer
// one, listed now or soon, holds what it held.
func (s *syncRun) snapshotGone(f RemoteFile) {
	if s.byName[f.Name] {
		s.forget = append(s.forget, f.Name)
	}
}

// lacks returns a file or snapshot that h names and that this device does
// not hold: not applied (or, for a snapshot, checked), not held by a
// snapshot loaded in this sync, and not about to be read in this sync. A
// file it rejected earlier and does not read again now is lacking: h's
// writer could read it, so h brings its content.
func (s *syncRun) lacks(h stateHeader) (string, bool) {
	fetching := map[string]bool{}
	for _, d := range s.download {
		fetching[d.name] = true
	}
	for _, names := range [][]string{h.included, h.knows} {
		for _, name := range names {
			k, known := s.known[name]
			switch {
			case s.covers[name], known && k.held(), fetching[name]:
				continue
			case s.listed[name] && !known:
				continue // a snapshot checked later in this sync
			case s.listed[name] && !s.stillRejected(k, RemoteFile{Name: name, Size: k.size}):
				continue // a rejected snapshot read again in this sync
			}
			return name, true
		}
	}
	return "", false
}

// header returns the header of a listed snapshot, reading it once.
func (s *syncRun) header(ctx context.Context, name string) (stateHeader, error) {
	if h, ok := s.headers[name]; ok {
		return h, nil
	}
	h, err := s.readHeader(ctx, name)
	if err == nil {
		s.headers[name] = h
	}
	return h, err
}

// rejection marks an error of a remote file's content (not of the remote).
type rejection struct{ err error }

func (r rejection) Error() string { return r.err.Error() }

func (s *syncRun) readHeader(ctx context.Context, name string) (stateHeader, error) {
	_, _, device, _ := parseFileName(name)
	rc, err := s.e.cfg.Remote.Open(ctx, name)
	if unreadableFile(ctx, err) {
		return stateHeader{}, rejection{err}
	}
	if err != nil {
		return stateHeader{}, remoteErr("download", name, err)
	}
	defer rc.Close()
	src := &countingReader{r: rc}
	h, err := decodeStateFile(src, device, s.limits, nil)
	switch {
	case err == nil && h.store != s.store:
		return h, rejection{fmt.Errorf("%w: it belongs to store %s, not %s", ErrCorruptFile, h.store, s.store)}
	case err == nil:
		return h, nil
	case ctx.Err() != nil:
		return h, &Error{Op: "download", File: name, Err: ctx.Err()}
	case src.failed != nil:
		return h, remoteErr("download", name, src.failed)
	}
	return h, rejection{classifyFileErr(err)}
}

func classifyFileErr(err error) error {
	switch {
	case errors.Is(err, ErrUnsupportedFormat):
		return err
	case errors.Is(err, errTooLarge):
		return fmt.Errorf("%w: %w", ErrFileTooLarge, err)
	}
	return fmt.Errorf("%w: %w", ErrCorruptFile, err)
}

// loadSnapshot spools snapshot f, to be applied before any patch file,
// and takes what it holds as applied: the listed files it holds are not
// downloaded. A snapshot that cannot be read, or that was deleted since
// the listing, is skipped.
func (s *syncRun) loadSnapshot(ctx context.Context, f RemoteFile) error {
	d := &downloaded{name: f.Name, size: f.Size, kind: kindSnapshot, byName: s.byName[f.Name]}
	h, err := s.fetchStateFile(ctx, d, s.limits.MaxSnapshotSize)
	if err != nil || d.spool == nil {
		return err
	}
	s.loaded = append(s.loaded, d)
	for _, name := range slices.Concat(h.included, h.knows, []string{f.Name}) {
		s.covers[name] = true
	}
	s.download = slices.DeleteFunc(s.download, func(x *downloaded) bool { return x.spool == nil && s.covers[x.name] })
	return nil
}

// coverMissing takes the files this sync could not apply — deleted
// before it could download them, or rejected: truncated, corrupt, too
// large or of a newer format — from a listed snapshot that holds them (its
// writer could read them), loading that snapshot. A rejected snapshot is
// taken from a listed snapshot that knows it. A deleted file that no
// listed snapshot holds stops the sync: the next one lists the remote
// again and finds the snapshot that replaced it. A rejected file that none
// holds stays rejected and is read again later.
func (s *syncRun) coverMissing(ctx context.Context) error {
	if err := s.recoverForgotten(ctx); err != nil {
		return err
	}
	var missing []string
	for _, d := range s.gone {
		missing = append(missing, d.name)
	}
	for _, r := range s.report.Rejected {
		missing = append(missing, r.Name)
	}
	for _, name := range missing {
		for _, f := range s.snaps {
			if s.covers[name] {
				break
			}
			if f.Name == name {
				continue
			}
			h, ok, err := s.readableHeader(ctx, f.Name)
			if err != nil {
				return err
			}
			if ok && (slices.Contains(h.included, name) || slices.Contains(h.knows, name)) {
				if err := s.loadSnapshot(ctx, f); err != nil {
					return err
				}
			}
		}
	}
	for _, d := range s.gone {
		if !s.covers[d.name] {
			return &Error{Op: "download", File: d.name, Err: fmt.Errorf("%w: the file was deleted while this sync ran (another device compacted the remote); sync again", ErrRemote)}
		}
	}
	s.report.Rejected = slices.DeleteFunc(s.report.Rejected, func(r FileError) bool { return s.covers[r.Name] })
	s.settleChecked()
	return nil
}

// settleChecked keeps as checked only the snapshots whose every named file
// and snapshot this device holds once the downloads are done. A header
// read before the downloads counted a file about to be downloaded, or a
// snapshot about to be checked, as held; if that file was then rejected
// (and no snapshot could bring it), the device does not hold what the
// snapshot holds. Recorded as checked, the snapshot would be named as
// known by this device's own snapshots, which would then claim, and let
// compaction act on, content the device never had. Such a snapshot is
// left unrecorded (or rejected, if reading it failed) and judged again
// when next seen.
func (s *syncRun) settleChecked() {
	unheld := map[string]bool{}
	for _, r := range s.report.Rejected {
		unheld[r.Name] = true
	}
	for changed := true; changed; {
		changed = false
		s.checked = slices.DeleteFunc(s.checked, func(f RemoteFile) bool {
			h, read := s.headers[f.Name]
			drop := unheld[f.Name] || read && (slices.ContainsFunc(h.included, func(n string) bool { return unheld[n] }) ||
				slices.ContainsFunc(h.knows, func(n string) bool { return unheld[n] }))
			if drop {
				unheld[f.Name] = true
				changed = true
			}
			return drop
		})
	}
}

// readableHeader returns a listed snapshot's header; ok is false when the
// snapshot cannot be read or is gone, which only the remote's failure
// makes an error.
func (s *syncRun) readableHeader(ctx context.Context, name string) (h stateHeader, ok bool, err error) {
	h, err = s.header(ctx, name)
	if errors.As(err, new(rejection)) || errors.Is(err, fs.ErrNotExist) {
		return h, false, nil
	}
	return h, err == nil, err
}

// recoverForgotten loads what a rejected file held when reading it again
// found it gone: compaction deleted it, on the authority of a snapshot
// that includes it, and deletes that snapshot in turn only once a newer
// one knows it, whose writer held what it held. So a snapshot on the
// remote that includes the file, or that knows snapshots the remote no
// longer has (the head of such a chain), holds the file's content. This
// is rare and costs a full listing and a header per snapshot.
func (s *syncRun) recoverForgotten(ctx context.Context) error {
	if len(s.forget) == 0 {
		return nil
	}
	files, err := s.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return remoteErr("list", "", err)
	}
	present := map[string]bool{}
	var snaps []RemoteFile
	for _, f := range files {
		present[f.Name] = true
		if k, _, _, ok := parseFileName(f.Name); ok && k == kindSnapshot {
			snaps = append(snaps, f)
		}
	}
	slices.SortFunc(snaps, func(a, b RemoteFile) int { return strings.Compare(b.Name, a.Name) })
	for _, f := range snaps {
		if s.covers[f.Name] {
			continue
		}
		h, ok, err := s.readableHeader(ctx, f.Name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		holds := slices.ContainsFunc(s.forget, func(name string) bool {
			return !s.covers[name] && slices.Contains(slices.Concat(h.included, h.knows), name)
		})
		heads := slices.ContainsFunc(h.knows, func(name string) bool { return !present[name] && !s.covers[name] })
		if holds || heads {
			s.e.log.Info("drivesync: a file this device rejected is gone from the remote; loading a snapshot that holds it", "snapshot", f.Name)
			if err := s.loadSnapshot(ctx, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetchStateFile downloads a snapshot or merge file into d.spool; a file
// that cannot be read is rejected (d.spool stays nil).
func (s *syncRun) fetchStateFile(ctx context.Context, d *downloaded, limit int64) (stateHeader, error) {
	e := s.e
	_, _, device, _ := parseFileName(d.name)
	if d.size > limit {
		s.reject(d, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrFileTooLarge, d.size, limit))
		return stateHeader{}, nil
	}
	rc, err := e.cfg.Remote.Open(ctx, d.name)
	if errors.Is(err, fs.ErrNotExist) {
		if d.kind == kindMerge {
			s.vanished(d)
		} else {
			s.snapshotGone(RemoteFile{Name: d.name})
		}
		return stateHeader{}, nil
	}
	if unreadableFile(ctx, err) {
		s.reject(d, err)
		return stateHeader{}, nil
	}
	if err != nil {
		return stateHeader{}, remoteErr("download", d.name, err)
	}
	defer rc.Close()
	sp, err := newSpool(e.cfg.TempDir)
	if err != nil {
		return stateHeader{}, &Error{Op: "download", File: d.name, Err: err}
	}
	var maxV int64
	var spoolErr error
	src := &countingReader{r: &limitedReader{r: rc, n: limit, what: "compressed file"}}
	h, err := decodeStateFile(src, device, s.limits, func(c fileChange) error {
		maxV = max(maxV, c.version)
		spoolErr = sp.add(c)
		return spoolErr
	})
	if err == nil && h.store != s.store {
		err = rejection{fmt.Errorf("it belongs to store %s, not %s", h.store, s.store)}
	}
	if err == nil {
		_, at, _, _ := parseFileName(d.name)
		err = s.checkVersions(at, maxV)
	}
	if err != nil {
		sp.close()
		return h, s.readFailed(ctx, d, src, spoolErr, err)
	}
	d.spool = sp
	s.maxSeen = max(s.maxSeen, maxV)
	return h, nil
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
func (s *syncRun) pruneLedger(ctx context.Context) error {
	month := s.cursor.UTC().Format("2006-01")
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
	for name, k := range s.known {
		if k.held() && !present[name] {
			gone = append(gone, name)
		}
	}
	return s.inTx(ctx, func() error {
		for _, name := range gone {
			if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1 AND status IN ('applied', 'checked')`, name); err != nil {
				return err
			}
		}
		return setMeta(ctx, s.conn, metaPruned, month)
	})
}

// maintain runs after a successful sync: the month's first snapshot, the
// compaction a snapshot of this device made due, and the merge file a
// JoinRemote asked for. force (Engine.Snapshot) writes a snapshot and
// compacts now.
func (s *syncRun) maintain(ctx context.Context, force bool) error {
	e := s.e
	if err := s.pruneLedger(ctx); err != nil {
		return err
	}
	if s.joining {
		if _, err := s.writeState(ctx, kindMerge); err != nil {
			return err
		}
		if err := s.setMetas(ctx, metaJoin, ""); err != nil {
			return err
		}
	}
	last, err := getMeta(ctx, s.conn, metaSnapshot)
	if err != nil {
		return &Error{Op: "snapshot", Err: err}
	}
	lastAt, _ := time.Parse(time.RFC3339Nano, last)
	y1, m1, _ := lastAt.UTC().Date()
	y2, m2, _ := s.cursor.UTC().Date()
	if force || ((y1 != y2 || m1 != m2) && !s.emptyState(ctx)) {
		name, err := s.writeState(ctx, kindSnapshot)
		if errors.Is(err, errUnreadableState) && !force {
			// Nothing is lost: the patch files stay, uncompacted. Try
			// again next month rather than at every sync.
			e.log.Error("drivesync: the monthly snapshot was not written; the remote keeps every patch file until one can be", "err", err)
			return s.setMetas(ctx, metaSnapshot, s.cursor.UTC().Format(time.RFC3339Nano))
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
	if due != "" && !s.cursor.Before(dueAt.Add(e.cfg.ListOverlap)) || force {
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

func (s *syncRun) emptyState(ctx context.Context) bool {
	var empty bool
	err := s.conn.QueryRowContext(ctx, `SELECT NOT EXISTS (SELECT 1 FROM sync_states)`).Scan(&empty)
	return err == nil && empty
}

// writeState uploads sync_states as a snapshot or merge file.
func (s *syncRun) writeState(ctx context.Context, kind fileKind) (string, error) {
	e := s.e
	op := "snapshot"
	if kind == kindMerge {
		op = "merge"
	}
	h := stateHeader{device: e.deviceID, store: s.store, covers: s.cursor}
	if kind == kindSnapshot {
		h.cutoff = e.retained(s.cursor)
		if b := s.cursor.Add(-2 * e.cfg.ListOverlap); b.Before(h.cutoff) {
			h.cutoff = b // files a little older may still be arriving
		}
		var err error
		if h.included, h.knows, err = s.heldFiles(ctx); err != nil {
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
	n, err := writeStateFile(ctx, s.conn, f, h)
	endTx(s.conn) // a read transaction: ends the snapshot of the database
	if err != nil {
		return "", &Error{Op: op, Err: err}
	}
	if err := s.verifyState(f); err != nil {
		return "", &Error{Op: op, Err: fmt.Errorf("%w: %w (not uploaded: other devices could not read it)", errUnreadableState, err)}
	}
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr(op, "", err)
	}
	if now.Before(s.cursor) {
		now = s.cursor
	}
	for attempt := 0; ; attempt++ {
		name := remoteFileName(kind, now, e.deviceID)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", &Error{Op: op, Err: err}
		}
		if err := s.inTx(ctx, func() error { return noteUpload(ctx, s.conn, name) }); err != nil {
			return "", err
		}
		err := e.cfg.Remote.Create(ctx, name, f)
		if err == nil {
			e.log.Info("drivesync: wrote a "+op+" file", "file", name, "records", n)
			// Its own state: nothing to apply, and a snapshot it checked.
			var size int64
			if fi, err := f.Stat(); err == nil {
				size = fi.Size()
			}
			return name, s.inTx(ctx, func() error {
				return s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size) VALUES (?1, 'applied', ?2)`, name, size)
			})
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return "", remoteErr(op, name, err)
		}
		now = now.Add(time.Millisecond)
	}
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
		switch k, _, _, _ := parseFileName(name); {
		case !present[name]:
			gone = append(gone, name)
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
func (e *Engine) Snapshot(ctx context.Context) (Report, error) {
	return e.run(ctx, func(s *syncRun) error {
		if err := s.run(ctx); err != nil {
			return err
		}
		return s.maintain(ctx, true)
	})
}
