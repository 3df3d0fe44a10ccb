package drivesync

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"filippo.io/age"
	"github.com/drivesync/drivesync/internal/merge"
	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// DefaultListOverlap is how far before its cursor the engine lists the
// remote again, so that a file the remote lists late (Google Drive's
// listings lag its writes) is still found. Already-applied files in that
// window are skipped without being downloaded.
const DefaultListOverlap = 15 * time.Minute

// Config configures an Engine. Tables and one of Remote and Server are
// required; every other field has a working zero value.
type Config struct {
	// Remote is where the devices' patch files live.
	Remote Remote
	// Server is a sync server to sync through instead of a Remote (see
	// package httpremote). With Encryption set, the engine keeps the
	// store on the server as sealed files, which the devices merge, as on
	// a Remote: the server needs to keep files (httpremote.Client's
	// Files), since it cannot read what it would merge.
	Server Server
	// Tables are the synced tables: document tables (id TEXT PRIMARY
	// KEY and a content column holding the record as a JSON object,
	// JSONB or text; any other column is a projection of the same-named
	// top-level key of content, which the engine fills when it writes a
	// row) and ordinary tables (any declared primary key, the columns as
	// they are; see Table). Tables may be added or removed between
	// Opens.
	Tables []Table

	// DeviceID names this database in file names and stamps. Empty
	// means a random UUID, generated once and stored in the database.
	// The app may give a database a new id at a later Open (a copy
	// needs its own); Open refuses a copied file under the id it took.
	DeviceID string
	// Logger receives the engine's log; nil discards it.
	Logger *slog.Logger
	// Progress, if set, is called as a sync moves through its steps
	// (see Progress), at most about 20 times a second. It runs on the
	// syncing goroutine: keep it quick.
	Progress func(Progress)

	// ListOverlap overrides DefaultListOverlap.
	ListOverlap time.Duration
	// Limits are the size limits of a store this device creates (its
	// first sync with an empty remote, or StartFresh); zero fields take
	// the defaults. A store's limits are recorded in its marker and
	// govern every device, so that a file is readable on all devices or
	// on none: this field does not change the limits of an existing
	// store.
	Limits Limits
	// Retention is how long patch files are kept before the snapshot
	// that replaces them; zero means two months. A device that
	// missed files compaction deleted (it was offline longer) loads the
	// snapshot that holds them.
	Retention time.Duration
	// TempDir holds the engine's temporary files during a sync; empty
	// means os.TempDir().
	TempDir string

	// Encryption, if set, encrypts and authenticates every file this
	// device uploads (Passphrase, X25519Key). A store is encrypted or not
	// from its creation, by the device that creates it; every device of
	// an encrypted store needs its key, and Sync fails with ErrWrongKey
	// until it has it.
	Encryption Key
	// PreviousKeys are keys the store used before Encryption, during a
	// key change: they decrypt the files still encrypted with them, and
	// the first Sync with a new Encryption key and its old key here adds
	// the new key to the store. Drop them once a snapshot has replaced
	// the old files (Engine.Snapshot, then compaction after Retention).
	PreviousKeys []Key
}

// Table names one synced table.
//
// A table with a content column is a document table: id TEXT PRIMARY KEY,
// the record as a JSON object in content (merged per member path), and
// optional projection columns. Any other table with a declared PRIMARY
// KEY of one or more columns (TEXT, INTEGER or BLOB) is an ordinary
// table: each non-key column is a field that merges on its own, the last
// writer winning, and values keep their SQLite type exactly (BLOBs, REALs
// bit for bit, NULLs).
type Table struct {
	Name string
	// UniqueIntegerKey allows a single INTEGER PRIMARY KEY, which is
	// SQLite's rowid: Open refuses it otherwise, since each device
	// numbers new rows 1, 2, 3… and two devices would write different
	// records under one key. Set it only if the app assigns integer keys
	// unique across devices itself.
	UniqueIntegerKey bool
	// AppendOnly makes an ordinary table's rows immutable once written:
	// the capture trigger refuses the app's UPDATE and DELETE of a row,
	// a received row equal to the one held is nothing new, and one that
	// differs is not written but reported (ErrImmutableConflict).
	AppendOnly bool
	// Merge sets the merge rule of some columns of an ordinary table;
	// the others merge by MergeLastWriter.
	Merge map[string]MergeRule
}

