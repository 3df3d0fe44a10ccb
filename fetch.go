package drivesync

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/drivesync/drivesync/internal/merge"
	"github.com/drivesync/drivesync/internal/seal"
	"github.com/google/uuid"
)

// The fetch phase: from the listing and the ledger of files this device
// knows (sync_files), decide what to download, download it, validate it
// whole and spool it; reject what is malformed; and, with the snapshots
// (catchup.go), take in what compaction removed before this device had
// it.

// fetched is what the fetch phase found.
type fetched struct {
	// files are spooled and valid, in the order to apply them: the
	// snapshots to load first, then patch and merge files by name.
	files []*downloaded
	// rejected says, of each file rejected (Report.Rejected has the
	// errors), what it was judged under.
	rejected map[string]rejectedFile
	checked  []RemoteFile    // new snapshots this device holds everything of (see settleChecked)
	covers   map[string]bool // the files and snapshots the loaded snapshots hold
	forget   []string        // rejected files found gone when read again, own broken ones removed
	ledger   map[string]knownFile
	listed   map[string]bool // the listing's names
	maxSeen  int64           // the largest version in the files
	joining  bool            // JoinRemote was called: a snapshot is loaded, then a merge file uploaded
	// held is what sync_held held when the fetch began; vanished the
	// numbers of it that no file on the remote carries or holds any more
	// (see findVanished).
	held, vanished heldSet
	headers        map[string]stateHeader // the snapshot headers read
}

// empty reports whether the fetch found nothing to apply or record.
func (f *fetched) empty() bool {
	return len(f.files) == 0 && len(f.rejected) == 0 && len(f.checked) == 0 && len(f.forget) == 0 && len(f.headers) == 0
}

// A downloaded file is one the fetch reads: a patch, merge or snapshot
// file.
type downloaded struct {
	name   string
	size   int64 // -1 when read by name, not from a listing
	kind   fileKind
	byName bool    // a rejected file the listing no longer shows, read again
	spool  *spool  // nil until downloaded and valid
	seq    int64   // a patch or merge file's number among its device's (0: none)
	holds  heldSet // the numbers a loaded snapshot holds
}

// rejectedFile is what a rejection was decided under.
type rejectedFile struct {
	size   int64
	reader string // Limits.key, and when a file ahead of the clock is read again (see retryDue)
}

// knownFile is a row of the ledger, sync_files.
type knownFile struct {
	status    string // fileApplied, fileChecked or fileRejected
	size      int64
	checkedAt int64   // when it was rejected, by the remote's clock (Unix seconds)
	reader    string  // Limits.key when it was rejected
	attempts  int64   // reads that rejected it in a row
	seq       int64   // a patch or merge file's number (0: none or unknown)
	holds     heldSet // a snapshot's numbers it holds (nil: unknown)
}

// held reports whether this device holds what the file holds: it applied
// it, or, for a snapshot, checked that it holds nothing this device lacks.
func (k knownFile) held() bool { return k.status == fileApplied || k.status == fileChecked }

// fetcher is the fetch phase at work.
type fetcher struct {
	*syncRun
	l        *listing
	out      *fetched
	download []*downloaded          // the patch and merge files to read, by name
	snaps    []RemoteFile           // the snapshots listed or read again by name, newest first
	byName   map[string]bool        // rejected snapshots read again by name
	headers  map[string]stateHeader // the snapshot headers read
	loaded   []*downloaded          // the snapshots to apply first
	gone     []*downloaded          // listed files deleted before they were downloaded
}

