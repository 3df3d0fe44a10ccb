package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/drivesync/drivesync/internal/sqliteerr"
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
//  4. Upload them as one gzip patch file (several when they do not fit in
//     one under the store's limits, each change whole in one of them).
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
		if e.cfg.Server != nil {
			_, _, err := s.syncServer(ctx)
			return err
		}
		l, f, err := s.sync(ctx)
		if err != nil {
			return err
		}
		return s.maintain(ctx, l, f, false)
	})
}

// A sync runs in phases, each in its own room, each taking what the
// earlier ones found as arguments and returning its own result:
//
//	list     (sync.go)     the listing: the remote's time and files
//	bind     (marker.go)   the store the remote holds, and its limits
//	recover  (outbox.go)   an earlier sync's upload that did not commit
//	fetch    (fetch.go)    the files to apply, spooled and validated, and
//	         (catchup.go)  the snapshots that bring what compaction took
//	plan     (plan.go)     the own changes, diffed and stamped
//	publish  (outbox.go)   the uploaded patch file
//	commit   (apply.go)    one transaction that applies it all
//	maintain (snapshot.go) the month's snapshot and compaction
//
// Only the connection, the report and the store binding belong to the
// whole run (syncRun).
func (s *syncRun) sync(ctx context.Context) (*listing, *fetched, error) {
	l, err := s.list(ctx)
	if err != nil {
		return nil, nil, err
	}
	rebound, err := s.bind(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	if rebound { // joined another store: list it from the start
		if l, err = s.list(ctx); err != nil {
			return nil, nil, err
		}
	}
	if err := s.recoverOutbox(ctx, l); err != nil {
		return nil, nil, err
	}
	if err := s.renewMovedID(ctx); err != nil {
		return nil, nil, err
	}
	if err := s.checkCopied(ctx, l); err != nil {
		return nil, nil, err
	}
	f, err := s.fetch(ctx, l)
	if err != nil {
		return nil, nil, err
	}
	if err := s.hook("fetched"); err != nil {
		return nil, nil, err
	}
	p, idle, err := s.planSync(ctx, f)
	if err != nil {
		return nil, nil, err
	}
	if idle {
		// Nothing to apply; still move the cursor, or an idle device
		// would list ever further back, paying for files it applied.
		return l, f, s.saveCursor(ctx, l)
	}
	if p.sent > 0 {
		if err := s.publish(ctx, p); err != nil {
			return nil, nil, err
		}
	}
	if err := s.hook("uploaded"); err != nil {
		return nil, nil, err
	}
	// A failure from here on leaves the uploaded file in place and in the
	// outbox: the next sync adopts it (see outbox.go).
	return l, f, s.commit(ctx, l, f, p)
}

// planSync runs the plan phase; idle says that the sync has nothing to
// apply, send or retry.
func (s *syncRun) planSync(ctx context.Context, f *fetched) (p *plan, idle bool, err error) {
	if p, err = s.plan(ctx, f); err != nil {
		return nil, false, err
	}
	if err := s.hook("planned"); err != nil {
		return nil, false, err
	}
	unwritten, err := s.hasUnwritten(ctx)
	if err != nil {
		return nil, false, err
	}
	return p, p.changes.n == 0 && f.empty() && !unwritten, nil
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
	// outside any transaction, with its page cache as it was.
	defer endTx(conn)
	if restore := growCache(ctx, conn); restore != nil {
		defer restore()
	}
	s := &syncRun{e: e, conn: conn}
	e.uploaded, e.meter = 0, meter{}
	defer s.cleanup()
	err = fn(s)
	endTx(conn)
	if e.cfg.Remote != nil {
		s.report.Missing, _ = missingFiles(ctx, conn) // at worst left out: Status reads them again
	}
	if sqliteerr.IsReadOnly(err) {
		// The step's own error keeps its step: the file is named inside.
		if se, ok := err.(*Error); ok {
			named := *se
			named.Err = databaseReadOnly(ctx, conn, se.Err)
			err = &named
		} else {
			err = &Error{Op: "sync", Err: databaseReadOnly(ctx, conn, err)}
		}
	}
	s.recordStatus(ctx, err)
	return s.report, err
}

// syncCacheKiB is the page cache of the connection a sync runs on. A sync
// touches every pending record's row, state and index entries, far more
// pages than SQLite's default cache (2 MB) holds once a database has grown:
// with it, a sync of 100,000 records reads the same pages from the file
// again and again.
const syncCacheKiB = 64 << 10

// growCache raises conn's page cache to syncCacheKiB for the sync, unless
// the app set a larger one, and returns what sets it back (nil: nothing
// to set back).
func growCache(ctx context.Context, conn *sql.Conn) (restore func()) {
	var pages, pageSize int64
	if conn.QueryRowContext(ctx, `PRAGMA cache_size`).Scan(&pages) != nil || conn.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&pageSize) != nil {
		return nil
	}
	kib := -pages // negative: KiB; positive: pages
	if pages > 0 {
		kib = pages * pageSize >> 10
	}
	if kib >= syncCacheKiB {
		return nil
	}
	// Not under ctx: a statement cancelled after SQLite prepared it (which
	// applies the pragma) reports an error, and the raised cache would go
	// back to the app's pool. What is raised is always set back.
	restore = func() { conn.ExecContext(context.Background(), fmt.Sprintf(`PRAGMA cache_size = %d`, pages)) }
	if _, err := conn.ExecContext(context.Background(), fmt.Sprintf(`PRAGMA cache_size = %d`, -syncCacheKiB)); err != nil {
		restore()
		return nil
	}
	return restore
}