// Report says what one Sync did.
type Report struct {
	// Downloaded names the remote files applied, in the order applied.
	// Through a Server, which sends records, not files, it is empty:
	// ChangesReceived counts what came.
	Downloaded []string
	// Uploaded names the file uploaded, or "" if there was nothing to
	// send. Changes that do not fit in one file (the store's
	// MaxFileSize, MaxExpandedSize) go in several, uploaded one after
	// another by the same Sync; Uploaded names the last. Through a
	// Server, which takes pushes of records, not files, it is always "":
	// ChangesSent counts what went out. Whatever the remote, ChangesSent
	// > 0 says that a sync sent something.
	Uploaded string
	// Recovered names an earlier sync's upload that did not commit and
	// that this sync published and merged (see Sync). Through a Server
	// it names the batch as this database's outbox held it, the name
	// its push's key (PushBatch.Key) carries.
	Recovered string
	// ChangesReceived counts the changes applied from downloaded files,
	// or through a Server the records pulled that changed this
	// device's synced state (what other devices wrote: a record this
	// device pushed, pulled back as it holds it, is none); ChangesSent
	// the changes in the uploaded files, counted as each goes, so that
	// a sync that fails after an upload still tells it.
	ChangesReceived, ChangesSent int
	// Rejected lists remote files that were skipped because they are
	// malformed, too large or of a newer format, or because the remote
	// refused to let this device read them (fs.ErrPermission, see
	// Remote.Open). Nothing of them was applied; the sync went on
	// without them, and reads them again later.
	Rejected []FileError
	// Unregistered counts received changes to tables this app does not
	// register. They are kept in sync_states and reach the app's table
	// once it registers that table.
	Unregistered int
	// Skipped lists local records that could not be sent, such as a
	// content that is not a JSON object. They stay pending.
	Skipped []RecordError
	// Overruled lists local writes that a column's merge rule did not
	// take (a MergeMax column written below its value): the row shows
	// the rule's value again.
	Overruled []RecordError
	// Snapshot names the snapshot this sync wrote (the first sync of a
	// month, or Engine.Snapshot), and Deleted counts the old files
	// compaction removed from the remote.
	Snapshot string
	Deleted  int
	// Vanished lists files that this device holds and that are gone from
	// the remote although nothing there holds them any more: a sync tool
	// lost them, or someone removed them. This sync wrote a snapshot that
	// holds them (Snapshot), from which every device that missed them
	// takes them. Files are named by their writers' numbers (see FileSpan).
	Vanished []FileSpan
	// Missing lists files of other devices that this device has not
	// received although it holds earlier and later files of the same
	// device: lost from the remote, or still on their way through a sync
	// tool. A sync
	// takes them from a snapshot that holds them as soon as one is there;
	// a device that holds them writes one when it finds them gone.
	Missing []FileSpan
	// Unwritten lists synced records whose row the app's table refused
	// (a UNIQUE, NOT NULL or CHECK constraint on a projection column, a
	// foreign key) and still refuses at the end of this sync. sync_states
	// has them; the row keeps its old content. Every later Sync tries
	// them again, and writes each as soon as the table takes it (another
	// row gave up the UNIQUE value, the parent row appeared), even if
	// the record itself never changes again.
	Unwritten []RecordError
}

// FileError names a remote file and why it was rejected.
type FileError struct {
	Name string
	Err  error
}

// RecordError names a local record and why it could not be synced.
type RecordError struct {
	Table, Record string
	Err           error
}

