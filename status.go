package drivesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Status is what an app shows of its sync: what waits, how the last sync
// went, and what the engine knows of the remote. Engine.Status reads it
// from the database alone, without a remote request: the remote's part is
// as the last sync found it.
type Status struct {
	DeviceID string
	// Pending counts the records with local changes not synced yet.
	Pending int
	// OutboxWaiting says that an upload was planned and may be on the
	// remote but its sync did not commit: the next Sync publishes and
	// merges it before anything else.
	OutboxWaiting bool
	// LastSync is when the last sync (Sync, Snapshot, JoinRemote,
	// StartFresh) ended, by this device's clock; zero if none did.
	// LastError is its error, "" if it succeeded; LastSuccess is when
	// the last one that succeeded ended.
	LastSync, LastSuccess time.Time
	LastError             string
	// Store is the id of the store this database syncs with ("" before
	// its first sync), and Remote the identity of the remote it last
	// bound through (see IdentifiedRemote; a server's address), "" if
	// the remote cannot tell.
	Store, Remote string
	// Encrypted says that Config.Encryption is set.
	Encrypted bool
	// Conflicts counts the entries of the conflict log (see Conflicts).
	Conflicts int
	// Missing lists files of other devices that this device has not
	// received although it holds earlier and later files of the same
	// device (see Report.Missing).
	Missing []FileSpan
	// ClockOffset is the remote's clock less this device's, as the last
	// sync that read the remote's clock estimated it; ClockKnown says it
	// did. ClockWarning, when this device's clock is off by more than a
	// minute, says so and what it means. The engine names files by the
	// remote's clock, so an offset breaks nothing; but the app's own
	// timestamps (an updated_at it writes) are off by as much.
	ClockOffset  time.Duration
	ClockKnown   bool
	ClockWarning string
	// RemoteBytes is the size of the store's files on the remote, as the
	// last sync that listed them all found it (-1: unknown), at
	// RemoteBytesAt.
	RemoteBytes   int64
	RemoteBytesAt time.Time
}

// lastSync is what a run records for Status (metaStatus).
type lastSync struct {
	At          time.Time     `json:"at"`
	Error       string        `json:"error,omitempty"`
	Success     time.Time     `json:"success"`
	Offset      time.Duration `json:"offset"`
	OffsetKnown bool          `json:"offset_known"`
	Bytes       int64         `json:"remote_bytes"`
	BytesAt     time.Time     `json:"remote_bytes_at"`
}

// clockTolerance is the clock offset past which Status warns.
const clockTolerance = time.Minute

// Status returns the sync's status; see Status.
func (e *Engine) Status(ctx context.Context) (Status, error) {
	st := Status{DeviceID: e.DeviceID(), Encrypted: e.cfg.Encryption != nil, RemoteBytes: -1}
	err := e.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+pendingUnion+`), EXISTS (SELECT 1 FROM sync_outbox),
	(SELECT count(*) FROM sync_conflicts),
	coalesce((SELECT value FROM sync_meta WHERE key = ?1), ''), coalesce((SELECT value FROM sync_meta WHERE key = ?2), '')`, metaStore, metaRemoteID).
		Scan(&st.Pending, &st.OutboxWaiting, &st.Conflicts, &st.Store, &st.Remote)
	if err != nil {
		return st, &Error{Op: "status", Err: err}
	}
	if st.Missing, err = missingFiles(ctx, e.db); err != nil {
		return st, &Error{Op: "status", Err: err}
	}
	raw, err := getMeta(ctx, e.db, metaStatus)
	if err != nil {
		return st, &Error{Op: "status", Err: err}
	}
	var last lastSync
	if raw == "" || json.Unmarshal([]byte(raw), &last) != nil {
		last = lastSync{}
	}
	e.lastMu.Lock()
	mem := e.last
	e.lastMu.Unlock()
	if mem.At.After(last.At) {
		last = mem // not recorded in the database (locked, or the sync's deadline passed)
	}
	if mem.BytesAt.After(last.BytesAt) {
		last.Bytes, last.BytesAt = mem.Bytes, mem.BytesAt // from RemoteSize
	}
	if !last.At.IsZero() {
		st.LastSync, st.LastError, st.LastSuccess = last.At, last.Error, last.Success
		st.ClockOffset, st.ClockKnown = last.Offset, last.OffsetKnown
		if last.BytesAt.IsZero() {
			st.RemoteBytes = -1
		} else {
			st.RemoteBytes, st.RemoteBytesAt = last.Bytes, last.BytesAt
		}
	}
	if st.Remote == "" && e.cfg.Server != nil {
		if r, ok := e.cfg.Server.(interface{ Identity() string }); ok {
			st.Remote = r.Identity()
		}
	}
	if off := st.ClockOffset.Abs(); st.ClockKnown && off > clockTolerance {
		dir := "behind"
		if st.ClockOffset < 0 {
			dir = "ahead of"
		}
		st.ClockWarning = fmt.Sprintf("this device's clock is %s %s the remote's: set it right (automatic time). Sync works, but times the app records are off by as much", off.Round(time.Second), dir)
	}
	return st, nil
}

