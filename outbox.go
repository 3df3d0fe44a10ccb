package drivesync

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/drivesync/drivesync/internal/merge"
	"github.com/drivesync/drivesync/internal/seal"
)

// The publish phase, and the outbox that makes publishing a patch file
// safe against every failure between upload and commit.
//
// Deleting the uploaded file when the local transaction fails seems
// natural. But another device may have applied the file in between; deleting it then
// leaves that device with changes the uploader takes back, and the two
// diverge for good. A crash leaves the file on the remote anyway, and the
// uploader would later diff its rows against a state that lacks its own
// file, so a later revert of an edit would look like "no change" and the
// file's old value would win everywhere.
//
// So a published file is never taken back. Before uploading, the engine
// stores the file in sync_outbox, in the same transaction that reserves
// its versions. The sync's final transaction deletes it. If that
// transaction never commits, the next Sync first publishes the stored
// file again (an existing file of that name means it is there already)
// and merges it into sync_states, so that every later diff is taken
// against a state that includes it. The records stay pending; their rows
// are untouched.

// outboxChunk bounds the memory the outbox needs: files are stored and
// read back in chunks of this size.
const outboxChunk = 1 << 20

func saveOutbox(ctx context.Context, q querier, name string, f *os.File) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	buf := make([]byte, outboxChunk)
	for seq := 0; ; seq++ {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			if _, err := q.ExecContext(ctx, `INSERT INTO sync_outbox (name, seq, data) VALUES (?, ?, ?)`, name, seq, buf[:n]); err != nil {
				return err
			}
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// errOtherEngine says that another Engine synced this database while this
// one did: it reserved versions this sync had planned with, or took out of
// the outbox, or renamed, an upload this sync was reading or publishing.
// The sync stops where it is, with nothing of its own committed; the next
// one goes on from what the other left.
var errOtherEngine = errors.New("another Engine synced this database at the same time; use one Engine per database, then sync again")

// errOutboxTaken is the error of a sync that found an outbox file gone,
// or changed, under it.
var errOutboxTaken = fmt.Errorf("the upload left the outbox under this sync: %w", errOtherEngine)

// outboxReader streams a stored file back, one chunk in memory at a time.
// It can seek, so that a Remote that retries an upload (Drive after a 503
// or a 429) can read the file again from the start.
//
// Its chunks are read one query at a time, outside any transaction: the
// upload is not held in memory, nor a read transaction open across it.
// Another Engine on the database may take the file out of the outbox
// meanwhile (it committed or adopted it) or rename it. The reader knows
// the file's size from the start, and a chunk that is missing or not of
// the size saveOutbox gave it fails the read with errOutboxTaken, sticky:
// an early end would make a Remote publish a file cut short. Content that
// is there is the file's own: a name's rows are inserted in one
// transaction, never written again under that name, and leave in one.
type outboxReader struct {
	ctx  context.Context
	q    querier
	name string
	size int64  // the stored file's size, from when it was opened
	pos  int64  // the position of the next byte Read returns
	cur  []byte // the loaded chunk's bytes from pos on
	err  error  // the file left the outbox, or changed
}

// openOutbox opens the outbox's file name for reading; a file not there
// gives errOutboxTaken.
func openOutbox(ctx context.Context, q querier, name string) (*outboxReader, error) {
	var chunks, size int64
	var last sql.NullInt64
	if err := q.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(length(data)), 0), max(seq) FROM sync_outbox WHERE name = ?`, name).Scan(&chunks, &size, &last); err != nil {
		return nil, err
	}
	switch {
	case chunks == 0:
		return nil, errOutboxTaken
	case last.Int64 != chunks-1 || size <= (chunks-1)*outboxChunk || size > chunks*outboxChunk:
		return nil, fmt.Errorf("the upload %s is stored in the outbox as %d chunks (the last numbered %d) of %d bytes in all, not as this engine stores it", name, chunks, last.Int64, size)
	}
	return &outboxReader{ctx: ctx, q: q, name: name, size: size}, nil
}

func (r *outboxReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if len(r.cur) == 0 {
		seq := r.pos / outboxChunk
		var data []byte
		err := r.q.QueryRowContext(r.ctx, `SELECT data FROM sync_outbox WHERE name = ? AND seq = ?`, r.name, seq).Scan(&data)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			r.err = errOutboxTaken
			return 0, r.err
		case err != nil:
			return 0, err
		case int64(len(data)) != min(outboxChunk, r.size-seq*outboxChunk):
			r.err = errOutboxTaken
			return 0, r.err
		}
		r.cur = data[r.pos-seq*outboxChunk:]
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	r.pos += int64(n)
	return n, nil
}

func (r *outboxReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	default:
		return 0, errors.New("outbox: invalid whence")
	}
	if offset < 0 {
		return 0, errors.New("outbox: negative position")
	}
	r.pos, r.cur = offset, nil
	return offset, nil
}

// remoteMatchesOutbox reports whether the remote file of that name holds
// exactly the stored upload. An error that matches errOtherEngine says
// that the upload left the outbox.
func (s *syncRun) remoteMatchesOutbox(ctx context.Context, name string) (bool, error) {
	src, err := openOutbox(ctx, s.conn, name)
	if err != nil {
		return false, &Error{Op: "upload", File: name, Err: err}
	}
	rc, err := s.e.openFile(ctx, name, nil)
	if err != nil {
		return false, remoteErr("upload", name, err)
	}
	defer rc.Close()
	local := bufio.NewReader(src)
	remote := bufio.NewReader(io.LimitReader(rc, s.limits.MaxFileSize+1))
	for {
		a, errA := local.ReadByte()
		b, errB := remote.ReadByte()
		switch {
		case errA != nil && errA != io.EOF:
			return false, &Error{Op: "upload", File: name, Err: errA}
		case errA == io.EOF && errB == io.EOF:
			return true, nil
		case errors.Is(errB, seal.ErrSealed):
			return false, nil // not a file this device sealed under that name
		case errB != nil && errB != io.EOF:
			return false, remoteErr("upload", name, errB)
		case errA != nil || errB != nil || a != b:
			return false, nil
		}
	}
}

// recoverOutbox publishes and adopts the files an earlier sync uploaded
// (or meant to) without committing, in order.
func (s *syncRun) recoverOutbox(ctx context.Context, l *listing) error {
	return s.eachOutbox(ctx, func(name string) error { return s.recoverOne(ctx, l, name) })
}

// eachOutbox calls fn with the outbox's oldest file until the outbox is
// empty (fn takes the file out) or fn fails.
func (s *syncRun) eachOutbox(ctx context.Context, fn func(name string) error) error {
	for {
		var name string
		err := s.conn.QueryRowContext(ctx, `SELECT name FROM sync_outbox ORDER BY name LIMIT 1`).Scan(&name)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return &Error{Op: "recover upload", Err: err}
		}
		if err := fn(name); err != nil {
			return err
		}
	}
}

// recoverOne publishes and adopts one file of the outbox.
//
// Another Engine on this database may be publishing the same file (its
// sync is under way, not failed) and take it out of the outbox, or rename
// it, while this one reads it: the read then fails (see outboxReader),
// the Remote publishes nothing, and the sync stops with errOtherEngine.
func (s *syncRun) recoverOne(ctx context.Context, l *listing, name string) error {
	e := s.e
	var err error
	if at, _, _ := parsePatchName(name); at.Before(l.cursor.Add(-e.cfg.ListOverlap / 4)) {
		// Published this late under its old name, the file could be
		// taken as held by a snapshot written since, or compacted as
		// old. Publish it under a fresh name; if the old one made it
		// to the remote after all, applying it twice is harmless.
		if name, err = s.renameOutbox(ctx, name); err != nil {
			return err
		}
	}
	for attempt := 0; ; attempt++ {
		var src *outboxReader
		if src, err = openOutbox(ctx, s.conn, name); err != nil {
			return &Error{Op: "recover upload", File: name, Err: err}
		}
		err = e.createFile(ctx, name, src, false)
		if src.err != nil {
			// Whatever the Remote made of it, it read no whole file.
			return &Error{Op: "recover upload", File: name, Err: src.err}
		}
		if errors.Is(err, fs.ErrExist) {
			// Published by the earlier sync, or another file of that
			// name: only the same bytes prove the former.
			var same bool
			if same, err = s.remoteMatchesOutbox(ctx, name); err != nil {
				return err
			}
			if !same {
				if attempt == 3 {
					return &Error{Op: "recover upload", File: name, Err: errors.New("the name keeps colliding with other files")}
				}
				if name, err = s.renameOutbox(ctx, name); err != nil {
					return err
				}
				continue
			}
		}
		if err != nil {
			return remoteErr("upload", name, err)
		}
		break
	}
	return s.adoptOutbox(ctx, name, true)
}

// adoptOutbox merges the outbox's file name, published, into the synced
// state as this device's own and takes it out of the outbox; ledger says
// whether the file is then recorded as applied (a Remote's file, not a
// Server's batch). A file another Engine took out of the outbox first
// (it committed or adopted it) is left to that Engine: errOtherEngine.
func (s *syncRun) adoptOutbox(ctx context.Context, name string, ledger bool) error {
	e := s.e
	sp, err := newSpool(e.cfg.TempDir)
	if err != nil {
		return err
	}
	defer sp.close()
	src, err := openOutbox(ctx, s.conn, name)
	if err != nil {
		return &Error{Op: "recover upload", File: name, Err: err}
	}
	counted := &countingReader{r: src}
	seq, err := decodePatchFile(counted, e.deviceID, math.MaxInt64, math.MaxInt64, sp.add)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case src.err != nil:
			err = src.err
		}
		return &Error{Op: "recover upload", File: name, Err: err}
	}
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "recover upload", Err: err}
	}
	err = func() error {
		// First, under the write lock: the file is still this sync's to adopt.
		taken, err := s.conn.ExecContext(ctx, `DELETE FROM sync_outbox WHERE name = ?`, name)
		if err != nil {
			return err
		}
		if n, err := taken.RowsAffected(); err != nil || n == 0 {
			return cmp.Or(err, errOutboxTaken)
		}
		err = sp.each(func(c fileChange) error {
			_, _, err := s.mergeIntoState(ctx, c, e.deviceID, nil)
			return err
		})
		if err != nil {
			return err
		}
		if ledger {
			if err := s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size, seq) VALUES (?1, 'applied', ?2, ?3)`, name, counted.n, seq); err != nil {
				return err
			}
			return holdAlso(ctx, s.conn, heldSet{}.with(e.deviceID, seq))
		}
		return nil
	}()
	if err == nil {
		_, err = s.conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		s.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return &Error{Op: "recover upload", File: name, Err: err}
	}
	s.report.Recovered = name
	e.log.Info("drivesync: recovered an upload that was not committed", "file", name)
	return nil
}