// Engine syncs one database. Use one Engine per database; its methods are
// safe for concurrent use, and concurrent Syncs run one after the other.
type Engine struct {
	db       *sql.DB
	cfg      Config
	log      *slog.Logger
	deviceID string
	tables   map[string]*tableInfo
	order    []*tableInfo // registration order
	// quietDropAt: from how many writes a sync drops the capture
	// triggers while it writes (see beginQuiet); quietDropAt unless a
	// test sets another.
	quietDropAt int
	// detached names the tables this database synced before and no
	// longer registers: their rows keep what they showed (see
	// applyReceived and reattachTable).
	detached map[string]bool
	// idMu guards deviceID against DeviceID while a sync changes it
	// (see takeNewDeviceID); the syncing goroutine reads it freely.
	idMu   sync.Mutex
	sem    chan struct{}
	closed atomic.Bool
	// keys are the bound store's keys, set by each run's bind (nil for
	// a plain store); derived caches the identities of keys, a
	// passphrase's costing a second. Both belong to the running sync.
	keys    *keyring
	derived map[string]*age.X25519Identity
	// uploaded counts the bytes the running sync uploaded, for Status;
	// meter paces its progress updates.
	uploaded int64
	meter    meter
	// last is how the last run ended, for Status (see recordStatus).
	lastMu sync.Mutex
	last   lastSync
	// auto is set while AutoSync runs; syncNow carries SyncNow to it.
	auto    atomic.Bool
	syncNow chan struct{}
}