// fetch spools every listed file not applied yet, starting with the
// snapshots the device needs (see catchup.go).
func (s *syncRun) fetch(ctx context.Context, l *listing) (*fetched, error) {
	f := &fetcher{syncRun: s, l: l, byName: map[string]bool{}, headers: map[string]stateHeader{},
		out: &fetched{rejected: map[string]rejectedFile{}, covers: map[string]bool{}, listed: map[string]bool{}}}
	join, err := getMeta(ctx, s.conn, metaJoin)
	if err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	f.out.joining = join != ""
	if f.out.ledger, err = loadLedger(ctx, s.conn); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	if f.out.held, err = loadHeld(ctx, s.conn); err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	f.out.vanished = heldSet{}
	var snaps []RemoteFile
	for _, file := range l.files {
		kind, _, _, ok := parseFileName(file.Name)
		if !ok || f.out.listed[file.Name] {
			continue // not ours (other apps' files), or listed twice
		}
		f.out.listed[file.Name] = true
		if kind == kindSnapshot {
			snaps = append(snaps, file)
			continue
		}
		if k, seen := f.out.ledger[file.Name]; seen && (k.held() || f.stillRejected(k, file)) {
			continue
		}
		f.download = append(f.download, &downloaded{name: file.Name, size: file.Size, kind: kind})
	}
	// A remote may list only files created since the cursor: a rejected
	// file is read again by name once its reason may have gone, however
	// old it is.
	for name, k := range f.out.ledger {
		kind, _, _, ok := parseFileName(name)
		if !ok || k.status != fileRejected || f.out.listed[name] || !f.retryDue(k) {
			continue
		}
		if kind == kindSnapshot {
			snaps = append(snaps, RemoteFile{Name: name, Size: -1})
			f.byName[name] = true
			continue
		}
		f.download = append(f.download, &downloaded{name: name, size: -1, kind: kind, byName: true})
	}
	slices.SortFunc(f.download, func(a, b *downloaded) int { return cmp.Compare(a.name, b.name) })
	if err := f.chooseSnapshots(ctx, snaps); err != nil {
		return nil, err
	}
	var total int64
	for _, d := range f.download {
		if d.size < 0 {
			total = 0
			break
		}
		total += d.size
	}
	s.e.progressStart("download", len(f.download), total, 0)
	for i, d := range f.download {
		s.e.progressFile(i)
		from := s.e.meter.p.Bytes
		if err := f.fetchFile(ctx, d); err != nil {
			return nil, err
		}
		s.e.progressRest(from, d.size)
	}
	s.e.progressEnd()
	if err := f.coverMissing(ctx); err != nil {
		return nil, err
	}
	if err := f.settleChecked(ctx); err != nil {
		return nil, err
	}
	f.out.files = f.loaded // snapshots first
	for _, d := range f.download {
		if d.spool != nil {
			f.out.files = append(f.out.files, d)
		}
	}
	if err := f.findVanished(ctx); err != nil {
		return nil, err
	}
	f.out.headers = f.headers
	return f.out, nil
}

// loadLedger reads sync_files.
func loadLedger(ctx context.Context, q querier) (map[string]knownFile, error) {
	ledger := map[string]knownFile{}
	rows, err := q.QueryContext(ctx, `SELECT name, status, size, checked_at, reader, attempts, seq, holds FROM sync_files`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var k knownFile
		var holds sql.NullString
		if err := rows.Scan(&name, &k.status, &k.size, &k.checkedAt, &k.reader, &k.attempts, &k.seq, &holds); err != nil {
			return nil, err
		}
		if holds.Valid {
			if k.holds, err = parseHeld([]byte(holds.String), math.MaxInt64); err != nil {
				return nil, fmt.Errorf("sync_files %s: holds: %w", name, err)
			}
		}
		ledger[name] = k
	}
	return ledger, rows.Err()
}

// rejectRetry is how long a rejected file is left alone before it is read
// again: a folder-sync tool may still be writing it. The delay doubles
// with each read that rejects it again, up to rejectRetryMax, so that a
// file that is broken for good costs one download a day.
const (
	rejectRetry    = time.Hour
	rejectRetryMax = 24 * time.Hour
)

// readAgainAt joins the reader key of a file rejected for versions ahead
// of this device's clock and the time it may be read again.
const readAgainAt = ", read again at "

// retryDue reports whether a rejected file should be read again: its
// reason may have gone, because this app now reads other formats or the
// store other limits, or because enough time has passed.
func (f *fetcher) retryDue(k knownFile) bool {
	if at, ok := strings.CutPrefix(k.reader, f.readerKey()+readAgainAt); ok {
		t, err := time.Parse(time.RFC3339Nano, at)
		return err != nil || !f.l.cursor.Before(t)
	}
	if k.reader != f.readerKey() {
		return true
	}
	wait := rejectRetryMax
	if k.attempts < 6 {
		wait = min(rejectRetry<<max(k.attempts-1, 0), rejectRetryMax)
	}
	return f.l.cursor.Sub(time.Unix(k.checkedAt, 0)) >= wait
}