// waitForVersions returns a remote time at which this sync's versions are
// allowed (see merge.VersionsAllowed), so that every device takes the file. An
// honest store is always far below the bound; after a hostile file took
// the versions near it, a device waits for the clock up to a minute, and
// beyond that fails the sync, keeping its changes pending.
func waitForVersions(ctx context.Context, maxSeen int64, now time.Time) (time.Time, error) {
	// Readers judge by the time the file's name carries: milliseconds.
	if maxSeen <= merge.VersionsAllowed(now.Truncate(time.Millisecond)) {
		return now, nil
	}
	ready := merge.VersionTime(maxSeen).Truncate(time.Millisecond).Add(time.Millisecond)
	wait := ready.Sub(now)
	if wait > time.Minute {
		return now, &Error{Op: "reserve versions", Err: fmt.Errorf("this store's versions (%d) are ahead of the remote's clock until %s: sync again then", maxSeen, ready.UTC().Format(time.RFC3339))}
	}
	select {
	case <-ctx.Done():
		return now, &Error{Op: "reserve versions", Err: ctx.Err()}
	case <-time.After(wait):
	}
	return ready, nil
}

// nameTime returns the time to name this database's next file of kind
// by: now, or a millisecond after the newest name of that kind it ever
// used (every name is recorded before its upload, see noteUpload),
// whichever is later. Names then never meet: not those of one sync's
// several files, not those of a sync that follows within the same
// millisecond, nor an outbox file's new name (see renameOutbox), nor
// snapshots written one after another, even with a remote clock that
// stands still or goes back.
func (s *syncRun) nameTime(ctx context.Context, kind fileKind, now time.Time) (time.Time, error) {
	var last sql.NullString
	if err := s.conn.QueryRowContext(ctx, `SELECT max(name) FROM sync_uploaded WHERE name GLOB '*/' || ?1 || '*'`, kindPrefixes[kind]).Scan(&last); err != nil {
		return now, err
	}
	if k, at, _, ok := parseFileName(last.String); ok && k == kind && !now.Truncate(time.Millisecond).After(at) {
		now = at.Add(time.Millisecond)
	}
	return now, nil
}

