package drivesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/drivesync/drivesync/internal/merge"
	"github.com/google/uuid"
)

// A Server is a sync server that keeps a store's records itself and
// merges the devices' writes with the same rules as the devices (package
// httpremote reaches drivesync-server). Set Config.Server instead of
// Config.Remote to sync through one.
//
// Through a server a sync pushes this device's changes as one batch of
// stamped writes, and pulls the merged state of every record changed
// since its cursor, a page at a time; a new device pulls every record.
// A push whose writes follow on from the cursor moves it past them
// (PushResult.Cursor): the next pull does not bring them back.
// The server keeps no files: there are no snapshots to write and nothing
// to compact. What the device receives is merged into its synced state
// exactly as a snapshot's records are.
//
// Implementations must be safe for concurrent use.
type Server interface {
	// Push applies a batch of writes to the store exactly once, however
	// often the batch is sent with the same key. An error that matches
	// ErrRemoteChanged says the server's store is not batch.StoreID.
	Push(ctx context.Context, batch *PushBatch) (*PushResult, error)
	// Pull returns the records written after cursor ("" for every
	// record), as many as the server puts in one page. An error that
	// matches ErrRemoteChanged says the store is not storeID ("" asks
	// for whatever store the server holds).
	Pull(ctx context.Context, storeID, cursor string) (*PullPage, error)
}

// PushBatch is one push.
type PushBatch struct {
	// StoreID is the store this device syncs with, "" before its first
	// sync: the server then creates the store if it has none.
	StoreID string
	// Key makes the push idempotent: the server applies a batch sent
	// again with the same key once.
	Key    string
	Writes []ServerWrite
	// Cursor is where this device's next pull would start (a cursor
	// of a PullPage or PushResult), "" for none: the server answers
	// whether the batch's writes follow on from it (PushResult.Cursor).
	Cursor string
}

// ServerWrite is one write of a push: a change this device made, stamped
// with its version and device, or (when Clock is set) the whole state of
// a record, which a device joining a store sends.
type ServerWrite struct {
	Table, Record string
	Version       int64
	Device        string
	// Patch is an RFC 7396 merge patch (nulls remove), or with Clock the
	// record's content; nil for a delete.
	Patch   json.RawMessage
	Deleted bool
	// Replaces marks a record created again over one its device saw
	// deleted: every write up to ResetVersion by ResetDevice is gone.
	Replaces     bool
	ResetVersion int64
	ResetDevice  string
	// Clock is the record's stamps, for a state: see the drivesync-server
	// protocol.
	Clock json.RawMessage
	// Seen is the write's "seen" list, for the other devices' conflict
	// logs: the stamp this device held at each path the patch writes
	// (see Conflicts). Sent only to a server whose PullPage.Seen is set.
	Seen json.RawMessage
}

// PushResult is the server's answer to a push.
type PushResult struct {
	StoreID string // the store the writes went to
	// Cursor, if not "", may replace the batch's Cursor as where the
	// next pull starts: every record the store wrote after the batch's
	// Cursor up to it is a write of this batch, which the device holds
	// already. "" when other writes came between (or the server cannot
	// tell): the next pull starts at the batch's Cursor and brings them,
	// with the batch's records.
	Cursor string
}

// PullPage is one page of a pull.
type PullPage struct {
	// StoreID is the server's store, "" if it has none yet.
	StoreID string
	Records []ServerRecord
	// Cursor is where the next pull starts; More says whether records
	// after this page exist now.
	Cursor string
	More   bool
	// MaxRecordSize and MaxBodySize are the server's limits on one
	// write's patch and on a push's body (0: unknown). The engine plans
	// its pushes within them.
	MaxRecordSize, MaxBodySize int64
	// Seen says that the server keeps what writes had seen
	// (ServerWrite.Seen) and sends it with records (ServerRecord.Seen).
	Seen bool
}

// ServerRecord is the merged state of one record.
type ServerRecord struct {
	Table, Record string
	Data, Clock   json.RawMessage
	Deleted       bool
	// Seen lists, for each path an engine's write set, what that write
	// had seen there: [[path], seen version, seen device, writer
	// version, writer device]. A device logs the value it showed at such
	// a path as a conflict when the writer had not seen it. Nil: nothing
	// known.
	Seen json.RawMessage
}