// Open prepares db for syncing and returns its Engine. It creates the
// engine's tables, the device id and the capture triggers if they are
// missing, replaces triggers of an older version, drops those of tables
// no longer registered, and clears a sync flag a crash left set. Open is
// idempotent; it never opens or closes db, which stays the app's.
//
// Rows a newly registered table already holds are marked pending, and
// records other devices synced into that table before it was registered
// are written into it.
func Open(ctx context.Context, db *sql.DB, cfg Config) (*Engine, error) {
	if db == nil {
		return nil, errors.New("drivesync: Open: db is nil")
	}
	switch {
	case cfg.Remote == nil && cfg.Server == nil:
		return nil, errors.New("drivesync: Open: Config.Remote is nil: use NewFolderRemote or a Drive remote (or set Config.Server to sync through a server)")
	case cfg.Remote != nil && cfg.Server != nil:
		return nil, errors.New("drivesync: Open: both Config.Remote and Config.Server are set: a database syncs through one")
	}
	if cfg.Encryption != nil && cfg.Server != nil {
		// A server cannot merge records it cannot read: an encrypted
		// store keeps sealed files on it, which the devices merge.
		fs, ok := cfg.Server.(interface{ Files() Remote })
		if !ok {
			return nil, errors.New("drivesync: Open: Config.Encryption through a Config.Server needs a server that keeps files (httpremote.Client does): this Server only merges records, which it would have to read")
		}
		if cfg.Remote = fs.Files(); cfg.Remote == nil {
			return nil, errors.New("drivesync: Open: Config.Server's Files returned no Remote")
		}
		cfg.Server = nil
	}
	if len(cfg.Tables) == 0 {
		return nil, errors.New("drivesync: Open: Config.Tables is empty: name the tables to sync")
	}
	if cfg.DeviceID != "" {
		if err := merge.CheckDeviceID(cfg.DeviceID); err != nil {
			return nil, err
		}
	}
	if cfg.ListOverlap <= 0 {
		cfg.ListOverlap = DefaultListOverlap
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if err := cfg.Limits.check(); err != nil {
		return nil, fmt.Errorf("drivesync: Open: Config.Limits: %w", err)
	}
	e := &Engine{db: db, cfg: cfg, log: cfg.Logger, tables: map[string]*tableInfo{}, quietDropAt: quietDropAt, sem: make(chan struct{}, 1), syncNow: make(chan struct{}, 1)}
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("drivesync: Open: %w", err)
	}
	defer conn.Close()
	for _, t := range cfg.Tables {
		if e.tables[t.Name] != nil {
			return nil, fmt.Errorf("drivesync: Open: table %s is registered twice", t.Name)
		}
		ti, err := inspectTable(ctx, conn, t)
		if err != nil {
			return nil, err
		}
		e.tables[t.Name] = ti
		e.order = append(e.order, ti)
	}
	if err := beginImmediate(ctx, conn); err != nil {
		return nil, fmt.Errorf("drivesync: Open: %w", databaseReadOnly(ctx, conn, err))
	}
	err = func() error {
		id, err := installSchema(ctx, conn, cfg.DeviceID)
		if err != nil {
			return err
		}
		e.deviceID = id
		// What follows reads and settles pending marks: from the set.
		if err := foldPending(ctx, conn); err != nil {
			return err
		}
		if cfg.Server != nil && (merge.ServerDevice(id) || merge.ServerDevice(cfg.DeviceID)) {
			// (The app's id may only be owed yet, see installSchema.)
			return fmt.Errorf("device id %q: ids \"server\" and \"server-…\" are the sync server's own stamps; set Config.DeviceID to another", cmp.Or(cfg.DeviceID, id))
		}
		synced, err := syncedTables(ctx, conn)
		if err != nil {
			return err
		}
		fresh, err := installTriggers(ctx, conn, e.order)
		if err != nil {
			return err
		}
		freshly := map[string]bool{}
		for _, t := range fresh {
			freshly[t.name] = true
		}
		// Columns added first: a row registered again is then compared
		// with what it showed, a new column's synced value included.
		for _, t := range e.order {
			if t.ordinary {
				if err := writeNewColumns(ctx, conn, t, freshly[t.name]); err != nil {
					return fmt.Errorf("drivesync: Open: table %s: %w", t.name, err)
				}
			}
		}
		for _, t := range fresh {
			if err := checkNullIDs(ctx, conn, t); err != nil {
				return fmt.Errorf("drivesync: Open: register table %s: %w", t.name, err)
			}
			adopt := adoptTable
			if synced[t.name] {
				adopt = reattachTable
			}
			if err := adopt(ctx, conn, t); err != nil {
				return fmt.Errorf("drivesync: Open: register table %s: %w", t.name, err)
			}
		}
		e.detached = map[string]bool{}
		for name := range synced {
			if e.tables[name] == nil {
				e.detached[name] = true
			}
		}
		for _, t := range e.order {
			if _, err := conn.ExecContext(ctx, `INSERT OR IGNORE INTO sync_tables (name) VALUES (?)`, t.name); err != nil {
				return err
			}
		}
		_, err = conn.ExecContext(ctx, "COMMIT")
		return err
	}()
	if err != nil {
		conn.ExecContext(context.Background(), "ROLLBACK")
		if sqliteerr.IsReadOnly(err) {
			err = fmt.Errorf("drivesync: Open: %w", databaseReadOnly(ctx, conn, err))
		}
		return nil, err
	}
	e.log.Info("drivesync: opened", "device", e.deviceID, "tables", len(e.order))
	return e, nil
}