// stillRejected reports whether a listed file rejected earlier should be
// skipped without downloading it again. A new size means new content.
func (f *fetcher) stillRejected(k knownFile, file RemoteFile) bool {
	return k.status == fileRejected && k.size == file.Size && !f.retryDue(k)
}

// fetchFile downloads one file into a spool. A file that turns out to be
// malformed is rejected (reported, d.spool left nil); a remote failure
// fails the sync.
func (f *fetcher) fetchFile(ctx context.Context, d *downloaded) error {
	e := f.e
	if d.kind == kindMerge {
		_, err := f.fetchStateFile(ctx, d, f.limits.MaxSnapshotSize)
		return err
	}
	_, device, _ := parsePatchName(d.name)
	if e.listedOver(d, f.limits.MaxFileSize) {
		f.reject(d, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrFileTooLarge, d.size, f.limits.MaxFileSize))
		return nil
	}
	progress := &progressReader{e: e}
	rc, err := e.openFile(ctx, d.name, progress)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f.vanished(d)
		return nil
	case unreadableFile(ctx, err):
		f.reject(d, err)
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
	src := &countingReader{r: &limitedReader{r: rc, n: f.limits.MaxFileSize, what: "compressed file"}}
	d.seq, err = decodePatchFile(src, device, f.limits.MaxExpandedSize, f.limits.MaxRecordSize, func(c fileChange) error {
		progress.report()
		maxV = max(maxV, c.version)
		spoolErr = sp.add(c)
		return spoolErr
	})
	progress.report()
	if err == nil {
		_, at, _, _ := parseFileName(d.name)
		err = f.checkVersions(at, maxV)
	}
	if err != nil {
		sp.close()
		return f.readFailed(ctx, d, src, spoolErr, err)
	}
	f.keep(d, sp, maxV)
	return nil
}

// keep takes a downloaded file's valid spool.
func (f *fetcher) keep(d *downloaded, sp *spool, maxV int64) {
	d.spool = sp
	f.onDone(sp.close)
	f.out.maxSeen = max(f.out.maxSeen, maxV)
}