// noteClock records the remote's clock against this device's: remote was
// read between before and after.
func (s *syncRun) noteClock(remote, before, after time.Time) {
	mid := before.Add(after.Sub(before) / 2)
	s.offset, s.offsetKnown = remote.Sub(mid), true
}

// noteRemoteSize records the size of a listing of every file.
func (s *syncRun) noteRemoteSize(files []RemoteFile) {
	var n int64
	for _, f := range files {
		if f.Size < 0 {
			return // the remote does not know a size: unknown
		}
		n += f.Size
	}
	s.remoteBytes, s.remoteBytesAt = n, time.Now().UTC()
	s.e.uploaded = 0 // counted from this listing on
}

// recordStatus records how the run ended, for Status: in the Engine, and
// in the database if it can be written at once, within the run's
// context: a sync never outlasts its caller's deadline for it, and a
// database another writer holds keeps the previous status there.
func (s *syncRun) recordStatus(ctx context.Context, runErr error) {
	e := s.e
	e.lastMu.Lock()
	last := e.last
	e.lastMu.Unlock()
	if last.At.IsZero() {
		if raw, err := getMeta(ctx, s.conn, metaStatus); err == nil && raw != "" {
			json.Unmarshal([]byte(raw), &last)
		}
	}
	last.At = time.Now().UTC()
	last.Error = ""
	if runErr != nil {
		last.Error = runErr.Error()
	} else {
		last.Success = last.At
	}
	if s.offsetKnown {
		last.Offset, last.OffsetKnown = s.offset, true
	}
	if !s.remoteBytesAt.IsZero() {
		// The listing's files and what this run uploaded after it.
		last.Bytes, last.BytesAt = s.remoteBytes+s.e.uploaded, s.remoteBytesAt
	}
	e.lastMu.Lock()
	e.last = last
	e.lastMu.Unlock()
	if ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	b, _ := json.Marshal(last)
	// Not waiting for another writer: the app's busy_timeout is set
	// aside for this one write.
	var busy int
	if err := s.conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err == nil && busy > 0 {
		if _, err := s.conn.ExecContext(ctx, `PRAGMA busy_timeout = 0`); err == nil {
			defer s.conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA busy_timeout = %d`, busy))
		}
	}
	if err := setMeta(ctx, s.conn, metaStatus, string(b)); err != nil {
		e.log.Info("drivesync: the sync's status is kept in memory: the database is busy", "err", err)
	}
}

// RemoteSize lists the remote and returns the bytes the store's files
// take there, a request Status never makes itself; Status shows the
// result from then on. A sync server does not say: it returns an error.
func (e *Engine) RemoteSize(ctx context.Context) (int64, error) {
	if e.cfg.Remote == nil {
		return 0, &Error{Op: "remote size", Err: errors.New("a sync server does not report the size of a store")}
	}
	files, err := e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return 0, remoteErr("list", "", err)
	}
	var n int64
	for _, f := range files {
		if f.Size < 0 {
			return 0, &Error{Op: "remote size", Err: errors.New("the remote does not list the sizes of its files")}
		}
		n += f.Size
	}
	e.lastMu.Lock()
	e.last.Bytes, e.last.BytesAt = n, time.Now().UTC()
	e.lastMu.Unlock()
	return n, nil
}