// syncedTables returns the tables this database has synced: those recorded
// in sync_tables, and, for a database an older engine version synced, those
// that still have capture triggers.
func syncedTables(ctx context.Context, q querier) (map[string]bool, error) {
	synced := map[string]bool{}
	rows, err := q.QueryContext(ctx, `SELECT name FROM sync_tables
UNION SELECT substr(name, length('sync_trg_') + 1, length(name) - length('sync_trg_') - length('_insert'))
	FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'sync\_trg\_%\_insert' ESCAPE '\'
	AND name NOT LIKE 'sync\_trg\_%\_check\_insert' ESCAPE '\'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		synced[name] = true
	}
	return synced, rows.Err()
}

// reattachTable registers again a table this database synced before. While
// it was unregistered, the app's rows kept what they showed (received
// changes went to sync_states only, and sync_unwritten keeps what each
// changed record's row still shows), and the app may have written them
// with no capture running. So a row is pending only where it differs from
// what it showed: those are the app's own edits, inserts and deletes, and
// planRecord sends just them, laid over the synced state. Every other row
// the next sync writes from sync_states (see retryUnwritten).
func reattachTable(ctx context.Context, q querier, t *tableInfo) error {
	if err := markEdited(ctx, q, t); err != nil {
		return err
	}
	// The rows the app left alone show what others changed meanwhile.
	rows, err := q.QueryContext(ctx, `SELECT u.record_id, s.record_data, s.is_deleted FROM sync_unwritten u
JOIN sync_states s ON s.table_name = u.table_name AND s.record_id = u.record_id
WHERE u.table_name = ?1 AND NOT EXISTS (SELECT 1 FROM sync_pending_changes p WHERE p.table_name = ?1 AND p.record_id = u.record_id)`, t.name)
	if err != nil {
		return err
	}
	type state struct {
		id, data string
		deleted  bool
	}
	var states []state
	for rows.Next() {
		var st state
		if err := rows.Scan(&st.id, &st.data, &st.deleted); err != nil {
			rows.Close()
			return err
		}
		states = append(states, st)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	return engineWrites(ctx, q, func() error {
		for _, st := range states {
			var err error
			if st.deleted {
				err = t.deleteRow(ctx, direct{q}, st.id)
			} else {
				err = t.writeRow(ctx, direct{q}, st.id, st.data)
			}
			switch ok, err := refused(ctx, q, err); {
			case ok:
				continue // refused: the next sync tries again and reports it
			case err != nil:
				return err
			}
			if _, err := q.ExecContext(ctx, `DELETE FROM sync_unwritten WHERE table_name = ?1 AND record_id = ?2`, t.name, st.id); err != nil {
				return err
			}
		}
		return nil
	})
}

// markEdited marks pending the rows of a table registered again that
// differ from what they showed (see reattachTable).
func markEdited(ctx context.Context, q querier, t *tableInfo) error {
	if t.ordinary {
		return markEditedRows(ctx, q, t)
	}
	tbl := quoteIdent(t.name)
	edited := fmt.Sprintf(`INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id)
SELECT ?1, c.id FROM %s c
LEFT JOIN sync_unwritten u ON u.table_name = ?1 AND u.record_id = c.id
LEFT JOIN sync_states s ON s.table_name = ?1 AND s.record_id = c.id
WHERE CASE WHEN u.record_id IS NOT NULL THEN u.base IS NOT json(c.content)
	ELSE s.record_id IS NULL OR s.is_deleted OR s.record_data IS NOT json(c.content) END`, tbl)
	if _, err := q.ExecContext(ctx, edited, t.name); err != nil {
		return err
	}
	deleted := fmt.Sprintf(`INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id)
SELECT ?1, s.record_id FROM sync_states s
LEFT JOIN sync_unwritten u ON u.table_name = ?1 AND u.record_id = s.record_id
WHERE s.table_name = ?1 AND NOT EXISTS (SELECT 1 FROM %s WHERE id = s.record_id COLLATE BINARY)
	AND CASE WHEN u.record_id IS NOT NULL THEN u.base IS NOT NULL ELSE NOT s.is_deleted END`, tbl)
	_, err := q.ExecContext(ctx, deleted, t.name)
	return err
}

// checkNullIDs refuses a document table that holds rows whose id is NULL
// (the triggers refuse new ones; these were written before the table was
// registered): no device could find them, so they would never sync. An
// ordinary table's keys are checked by adoptRows.
func checkNullIDs(ctx context.Context, q querier, t *tableInfo) error {
	if t.ordinary {
		return nil
	}
	var n int
	if err := q.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE id IS NULL`, quoteIdent(t.name))).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d row(s) have a NULL id: give each an id, such as a UUID, before syncing the table (devices find a record by its id)", n)
	}
	return nil
}