// renameOutbox gives the stored upload a new name, later than every name
// used before, old included. The name is chosen under the write lock, so
// that another Engine on this database cannot choose it too; an upload
// that left the outbox meanwhile gives errOtherEngine.
func (s *syncRun) renameOutbox(ctx context.Context, old string) (string, error) {
	now, err := s.e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr("upload", old, err)
	}
	var name string
	// In one transaction: an outbox file whose name is not recorded as
	// this database's would look, once uploaded, like a copy's.
	err = s.inTx(ctx, func() error {
		if now, err = s.nameTime(ctx, kindPatch, now); err != nil {
			return err
		}
		name = patchFileName(now, s.e.deviceID)
		res, err := s.conn.ExecContext(ctx, `UPDATE sync_outbox SET name = ? WHERE name = ?`, name, old)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return cmp.Or(err, fmt.Errorf("%s: %w", old, errOutboxTaken))
		}
		return noteUpload(ctx, s.conn, name)
	})
	return name, err
}

// publish reserves the versions it is about to publish and stores the
// file in the outbox, in one transaction, then uploads it. Reserving first means
// that however the sync ends, later changes are numbered above the ones in
// this file: a stamp never names two different writes. The reservation
// also checks that no other Engine on this database reserved versions
// since the plan read them.
func (s *syncRun) publish(ctx context.Context, p *plan) error {
	e := s.e
	if err := p.checkVersions(); err != nil {
		return err
	}
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return remoteErr("upload", "", err)
	}
	if now, err = waitForVersions(ctx, p.maxSeen, now); err != nil {
		return err
	}
	if err := s.reserve(ctx, p, now); err != nil {
		return err
	}
	var total int64
	for _, up := range p.uploads {
		fi, err := up.f.Stat()
		if err != nil {
			total = 0 // unknown
			break
		}
		total += fi.Size()
	}
	e.progressStart("upload", len(p.uploads), total, p.sent)
	for i, up := range p.uploads {
		e.progressFile(i)
		if err := s.uploadOne(ctx, up); err != nil {
			return err
		}
		s.report.Uploaded = up.name
		s.report.ChangesSent += up.sent
		e.progressRecords(up.sent)
		e.log.Info("drivesync: uploaded", "file", up.name, "changes", up.sent)
	}
	e.progressEnd()
	return nil
}