// checkVersions rejects a received file, named at "at", whose largest
// version v is above what its time allows (see merge.VersionsAllowed). A file
// named later than this device's clock is judged by the clock; it is read
// again once the clock has reached the time its versions need.
func (f *fetcher) checkVersions(at time.Time, v int64) error {
	if v > merge.VersionsAllowed(at) {
		return fmt.Errorf("version %d is above %d, the most a file named at %s may carry: the file is broken or hostile", v, merge.VersionsAllowed(at), at.UTC().Format(time.RFC3339))
	}
	if v > merge.VersionsAllowed(f.l.cursor) {
		return &versionsAheadError{v: v, at: merge.VersionTime(v)}
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

// vanished handles a file that was gone when this sync opened it. A
// listed file was deleted since the listing (compacted): a listed
// snapshot must bring what it held (see coverMissing). A rejected file
// read again by name was compacted long ago: it is forgotten, and a
// snapshot that holds it is loaded (see recoverForgotten).
func (f *fetcher) vanished(d *downloaded) {
	if d.byName {
		f.out.forget = append(f.out.forget, d.name)
		return
	}
	f.gone = append(f.gone, d)
}

// readFailed sorts out why reading remote file d failed: a cancelled
// context, the remote or the local spool fails the sync (returned); a
// malformed file is rejected (nil).
func (f *fetcher) readFailed(ctx context.Context, d *downloaded, src *countingReader, spoolErr, err error) error {
	switch {
	case ctx.Err() != nil:
		return &Error{Op: "download", File: d.name, Err: ctx.Err()}
	case src.failed != nil:
		return remoteErr("download", d.name, src.failed)
	case spoolErr != nil: // a local disk problem, not the file's fault
		return &Error{Op: "download", File: d.name, Err: spoolErr}
	case errors.Is(err, seal.ErrNoKey):
		// Another device's new key, or a header altered: the store's
		// key checks tell which.
		if werr := f.foreignKey(ctx, d.name); werr != nil {
			return werr
		}
	}
	if f.removeOwnBroken(ctx, d, err) {
		return nil
	}
	f.reject(d, classifyFileErr(err))
	return nil
}

func (f *fetcher) reject(d *downloaded, err error) {
	f.e.log.Warn("drivesync: rejected remote file", "file", d.name, "err", err)
	r := rejectedFile{size: d.size, reader: f.readerKey()}
	if ahead := (*versionsAheadError)(nil); errors.As(err, &ahead) {
		r.reader += readAgainAt + ahead.at.UTC().Format(time.RFC3339Nano)
	} else if errors.Is(err, seal.ErrNoKey) {
		// Encrypted with a key this device lacks, and the store listed no
		// such key yet: read it again at the next sync, which may list
		// the key another device added, and stop then (see foreignKey).
		r.reader += readAgainAt + f.l.cursor.UTC().Format(time.RFC3339Nano)
	}
	f.out.rejected[d.name] = r
	f.report.Rejected = append(f.report.Rejected, FileError{Name: d.name, Err: &Error{Op: "read", File: d.name, Err: err}})
}

// readerKey says what a file was judged with: the store's limits and this
// device's keys. A file rejected under other limits or keys is read again
// at once: a key added since may open it.
func (f *fetcher) readerKey() string {
	return f.limits.key() + f.e.keys.id()
}

func classifyFileErr(err error) error {
	switch {
	case errors.Is(err, ErrUnsupportedFormat):
		return err
	case errors.Is(err, errTooLarge):
		return fmt.Errorf("%w: %w", ErrFileTooLarge, err)
	case errors.Is(err, seal.ErrSealed):
		return fmt.Errorf("%w: %w: it was altered, truncated or renamed on the remote, or encrypted with a key this device does not have", ErrCorruptFile, err)
	}
	return fmt.Errorf("%w: %w", ErrCorruptFile, err)
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
	if err != nil && err != io.EOF && !errors.Is(err, errTooLarge) && !errors.Is(err, seal.ErrSealed) {
		c.failed = err
	}
	return n, err
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
func (s *syncRun) checkCopied(ctx context.Context, l *listing) error {
	e := s.e
	since, err := getMeta(ctx, s.conn, metaUploads)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if since == "" {
		return s.setMetas(ctx, metaUploads, l.cursor.UTC().Format(time.RFC3339Nano))
	}
	from, err := time.Parse(time.RFC3339Nano, since)
	if err != nil {
		return &Error{Op: "sync", Err: fmt.Errorf("sync_meta %s: %w", metaUploads, err)}
	}
	var foreign string
	for _, f := range l.files {
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
	return s.takeNewID(ctx, uuid.NewString(), "another copy of this database syncs under its device id", "file", foreign)
}

// takeNewID gives this database device id id (versions go on from
// max_version, so no stamp is reused), saying why in the log.
func (s *syncRun) takeNewID(ctx context.Context, id, why string, attrs ...any) error {
	e := s.e
	if err := s.inTx(ctx, func() error {
		if _, err := s.conn.ExecContext(ctx, `DELETE FROM sync_meta WHERE key = ?`, metaRenewID); err != nil {
			return err
		}
		return setMeta(ctx, s.conn, metaDeviceID, id)
	}); err != nil {
		return err
	}
	e.log.Warn("drivesync: "+why+"; taking a new device id", append([]any{"old", e.deviceID, "new", id}, attrs...)...)
	e.idMu.Lock()
	e.deviceID = id
	e.idMu.Unlock()
	return nil
}

// renewMovedID takes the new device id that Open owed a copied database
// file while its outbox held an upload named and stamped with the old id
// (see installSchema): that upload is published and adopted first, under
// the id it carries, and nothing else has been stamped since.
func (s *syncRun) renewMovedID(ctx context.Context) error {
	owed, err := getMeta(ctx, s.conn, metaRenewID)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	switch owed {
	case "":
		return nil
	case "1":
		return s.takeNewID(ctx, uuid.NewString(), "this database file is a copy, opened while an upload of the original's was in its outbox")
	}
	return s.takeNewID(ctx, owed, "the app gave this database a new Config.DeviceID while an upload under the old one was in its outbox")
}