// syncRun is one call of Sync (or Snapshot, JoinRemote, StartFresh): what
// every phase shares.
type syncRun struct {
	e      *Engine
	conn   *sql.Conn
	report Report
	store  string // the store id of the remote's marker, set by bind
	limits Limits // the store's limits, from its marker, set by bind
	// serverSeen: the sync server keeps writes' "seen" lists (see
	// PullPage.Seen), learnt from this sync's pull.
	serverSeen bool
	// conflicts counts the entries this run added to the conflict log;
	// keyFiles are the store's key checks, once foreignKey listed them.
	conflicts int
	keyFiles  []RemoteFile
	// What the run learned of the remote, for Status: its clock less
	// this device's, and the size of a listing of every file.
	offset        time.Duration
	offsetKnown   bool
	remoteBytes   int64
	remoteBytesAt time.Time

	stmts  map[string]*sql.Stmt
	closes []func() // temporary files to remove when the run ends
}

// onDone registers fn to run when the run ends, however it ends.
func (s *syncRun) onDone(fn func()) { s.closes = append(s.closes, fn) }

func (s *syncRun) cleanup() {
	for _, fn := range s.closes {
		fn()
	}
	for _, st := range s.stmts {
		st.Close()
	}
}

// stepHook, set only by this package's tests, runs at each step boundary
// of a sync ("fetched", "planned", "uploaded", "applied" inside the
// transaction before COMMIT, "committed" after it); an error it returns
// fails the sync there, as a failure of that step would.
var stepHook func(e *Engine, point string) error

func (s *syncRun) hook(point string) error {
	if stepHook == nil {
		return nil
	}
	if err := stepHook(s.e, point); err != nil {
		return &Error{Op: point, Err: err}
	}
	return nil
}

// listing is what the list phase found.
type listing struct {
	// cursor is the remote's time before this sync listed: every file
	// created before it is listed now or, if the listing lags, within
	// the overlap next time. It never comes from file names, which a
	// broken or hostile file could set in the future.
	cursor    time.Time
	since     time.Time // listed from here; zero: from the start
	files     []RemoteFile
	bootstrap bool // no synced state yet: start from the newest snapshot
	// server says the sync pulls from a Server, not a Remote;
	// serverCursor is where its next pull starts.
	server       bool
	serverCursor string
}

// list lists the remote from the cursor less the overlap, or from the
// start for a device with no synced state.
func (s *syncRun) list(ctx context.Context) (*listing, error) {
	e := s.e
	l := &listing{}
	var err error
	before := time.Now()
	if l.cursor, err = e.cfg.Remote.Now(ctx); err != nil {
		return nil, remoteErr("list", "", err)
	}
	s.noteClock(l.cursor, before, time.Now())
	cur, err := getMeta(ctx, s.conn, metaCursor)
	if err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	// A device that never synced starts from a snapshot; one that synced
	// while the store was empty reads snapshots as any other device.
	l.bootstrap = cur == "" && s.emptyState(ctx)
	if cur != "" && !l.bootstrap {
		if prev, err := time.Parse(time.RFC3339Nano, cur); err == nil {
			l.since = prev.Add(-e.cfg.ListOverlap)
		}
	}
	// Once a day the whole remote, so that a file that vanished long
	// after its writer's next sync is found (see findVanished).
	all, err := getMeta(ctx, s.conn, metaListedAll)
	if err != nil {
		return nil, &Error{Op: "sync", Err: err}
	}
	if at, err := time.Parse(time.RFC3339Nano, all); err != nil || l.cursor.Sub(at) >= fullListingEvery || at.After(l.cursor) {
		l.since = time.Time{}
	}
	e.progressStart("list", 1, 0, 0)
	if l.files, err = e.cfg.Remote.List(ctx, l.since); err != nil {
		return nil, remoteErr("list", "", err)
	}
	if l.since.IsZero() {
		s.noteRemoteSize(l.files)
	}
	e.progressEnd()
	return l, nil
}

func (s *syncRun) saveCursor(ctx context.Context, l *listing) error {
	at := l.cursor.UTC().Format(time.RFC3339Nano)
	if l.since.IsZero() {
		return s.setMetas(ctx, metaCursor, at, metaListedAll, at)
	}
	return s.setMetas(ctx, metaCursor, at)
}

func remoteErr(op, file string, err error) error {
	// A remote that says the key is wrong (a sync server whose store
	// keeps records, not an encrypted store's files) works.
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrWrongKey) {
		return &Error{Op: op, File: file, Err: err}
	}
	return &Error{Op: op, File: file, Err: fmt.Errorf("%w: %w", ErrRemote, err)}
}

func (s *syncRun) emptyState(ctx context.Context) bool {
	var empty bool
	err := s.conn.QueryRowContext(ctx, `SELECT NOT EXISTS (SELECT 1 FROM sync_states)`).Scan(&empty)
	return err == nil && empty
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

// stmt returns a statement prepared once per run on the run's connection.
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
	_, err := s.execCount(ctx, query, args...)
	return err
}

// execCount is exec, returning the number of rows the statement changed.
func (s *syncRun) execCount(ctx context.Context, query string, args ...any) (int64, error) {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return 0, err
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *syncRun) queryRow(ctx context.Context, query string, args []any, dest ...any) error {
	st, err := s.stmt(ctx, query)
	if err != nil {
		return err
	}
	return st.QueryRowContext(ctx, args...).Scan(dest...)
}
