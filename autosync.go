package drivesync

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"time"
)

// AutoSyncOptions configures AutoSync; a zero field takes its default.
type AutoSyncOptions struct {
	// Debounce is how long after the last local change a sync starts,
	// so that a burst of edits goes out in one sync (default 2 s).
	Debounce time.Duration
	// Interval is how often it syncs to fetch other devices' changes
	// when nothing happens here (default 5 min).
	Interval time.Duration
	// Poll is how often it looks for local changes: one count of the
	// pending records in the database, no remote request (default 1 s).
	Poll time.Duration
	// Backoff is the wait before retrying a failed sync (default 2 s);
	// each next failure doubles it, up to MaxBackoff (default 5 min), and
	// each wait is drawn between half of it and all of it. A success
	// ends the backoff.
	Backoff, MaxBackoff time.Duration
	// OnSync, if set, receives every sync's result, on AutoSync's
	// goroutine.
	OnSync func(Report, error)
}

func (o AutoSyncOptions) withDefaults() AutoSyncOptions {
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&o.Debounce, 2 * time.Second},
		{&o.Interval, 5 * time.Minute},
		{&o.Poll, time.Second},
		{&o.Backoff, 2 * time.Second},
		{&o.MaxBackoff, 5 * time.Minute},
	} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	return o
}

// ErrAutoSyncRunning is returned by AutoSync when another AutoSync of the
// same Engine runs.
var ErrAutoSyncRunning = errors.New("drivesync: AutoSync is already running for this engine")

// AutoSync syncs by itself until ctx is done, then returns nil (or
// ErrClosed once the Engine is closed): a Debounce after local changes, an
// Interval after the last sync for other devices' changes, at once when
// the app calls SyncNow, and, after a failure (the remote unreachable,
// the sign-in expired), again after a growing backoff. It runs one sync
// at a time, on the calling goroutine, and leaves no goroutine behind.
// Sync may still be called meanwhile; the two take turns.
func (e *Engine) AutoSync(ctx context.Context, opts AutoSyncOptions) error {
	if !e.auto.CompareAndSwap(false, true) {
		return ErrAutoSyncRunning
	}
	defer e.auto.Store(false)
	opts = opts.withDefaults()
	select {
	case <-e.syncNow: // asked before this AutoSync ran
	default:
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	var (
		lastPending = -1         // the pending count at the last look
		localDue    time.Time    // when local changes are due to sync (zero: none)
		nextSync    = time.Now() // the periodic or retry sync: the first at once
		failures    int
	)
	for {
		now := time.Now()
		wake := min(nextSync.Sub(now), opts.Poll)
		if !localDue.IsZero() {
			wake = min(wake, localDue.Sub(now))
		}
		timer.Reset(max(wake, 0))
		asked := false
		select {
		case <-ctx.Done():
			return nil
		case <-e.syncNow:
			asked = true
		case <-timer.C:
		}
		if e.closed.Load() {
			return ErrClosed
		}
		now = time.Now()
		// Local changes: a new count restarts the debounce.
		if pending, err := e.pendingMarks(ctx); err == nil {
			if pending > 0 && pending != lastPending {
				localDue = now.Add(opts.Debounce)
			}
			lastPending = pending
		}
		due := asked || !now.Before(nextSync)
		if !localDue.IsZero() && !now.Before(localDue) && (failures == 0 || !now.Before(nextSync)) {
			due = true // while failing, local changes wait for the retry
		}
		if !due {
			continue
		}
		r, err := e.Sync(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if opts.OnSync != nil {
			opts.OnSync(r, err)
		}
		if errors.Is(err, ErrClosed) {
			return ErrClosed
		}
		now = time.Now()
		// Records the sync could not send stay pending, and so do those
		// the app wrote while it ran: the latter are due a debounce
		// from now; from here on, a new count is a new local change.
		localDue = time.Time{}
		if pending, perr := e.pendingMarks(ctx); perr == nil {
			lastPending = pending
			if records, perr := e.pendingRecords(ctx); perr == nil && records > len(r.Skipped) {
				localDue = now.Add(opts.Debounce)
			}
		}
		if err != nil {
			failures++
			wait := min(opts.Backoff<<min(failures-1, 20), opts.MaxBackoff)
			nextSync = now.Add(wait/2 + rand.N(wait/2+1))
			e.log.Info("drivesync: AutoSync retries after a failed sync", "in", nextSync.Sub(now).Round(time.Millisecond), "err", err)
			continue
		}
		failures = 0
		nextSync = now.Add(opts.Interval)
	}
}

// pendingMarks counts the pending marks of the registered tables: the
// records of the pending set, and the writes logged since the last fold,
// one per write, so that it grows with every write, a record written
// twice included.
func (e *Engine) pendingMarks(ctx context.Context) (n int, err error) {
	// Records of tables the app no longer registers stay pending, and no
	// sync sends them: counted, they would look like edits made during
	// every sync.
	err = e.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM sync_pending_changes WHERE table_name IN (SELECT value FROM json_each(?1)))
	+ (SELECT count(*) FROM sync_pending_log WHERE table_name IN (SELECT value FROM json_each(?1)))`, e.tableNames()).Scan(&n)
	return n, err
}

// pendingRecords counts the records the pending marks of the registered
// tables name, each once: the number to compare with the records a sync
// could not send, whose marks a sync with nothing else to do leaves as
// they are.
func (e *Engine) pendingRecords(ctx context.Context) (n int, err error) {
	err = e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+pendingUnion+` WHERE table_name IN (SELECT value FROM json_each(?1))`, e.tableNames()).Scan(&n)
	return n, err
}

// SyncNow asks a running AutoSync to sync at once (after the sync it may
// be running). Without a running AutoSync it does nothing; a request
// made while one is already waiting is the same request.
func (e *Engine) SyncNow() {
	select {
	case e.syncNow <- struct{}{}:
	default:
	}
}

// tableNames is the registered tables' names, as a JSON array.
func (e *Engine) tableNames() string {
	names := make([]string, len(e.order))
	for i, t := range e.order {
		names[i] = t.name
	}
	b, _ := json.Marshal(names)
	return string(b)
}