// reserve names the plan's files after now, reserves their versions and
// stores them in the outbox, in one transaction.
func (s *syncRun) reserve(ctx context.Context, p *plan, now time.Time) error {
	if err := p.checkVersions(); err != nil {
		return err
	}
	e := s.e
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "reserve versions", Err: err}
	}
	err := func() error {
		stored, err := getMetaInt(ctx, s.conn, metaMaxVersion)
		if err != nil {
			return err
		}
		lastSeq, err := s.lastFileSeq(ctx)
		if err != nil {
			return err
		}
		// This sync published and merged whatever the outbox held before
		// it fetched (recoverOutbox): an upload there now is another
		// Engine's, between its reservation and its commit, sending the
		// very records this plan read as pending.
		var waiting bool
		if err := s.conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sync_outbox)`).Scan(&waiting); err != nil {
			return err
		}
		if stored != p.base || lastSeq != p.lastSeq || waiting {
			return errOtherEngine
		}
		// The files' names are a millisecond apart: each is unique, in
		// the order they were written, and after every name used before
		// (chosen under the write lock, by no other Engine too).
		if now, err = s.nameTime(ctx, kindPatch, now); err != nil {
			return err
		}
		for i, up := range p.uploads {
			up.name = patchFileName(now.Add(time.Duration(i)*time.Millisecond), e.deviceID)
		}
		if err := setMeta(ctx, s.conn, metaMaxVersion, strconv.FormatInt(p.maxSeen, 10)); err != nil {
			return err
		}
		if err := s.setLastFileSeq(ctx, p.seq); err != nil {
			return err
		}
		for _, up := range p.uploads {
			if err := saveOutbox(ctx, s.conn, up.name, up.f); err != nil {
				return err
			}
			if err := noteUpload(ctx, s.conn, up.name); err != nil {
				return err
			}
		}
		_, err = s.conn.ExecContext(ctx, "COMMIT")
		return err
	}()
	if err != nil {
		s.conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
		return &Error{Op: "reserve versions", Err: err}
	}
	return nil
}

// uploadOne uploads one planned file, stored in the outbox.
func (s *syncRun) uploadOne(ctx context.Context, up *upload) error {
	for attempt := 0; ; attempt++ {
		if _, err := up.f.Seek(0, io.SeekStart); err != nil {
			return &Error{Op: "upload", File: up.name, Err: err}
		}
		err := s.e.createFile(ctx, up.name, up.f, true)
		if err == nil {
			return nil
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return remoteErr("upload", up.name, err)
		}
		// Another Engine on this database, recovering this upload from
		// the outbox, may have published it first.
		same, err := s.remoteMatchesOutbox(ctx, up.name)
		if err != nil {
			return err
		}
		if same {
			return nil
		}
		// Another file has this name (a clock that went back): the
		// outbox must not later take that file for ours. Rename.
		if up.name, err = s.renameOutbox(ctx, up.name); err != nil {
			return err
		}
	}
}

// takeFromOutbox takes this sync's upload name out of the outbox, in the
// sync's final transaction. Another Engine on this database that took it
// out first (it adopted the upload) or renamed it makes this sync stop
// with errOtherEngine, committing nothing.
func (s *syncRun) takeFromOutbox(ctx context.Context, name string) error {
	n, err := s.execCount(ctx, `DELETE FROM sync_outbox WHERE name = ?1`, name)
	if err == nil && n == 0 {
		err = fmt.Errorf("%s: %w", name, errOutboxTaken)
	}
	return err
}

// removeOwnBroken removes from the remote, and forgets, a patch file that
// this database uploaded and that reads as broken (err, from reading d):
// empty, cut short, not gzip. Two Engines syncing one database once
// published such files. No device can have applied it, and every device
// would report it as rejected for ever. Nothing is lost with it: a name
// is recorded in sync_uploaded with its content in the outbox, and that
// content leaves the outbox only adopted or committed under a name this
// device then holds as applied (and never downloads), or renamed; so a
// file of its own that this device downloads is held under another name
// or still in the outbox, which the sync's recovery, run before, publishes
// under a new name when the remote's file of its name is not it. It
// reports whether it removed the file; when the removal fails, the file
// is rejected as any other and read again later.
func (f *fetcher) removeOwnBroken(ctx context.Context, d *downloaded, err error) bool {
	e := f.e
	_, device, _ := parsePatchName(d.name)
	var ahead *versionsAheadError
	if d.kind != kindPatch || device != e.deviceID || errors.As(err, &ahead) || errors.Is(err, seal.ErrNoKey) ||
		!errors.Is(classifyFileErr(err), ErrCorruptFile) {
		return false
	}
	var one int
	if f.conn.QueryRowContext(ctx, `SELECT 1 FROM sync_uploaded WHERE name = ?`, d.name).Scan(&one) != nil {
		return false // not recorded: a copy of this database wrote it (see checkCopied)
	}
	if derr := e.cfg.Remote.Delete(ctx, d.name); derr != nil {
		e.log.Warn("drivesync: could not remove a broken file this device uploaded; it is read again later", "file", d.name, "err", derr)
		return false
	}
	e.log.Warn("drivesync: removed a broken file this device uploaded", "file", d.name, "err", err)
	f.out.forget = append(f.out.forget, d.name)
	return true
}

// noteUpload records a file name this database uploads, before it tries:
// a file of its device id that it did not record was written by a copy of
// this database (see checkCopied).
func noteUpload(ctx context.Context, q querier, name string) error {
	_, err := q.ExecContext(ctx, `INSERT OR IGNORE INTO sync_uploaded (name) VALUES (?)`, name)
	return err
}

// checkVersions refuses a plan whose versions would pass merge.MaxVersion.
func (p *plan) checkVersions() error {
	if p.maxSeen > merge.MaxVersion {
		return &Error{Op: "reserve versions", Err: fmt.Errorf("versions would pass %d: this store cannot take more changes", int64(merge.MaxVersion))}
	}
	return nil
}