// serverLimits are the limits of a store on a server whose limits on a
// write and on a push are maxRecord and maxBody (0: not known, the
// defaults): a change goes in writes within maxRecord, and a push holds at
// most 16 MiB of changes, or a quarter of maxBody (its JSON takes more
// than the patch file it comes from).
func serverLimits(maxRecord, maxBody int64) Limits {
	l := Limits{MaxFileSize: 16 << 20, MaxExpandedSize: 16 << 20, MaxRecordSize: DefaultMaxRecordSize}
	if maxRecord > 0 {
		l.MaxRecordSize = min(maxRecord, DefaultMaxRecordSize)
	}
	if maxBody > 0 {
		// A change too large for a push is not sent (reported in
		// Report.Skipped): never a push the server refuses.
		l.MaxExpandedSize = max(min(l.MaxExpandedSize, maxBody/4), 1)
		l.MaxFileSize = l.MaxExpandedSize
		l.MaxRecordSize = min(l.MaxRecordSize, l.MaxExpandedSize)
	}
	return l.withDefaults()
}

// syncServer is Sync through a Server: push the outbox left by a sync that
// did not commit, pull, plan, push, and commit, as a sync through files
// does (see sync), with the pulled records in place of the downloads.
func (s *syncRun) syncServer(ctx context.Context) (*listing, *fetched, error) {
	e := s.e
	var err error
	if s.store, err = getMeta(ctx, s.conn, metaStore); err != nil {
		return nil, nil, &Error{Op: "sync", Err: err}
	}
	s.limits = serverLimits(0, 0)
	if err := s.recoverPushes(ctx); err != nil {
		return nil, nil, err
	}
	if err := s.renewMovedID(ctx); err != nil {
		return nil, nil, err
	}
	l := &listing{server: true}
	f, err := s.pull(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	if err := s.hook("fetched"); err != nil {
		return nil, nil, err
	}
	if err := s.pushJoin(ctx); err != nil {
		return nil, nil, err
	}
	p, idle, err := s.planSync(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	if idle {
		return l, f, s.setMetas(ctx, metaServerCursor, l.serverCursor)
	}
	if p.sent > 0 {
		if err := s.reserve(ctx, p, time.Now()); err != nil {
			return nil, nil, err
		}
		// No file moves: Report.Uploaded stays "", and ChangesSent
		// tells what went out.
		e.progressStart("upload", len(p.uploads), 0, p.sent)
		// A push whose writes follow on from the pull's cursor moves it
		// past them: the commit merges them into the synced state, so
		// the next pull need not bring them back. Not after a pulled
		// record was refused: it comes again with its next write, which
		// may be this device's own.
		cursor := l.serverCursor
		if len(s.report.Rejected) > 0 {
			cursor = ""
		}
		for i, up := range p.uploads {
			e.progressFile(i)
			next, err := s.pushFile(ctx, up.name, cursor)
			if err != nil {
				return nil, nil, err
			}
			if next != "" {
				cursor, l.serverCursor = next, next
			}
			s.report.ChangesSent += up.sent
			e.progressRecords(up.sent)
			e.log.Info("drivesync: pushed", "batch", up.name, "changes", up.sent)
		}
		e.progressEnd()
	}
	if err := s.hook("uploaded"); err != nil {
		return nil, nil, err
	}
	return l, f, s.commit(ctx, l, f, p)
}

// pull takes every record the server changed after this device's cursor,
// validated and spooled like a snapshot's records.
func (s *syncRun) pull(ctx context.Context, l *listing) (*fetched, error) {
	e := s.e
	f := &fetched{rejected: map[string]rejectedFile{}, covers: map[string]bool{}, listed: map[string]bool{}, ledger: map[string]knownFile{}}
	cursor, err := getMeta(ctx, s.conn, metaServerCursor)
	if err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	sp, err := newSpool(e.cfg.TempDir)
	if err != nil {
		return nil, err
	}
	s.onDone(sp.close)
	devices := map[string]bool{}
	// No files, and a total that only the last page tells: the step
	// counts the records pulled.
	e.progressStart("download", 0, 0, 0)
	for {
		page, err := e.cfg.Server.Pull(ctx, s.store, cursor)
		if err != nil {
			return nil, serverErr("pull", err)
		}
		if err := s.bindServer(ctx, page.StoreID); err != nil {
			return nil, err
		}
		s.limits = serverLimits(page.MaxRecordSize, page.MaxBodySize)
		s.serverSeen = page.Seen
		pulled := sp.n
		for _, r := range page.Records {
			// A server sends a record over its write limit in parts
			// of at most the default record size, whatever its limit
			// is now (a record stored under a larger one may hold a
			// value no smaller part can).
			c, err := validateStateEntry(stateEntry{Table: r.Table, Record: r.Record, State: r.Data, Clock: r.Clock, Deleted: r.Deleted}, DefaultMaxRecordSize, devices)
			if err != nil {
				// One record the server holds wrongly must not stop
				// this device: it is reported and comes again with
				// its next write.
				s.report.Rejected = append(s.report.Rejected, FileError{Name: "server record " + r.Table + "/" + r.Record, Err: fmt.Errorf("%w: %w", ErrCorruptFile, err)})
				continue
			}
			f.maxSeen = max(f.maxSeen, c.version)
			if len(r.Seen) > 0 && len(r.Seen) <= 2*maxSeen {
				c.seen = r.Seen // read when merged; one that cannot be read logs nothing
			}
			if err := sp.add(c); err != nil {
				return nil, &Error{Op: "pull", Err: err}
			}
		}
		e.progressRecords(sp.n - pulled)
		if page.Cursor == "" {
			return nil, &Error{Op: "pull", Err: fmt.Errorf("%w: the server gave no cursor", ErrRemote)}
		}
		cursor = page.Cursor
		if !page.More {
			break
		}
	}
	e.progressEnd()
	l.serverCursor = cursor
	if sp.n > 0 {
		f.files = []*downloaded{{name: "server", kind: kindSnapshot, spool: sp}}
	}
	return f, nil
}

// bindServer checks that the server's store is the one this device syncs
// with, and binds a device that syncs with none yet to it.
func (s *syncRun) bindServer(ctx context.Context, store string) error {
	switch {
	case store == s.store:
		return nil
	case s.store == "":
		if err := s.setMetas(ctx, metaStore, store); err != nil {
			return &Error{Op: "bind", Err: err}
		}
		s.store = store
		s.e.log.Info("drivesync: bound to the server's store", "store", store)
		return nil
	case store == "":
		return &Error{Op: "bind", Err: fmt.Errorf("%w: the server no longer has store %s (it was deleted): call StartFresh to make this database's data a new store there", ErrRemoteChanged, s.store)}
	}
	return &Error{Op: "bind", Err: fmt.Errorf("%w: the server holds store %s, not %s: call JoinRemote to merge this database into it", ErrRemoteChanged, store, s.store)}
}

// serverErr wraps a Server's error: a changed store as it is, anything
// else as a remote failure, unless the context ended.
func serverErr(op string, err error) error {
	if errors.Is(err, ErrRemoteChanged) || errors.Is(err, ErrAuth) || errors.Is(err, ErrQuota) || errors.Is(err, ErrDeviceIDShared) {
		return &Error{Op: op, Err: err}
	}
	return remoteErr(op, "", err)
}

// pushFile pushes the outbox's batch name, with name as its key, and binds
// a device that syncs with no store yet to the one it went to. It returns
// the server's cursor past the batch's writes if they follow on from
// cursor (see PushResult.Cursor), else "".
func (s *syncRun) pushFile(ctx context.Context, name, cursor string) (string, error) {
	e := s.e
	var writes []ServerWrite
	src, err := openOutbox(ctx, s.conn, name)
	if err != nil {
		return "", &Error{Op: "push", File: name, Err: err}
	}
	_, err = decodePatchFile(src, e.deviceID, math.MaxInt64, math.MaxInt64, func(c fileChange) error {
		w := ServerWrite{Table: c.table, Record: c.record, Version: c.version, Device: e.deviceID, Deleted: c.deleted}
		if !c.deleted {
			w.Patch = json.RawMessage(c.patch)
			if s.serverSeen {
				w.Seen = json.RawMessage(c.seen)
			}
		}
		if c.flags&changeReplaces != 0 {
			w.Replaces = true
			w.ResetVersion, w.ResetDevice = c.reset.Version, c.reset.Device
			if w.ResetVersion == 0 { // format 2: the version before, by the same device
				w.ResetVersion, w.ResetDevice = c.version-1, e.deviceID
			}
		}
		writes = append(writes, w)
		return nil
	})
	if src.err != nil {
		err = src.err // another Engine took the batch out of the outbox
	}
	if err != nil {
		return "", &Error{Op: "push", File: name, Err: err}
	}
	res, err := e.cfg.Server.Push(ctx, &PushBatch{StoreID: s.store, Key: pushKey(e.deviceID, name), Writes: writes, Cursor: cursor})
	if errors.Is(err, ErrDeviceIDShared) {
		return "", s.deviceIDShared(ctx, err)
	}
	if errors.Is(err, ErrServerRefused) {
		// Planned under limits the server no longer has (or refused
		// for another reason): sent again as it is, it would be
		// refused for ever. Nothing of it was applied, and its
		// records are still pending: the next sync plans them again,
		// under the limits its pull brings.
		if err := s.dropOutbox(ctx); err != nil {
			return "", err
		}
		return "", &Error{Op: "push", File: name, Err: fmt.Errorf("%w; its changes are still pending: sync again", err)}
	}
	if err != nil {
		return "", serverErr("push", err)
	}
	return res.Cursor, s.bindServer(ctx, res.StoreID)
}

// deviceIDShared handles a push the server refused because another
// database syncs under this device id. Nothing of that batch was applied,
// nor of any batch after it; the batches before it in the outbox were,
// but their records are still pending too. So the outbox is emptied, and
// the next sync plans every pending record again, stamped under a new
// device id (taken here, as checkCopied does, unless the app sets the id
// itself), above every version this device has seen or reserved.
func (s *syncRun) deviceIDShared(ctx context.Context, cause error) error {
	e := s.e
	if err := s.dropOutbox(ctx); err != nil {
		return err
	}
	if e.cfg.DeviceID != "" {
		return &Error{Op: "push", Err: fmt.Errorf("%w: %v. Give each copy its own Config.DeviceID (or leave it empty, and each database takes its own), then sync again", ErrDeviceIDShared, cause)}
	}
	id := uuid.NewString()
	if err := s.takeNewID(ctx, id, "another database syncs under this device id"); err != nil {
		return err
	}
	return &Error{Op: "push", Err: fmt.Errorf("%w: this database now syncs as %s: sync again", ErrDeviceIDShared, id)}
}

// dropOutbox empties the outbox after the server refused a batch of it:
// the server applied nothing of that batch, nor of any after it, and the
// records of every batch in it are still pending (only a sync's commit
// settles them, and it empties the outbox with them), so the next sync
// plans them all again.
func (s *syncRun) dropOutbox(ctx context.Context) error {
	if _, err := s.conn.ExecContext(ctx, `DELETE FROM sync_outbox`); err != nil {
		return &Error{Op: "push", Err: err}
	}
	return nil
}

// pushKey is the idempotency key of a batch: its outbox name, unique to
// this database, with the device id in case two databases share one.
func pushKey(device, name string) string { return "drivesync:" + device + ":" + name }

// recoverPushes pushes again, with the same keys, the batches an earlier
// sync reserved and may have pushed without committing, and merges them
// into the synced state (see recoverOutbox).
func (s *syncRun) recoverPushes(ctx context.Context) error {
	return s.eachOutbox(ctx, func(name string) error {
		// The cursor stays: this sync's pull brings the batch's
		// records back, as it brings every record written after it.
		_, err := s.pushFile(ctx, name, "")
		if errors.Is(err, ErrServerRefused) {
			// The outbox is empty now: this sync plans its records
			// again, under the limits its pull brings.
			s.e.log.Warn("drivesync: the server refused an earlier sync's batch; its changes are planned again", "batch", name, "err", err)
			return nil
		}
		if err != nil {
			return err
		}
		return s.adoptOutbox(ctx, name, false)
	})
}

// pushJoin sends, after JoinRemote or StartFresh, the state of every
// record this database holds, so that the server's store gets what it
// lacks; the merge keeps whatever is newer on either side. A record over
// the record limit goes in parts (see merge.StateParts), and the states go
// in pushes of at most joinBatchBytes.
func (s *syncRun) pushJoin(ctx context.Context) error {
	e := s.e
	join, err := getMeta(ctx, s.conn, metaJoin)
	if err != nil || join == "" {
		return err
	}
	var writes []ServerWrite
	size := 0
	push := func() error {
		if len(writes) == 0 {
			return nil
		}
		// No key: merging a state twice changes nothing.
		res, err := e.cfg.Server.Push(ctx, &PushBatch{StoreID: s.store, Writes: writes})
		if err != nil {
			return serverErr("join", err)
		}
		writes, size = nil, 0
		return s.bindServer(ctx, res.StoreID)
	}
	max := s.limits.MaxRecordSize
	after := recordKey{}
	for {
		rows, err := s.conn.QueryContext(ctx, `SELECT table_name, record_id, record_data, clock, is_deleted FROM sync_states
WHERE (table_name, record_id) > (?1, ?2) ORDER BY table_name, record_id LIMIT 1000`, after.table, after.record)
		if err != nil {
			return &Error{Op: "join", Err: err}
		}
		var states []ServerWrite
		for rows.Next() {
			var w ServerWrite
			var data, clock string
			if err := rows.Scan(&w.Table, &w.Record, &data, &clock, &w.Deleted); err != nil {
				rows.Close()
				return &Error{Op: "join", Err: err}
			}
			w.Patch, w.Clock = json.RawMessage(data), json.RawMessage(clock)
			states = append(states, w)
			after = recordKey{w.Table, w.Record}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return &Error{Op: "join", Err: err}
		}
		if len(states) == 0 {
			break
		}
		for _, w := range states {
			parts := []ServerWrite{w}
			if int64(len(w.Patch)) > max || int64(len(w.Clock)) > 2*max {
				if parts, err = stateWrites(w, max); err != nil {
					return &Error{Op: "join", Table: w.Table, Record: w.Record, Err: err}
				}
			}
			for _, p := range parts {
				// What the state takes in the push: its data, clock,
				// table and id, and the JSON around them.
				n := len(p.Patch) + len(p.Clock) + 2*(len(p.Table)+len(p.Record)) + 128
				if int64(size+n) > min(joinBatchBytes, s.limits.MaxExpandedSize) {
					if err := push(); err != nil {
						return err
					}
				}
				writes = append(writes, p)
				size += n
			}
		}
	}
	if err := push(); err != nil {
		return err
	}
	return s.setMetas(ctx, metaJoin, "")
}

// joinBatchBytes bounds the states of one push of a join, below a
// server's default body limit; a server with a smaller one gets smaller
// pushes (see serverLimits).
const joinBatchBytes = 8 << 20

// stateWrites splits the state w carries into parts within max, as a
// snapshot holds a record over the limit; a value no part can hold is
// left out, as a snapshot leaves it (the store cannot hold it).
func stateWrites(w ServerWrite, max int64) ([]ServerWrite, error) {
	parts, err := merge.StateParts(w.Patch, w.Clock, w.Deleted, max, false)
	if errors.Is(err, errTooLarge) {
		parts, err = merge.StateParts(w.Patch, w.Clock, w.Deleted, max, true)
	}
	if err != nil {
		return nil, err
	}
	out := make([]ServerWrite, len(parts))
	for i, p := range parts {
		data, clock := merge.EncodeState(p)
		out[i] = ServerWrite{Table: w.Table, Record: w.Record, Patch: json.RawMessage(data), Clock: json.RawMessage(clock), Deleted: w.Deleted}
	}
	return out, nil
}

// joinServer is JoinRemote (fresh false) or StartFresh (fresh true)
// through a server.
func (s *syncRun) joinServer(ctx context.Context, fresh bool) error {
	page, err := s.e.cfg.Server.Pull(ctx, "", "")
	if err != nil {
		return serverErr("join", err)
	}
	switch {
	case fresh && page.StoreID != "":
		return &Error{Op: "start fresh", Err: fmt.Errorf("the server holds store %s: call JoinRemote to merge with it", page.StoreID)}
	case !fresh && page.StoreID == "":
		return &Error{Op: "join", Err: errors.New("the server holds no store to join: call StartFresh to make this database's data a new store there")}
	}
	return s.rebind(ctx, page.StoreID, true)
}