// adoptTable joins a newly registered table to the synced state: its rows
// become pending (their differences from the synced state are sent at the
// next sync), and synced records it lacks are written into it. A record
// the table's own constraints refuse is skipped (OR IGNORE), as a sync
// skips it (Report.Unwritten); it stays in sync_states, and the next sync
// tries it again.
func adoptTable(ctx context.Context, q querier, t *tableInfo) error {
	if t.ordinary {
		return adoptRows(ctx, q, t)
	}
	tbl := quoteIdent(t.name)
	if _, err := q.ExecContext(ctx, fmt.Sprintf(`INSERT OR IGNORE INTO sync_pending_changes (table_name, record_id) SELECT ?, id FROM %s`, tbl), t.name); err != nil {
		return err
	}
	content := "s.record_data"
	if t.jsonb {
		content = "jsonb(s.record_data)"
	}
	cols, vals := []string{"id", "content"}, []string{"s.record_id", content}
	for _, c := range t.columns {
		cols = append(cols, quoteIdent(c))
		vals = append(vals, t.projection("s.record_data", c))
	}
	return engineWrites(ctx, q, func() error {
		// One statement writes them all, skipping the rows a UNIQUE,
		// NOT NULL or CHECK constraint refuses. A foreign key or an app
		// trigger's RAISE(ABORT) fails the statement whatever OR IGNORE
		// says: the rows are then written one by one, as an ordinary
		// table's are.
		if _, err := q.ExecContext(ctx, `SAVEPOINT drivesync_adopt`); err != nil {
			return err
		}
		insert := fmt.Sprintf(`INSERT OR IGNORE INTO %s (%s) SELECT %s FROM sync_states s
WHERE s.table_name = ?1 AND s.is_deleted = 0 AND NOT EXISTS (SELECT 1 FROM %s WHERE id = s.record_id COLLATE BINARY)`,
			tbl, strings.Join(cols, ", "), strings.Join(vals, ", "), tbl)
		_, err := q.ExecContext(ctx, insert, t.name)
		if ok, rerr := refused(ctx, q, err); rerr != nil {
			return rerr
		} else if ok {
			if _, err := q.ExecContext(ctx, `ROLLBACK TO drivesync_adopt`); err != nil {
				return err
			}
		}
		if _, err := q.ExecContext(ctx, `RELEASE drivesync_adopt`); err != nil {
			return err
		}
		if err == nil {
			refused := fmt.Sprintf(`INSERT OR IGNORE INTO sync_unwritten (table_name, record_id) SELECT ?1, s.record_id FROM sync_states s
WHERE s.table_name = ?1 AND s.is_deleted = 0 AND NOT EXISTS (SELECT 1 FROM %s WHERE id = s.record_id COLLATE BINARY)`, tbl)
			_, err := q.ExecContext(ctx, refused, t.name)
			return err
		}
		return writeMissingRows(ctx, q, t)
	})
}

// engineWrites runs fn in a quiet window of Open's transaction: the rows
// it writes are the engine's, not the app's edits.
func engineWrites(ctx context.Context, q querier, fn func() error) error {
	if err := foldPending(ctx, q); err != nil {
		return err
	}
	w, err := beginQuiet(ctx, q, nil, 0, 0)
	if err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	return w.end(ctx)
}

// DeviceID returns the id this database syncs as.
func (e *Engine) DeviceID() string {
	e.idMu.Lock()
	defer e.idMu.Unlock()
	return e.deviceID
}

// Close waits for a running Sync to finish and makes later Syncs fail
// with ErrClosed. It does not close the database.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.sem <- struct{}{} // wait for a running sync
	<-e.sem
	return nil
}
