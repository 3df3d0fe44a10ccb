package drivesync

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
	"github.com/google/uuid"

	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// The engine's own tables. sync_control, sync_pending_log,
// sync_pending_changes and sync_states hold what changed locally and the
// synced state (see pending.go); sync_meta holds this device's
// identity and cursor, sync_files the remote files already applied (or
// rejected), sync_outbox an upload not yet committed (see outbox.go),
// sync_unwritten the synced records whose row the app's table refused
// (see retryUnwritten).
//
// The pending tables store only which records changed, not their content:
// the engine reads the content from the app's table when it syncs. That
// keeps the triggers cheap (a write appends one small row) and the content
// read at sync time is the latest anyway.
//
// sync_meta.max_version replaces an index on sync_states.sync_version: a
// sync needs the largest version once, and keeping a maximum costs one
// row write per sync where an index costs a write per record.
//
// sync_states.record_data is canonical JSON text (see internal/jsonv), and
// clock holds the stamp of every member path (see patch.go). Both are
// derived only from the patches applied, so every device stores the same
// bytes.
const schemaSQL = `
CREATE TABLE IF NOT EXISTS sync_control (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	is_syncing INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO sync_control (id, is_syncing) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS sync_pending_log (
	seq INTEGER PRIMARY KEY,
	table_name TEXT NOT NULL,
	record_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sync_pending_changes (
	table_name TEXT NOT NULL,
	record_id TEXT NOT NULL,
	PRIMARY KEY (table_name, record_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_states (
	table_name TEXT NOT NULL,
	record_id TEXT NOT NULL,
	record_data TEXT NOT NULL,
	clock TEXT NOT NULL,
	sync_version INTEGER NOT NULL,
	device_id TEXT NOT NULL,
	is_deleted INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (table_name, record_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_meta (
	key TEXT PRIMARY KEY,
	value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_files (
	name TEXT PRIMARY KEY,
	status TEXT NOT NULL,
	size INTEGER NOT NULL,
	detail TEXT NOT NULL DEFAULT '',
	checked_at INTEGER NOT NULL DEFAULT 0,
	reader TEXT NOT NULL DEFAULT '',
	attempts INTEGER NOT NULL DEFAULT 0,
	seq INTEGER NOT NULL DEFAULT 0, -- a patch or merge file's number among its device's (0: none, see vanished.go)
	holds TEXT -- a snapshot's numbers it holds (JSON), NULL until its header was read
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_held (
	device TEXT NOT NULL, -- the files, by number, whose content the synced state holds (see vanished.go)
	first INTEGER NOT NULL,
	last INTEGER NOT NULL,
	PRIMARY KEY (device, first)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_uploaded (
	name TEXT PRIMARY KEY -- every file this database uploaded or tried to
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_tables (
	name TEXT PRIMARY KEY -- every table this database has synced
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_immutable (
	table_name TEXT NOT NULL,
	record_id TEXT NOT NULL,
	mine TEXT NOT NULL, -- digests of this device's row and of the other payload
	theirs TEXT NOT NULL,
	PRIMARY KEY (table_name, record_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_placed (
	table_name TEXT NOT NULL, -- rows of append-only tables the engine placed
	record_id TEXT NOT NULL,
	PRIMARY KEY (table_name, record_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_unwritten (
	table_name TEXT NOT NULL,
	record_id TEXT NOT NULL,
	base TEXT, -- the content the app's row still shows (JSON), NULL for no row
	PRIMARY KEY (table_name, record_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sync_conflicts (
	id INTEGER PRIMARY KEY,
	table_name TEXT NOT NULL,
	record_id TEXT NOT NULL,
	path TEXT NOT NULL, -- JSON array of member keys
	loser TEXT NOT NULL, -- JSON value
	loser_version INTEGER NOT NULL,
	loser_device TEXT NOT NULL,
	winner TEXT NOT NULL, -- JSON value, null for a removal
	winner_version INTEGER NOT NULL,
	winner_device TEXT NOT NULL,
	detected_at TEXT NOT NULL -- RFC 3339, this device's clock
);
CREATE TABLE IF NOT EXISTS sync_outbox (
	name TEXT NOT NULL,
	seq INTEGER NOT NULL,
	data BLOB NOT NULL,
	PRIMARY KEY (name, seq)
) WITHOUT ROWID;
UPDATE sync_control SET is_syncing = 0;
`

const (
	metaDeviceID     = "device_id"
	metaCursor       = "cursor"      // remote time of the newest file seen
	metaMaxVersion   = "max_version" // the largest version seen or reserved: new stamps go above it
	metaSchema       = "schema_version"
	metaStore        = "store"         // the id of the store this database syncs with (the remote's marker)
	metaStoreClaim   = "store_claimed" // remote time this device created the marker, until it is confirmed
	metaSnapshot     = "snapshot"      // the newest snapshot seen or written
	metaCompact      = "compact"       // this device's snapshot whose compaction is due
	metaJoin         = "join"          // set by JoinRemote until the merge file is uploaded
	metaPruned       = "ledger_pruned" // the month (remote time) sync_files was last pruned
	metaUploads      = "uploads_since" // remote time sync_uploaded began: older files are not judged
	metaUploadsKept  = "uploads_kept"  // newest upload before the last bind: sync_uploaded keeps names up to it (see keepUploads)
	metaServerCursor = "server_cursor" // where the next pull from a Server starts
	metaRemoteID     = "remote_id"     // the remote's identity when this database last bound to its store (see IdentifiedRemote)
	metaStatus       = "status"        // how the last sync ended, for Status (JSON)
	metaKeyVerified  = "key_verified"  // the fingerprint of the key verified to open the store (see bindKeys)
	metaFirstKey     = "key_first"     // the store whose first key this device held (see keyring.first)
	metaFileID       = "file_id"       // the database file that took the device id (see fileMoved)
	metaRenewID      = "renew_id"      // set: a new device id is owed once the outbox is empty, the app's or, if "1", a random one (see renewMovedID)
	metaFileSeq      = "file_seq"      // the last number this database gave a file (see vanished.go)
	metaMergeSeq     = "merge_seq"     // the number of the merge file a JoinRemote publishes, until it is
	metaListedAll    = "listed_all"    // remote time of the last listing of the whole remote
	metaHealFailed   = "heal_failed"   // remote time a snapshot healing vanished files could not be written
	schemaVersion    = "4"
)

// sync_files.status values. A patch or merge file is applied or rejected.
// A snapshot is applied when this device loaded it or wrote it (then every
// record of it was read and checked: compaction may act on its authority),
// checked when only its header was read and showed nothing this device
// lacks, rejected when it could not be read.
const (
	fileApplied  = "applied"
	fileChecked  = "checked"
	fileRejected = "rejected"
)

// migrations bring an older engine schema up to date: each step runs once,
// in order, on a database whose schema is older than the step's version,
// in the transaction of Open (schemaSQL then creates what is missing).
var migrations = []struct {
	version int
	sql     []string
	fn      func(context.Context, querier) error // after sql
}{
	// Schema 1 recorded every snapshot seen as applied, even one whose
	// header alone was read: none of them is known to be complete.
	{version: 2, sql: []string{
		`ALTER TABLE sync_files ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0`,
		`UPDATE sync_files SET status = 'checked' WHERE status = 'applied' AND name LIKE '%/snapshot\_%' ESCAPE '\'`,
	}},
	// Schema 4 numbers files (see vanished.go): the files applied before
	// carry no number, and the headers of the snapshots checked before
	// are read again when a number seems gone (findVanished).
	{version: 4, fn: func(ctx context.Context, q querier) error {
		if err := addColumn(ctx, q, "sync_files", "seq", "INTEGER NOT NULL DEFAULT 0"); err != nil {
			return err
		}
		return addColumn(ctx, q, "sync_files", "holds", "TEXT")
	}},
}

// addColumn adds a column to one of the engine's tables unless it has it.
func addColumn(ctx context.Context, q querier, table, column, decl string) error {
	var has bool
	if err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)`, table, column).Scan(&has); err != nil || has {
		return err
	}
	_, err := q.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN `+column+` `+decl)
	return err
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func quoteIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

func quoteString(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// tableInfo is what the engine learned about a registered table at Open,
// and the SQL it uses on it.
type tableInfo struct {
	name string
	// ordinary: the table's own columns hold the record (see rows.go);
	// else it is a document table (id TEXT PRIMARY KEY, content).
	ordinary bool
	jsonb    bool     // content is stored as JSONB, not JSON text
	columns  []string // projection columns, filled from content's same-named keys

	keys       []string               // an ordinary table's key columns, in key order
	keyTypes   []byte                 // their affinity: 'i' INTEGER or NUMERIC, 't' TEXT, 'b' none
	rowidKey   bool                   // the key is the rowid's alias (id INTEGER PRIMARY KEY)
	fields     []string               // its other columns, each a member of the record
	fieldSet   map[string]bool        // fields by name
	defaults   map[string]jsonv.Value // the constant defaults of fields (see rowRecord)
	rules      map[string]MergeRule   // the fields' merge rules, if not the last writer
	appendOnly bool                   // rows are immutable once written
	orAbort    string                 // "OR ABORT " if the table declares conflict algorithms to override (see overridesConflicts)
	// fillDefaults: a document table's NOT NULL projections with a
	// constant default, written for a NULL under OR ABORT (see buildSQL).
	fillDefaults map[string]string

	upsertSQL string // ?1 id, ?2 canonical content
	updateSQL string // ?1 id, ?2 canonical content; for rows known to exist
	deleteSQL string // ?1 id; an ordinary table's key columns
	existsSQL string // the same parameters -> a row if the table has it
	readSQL   string // ?1 id -> content as JSON text, or no row; ordinary: by key
	sameSQL   string // ?1 id, ?2 canonical content -> whether the row's JSONB is the engine's encoding of it

	mu      sync.Mutex
	upserts map[string]string // an ordinary table's upserts, by the columns they write
}

// column is one column of a table, as pragma table_xinfo describes it.
type column struct {
	name, typ string
	pk        int
	hidden    bool
	notNull   bool
	dflt      sql.NullString // the default's SQL text, as declared
}

func inspectTable(ctx context.Context, q querier, t Table) (*tableInfo, error) {
	if err := merge.CheckTableName(t.Name); err != nil {
		return nil, fmt.Errorf("drivesync: %w", err)
	}
	// SQLite matches table names without regard to case, but devices
	// compare them exactly, in files and in sync_states: one spelling only.
	var stored string
	err := q.QueryRowContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE`, t.Name).Scan(&stored)
	if err == nil && stored != t.Name {
		return nil, fmt.Errorf("drivesync: table %s is spelled %s in the database: register it with that spelling (devices compare table names exactly)", t.Name, stored)
	}
	rows, err := q.QueryContext(ctx, `SELECT name, type, pk, hidden, "notnull", dflt_value FROM pragma_table_xinfo(?)`, t.Name)
	if err != nil {
		return nil, fmt.Errorf("drivesync: inspect table %s: %w", t.Name, err)
	}
	defer rows.Close()
	var cols []column
	haveContent := false
	for rows.Next() {
		var c column
		var hidden int
		if err := rows.Scan(&c.name, &c.typ, &c.pk, &hidden, &c.notNull, &c.dflt); err != nil {
			return nil, err
		}
		// Generated and hidden columns are SQLite's to fill.
		c.hidden = hidden != 0
		haveContent = haveContent || c.name == "content"
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	if len(cols) == 0 {
		return nil, fmt.Errorf("drivesync: table %s does not exist: create it before Open (a table with a PRIMARY KEY, or id TEXT PRIMARY KEY with a JSON content column)", t.Name)
	}
	switch other, err := deferredKeys(ctx, q, t.Name); {
	case err != nil:
		return nil, fmt.Errorf("drivesync: inspect table %s: %w", t.Name, err)
	case other != "":
		return nil, fmt.Errorf("drivesync: table %s: table %s declares a foreign key DEFERRABLE INITIALLY DEFERRED that involves it: SQLite checks such a key only when the sync's transaction commits, where one refused row would fail the whole sync, at every sync; declare the foreign key without it (the engine writes rows in any order and writes a refused row again once its parent arrives)", t.Name, other)
	}
	var def sql.NullString
	if err := q.QueryRowContext(ctx, `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1`, t.Name).Scan(&def); err != nil {
		return nil, fmt.Errorf("drivesync: inspect table %s: %w", t.Name, err)
	}
	orAbort := ""
	if overridesConflicts(def.String) {
		orAbort = "OR ABORT "
	}
	if err := binaryKey(ctx, q, t.Name); err != nil {
		return nil, err
	}
	if haveContent {
		return documentTable(t, cols, orAbort)
	}
	return ordinaryTable(ctx, q, t, cols, orAbort)
}

// binaryKey checks that table's PRIMARY KEY index compares its keys by
// the BINARY collation (a name SQLite takes in any case): a key compared by another ('Red' and 'red' under
// NOCASE) would be two records of one row. The engine compares keys by
// BINARY whatever collation their columns declare (see ordinarySQL).
func binaryKey(ctx context.Context, q querier, table string) error {
	var col, coll string
	err := q.QueryRowContext(ctx, `SELECT x.name, x.coll FROM pragma_index_list(?1) l, pragma_index_xinfo(l.name) x
WHERE l.origin = 'pk' AND x.key = 1 AND x.coll <> 'BINARY' COLLATE NOCASE`, table).Scan(&col, &coll)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("drivesync: inspect table %s: %w", table, err)
	}
	return fmt.Errorf("drivesync: table %s: key column %s compares with COLLATE %s: keys that differ only as %s ignores ('Red', 'red') would be two records of one row; give the key column the default BINARY collation (and store the key as the app wants it compared, such as lower(name))", table, col, coll, coll)
}

// deferredKeys returns a table, table itself or one whose foreign keys
// refer to it, that declares a foreign key DEFERRABLE INITIALLY DEFERRED
// ("" if none).
func deferredKeys(ctx context.Context, q querier, table string) (string, error) {
	rows, err := q.QueryContext(ctx, `SELECT m.name, m.sql FROM sqlite_master m WHERE m.type = 'table' AND m.sql IS NOT NULL
	AND (m.name = ?1 OR EXISTS (SELECT 1 FROM pragma_foreign_key_list(m.name) f WHERE f."table" = ?1 COLLATE NOCASE))`, table)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return "", err
		}
		if declaresDeferred(def) {
			return name, nil
		}
	}
	return "", rows.Err()
}

// declaresDeferred reports whether a CREATE TABLE statement declares a
// constraint DEFERRABLE INITIALLY DEFERRED (not NOT DEFERRABLE ...).
func declaresDeferred(def string) bool {
	words := ddlWords(def)
	for i := 0; i+2 < len(words); i++ {
		if words[i] == "DEFERRABLE" && words[i+1] == "INITIALLY" && words[i+2] == "DEFERRED" && (i == 0 || words[i-1] != "NOT") {
			return true
		}
	}
	return false
}

// overridesConflicts reports whether a CREATE TABLE statement declares a
// conflict algorithm that would drop or hide a row the engine writes,
// which the engine's writes then override with OR ABORT (see upsertFor):
// IGNORE or ROLLBACK on any constraint, REPLACE on a UNIQUE or PRIMARY
// KEY (it deletes the other row holding the value). REPLACE on NOT NULL,
// which stores the column's default for a NULL, is the app's own rule for
// its rows and stays.
func overridesConflicts(def string) bool {
	words := ddlWords(def)
	for i := 1; i+2 < len(words); i++ {
		if words[i] != "ON" || words[i+1] != "CONFLICT" {
			continue
		}
		switch words[i+2] {
		case "IGNORE", "ROLLBACK":
			return true
		case "REPLACE":
			if words[i-1] != "NULL" { // the clause follows its constraint: NOT NULL, or UNIQUE / PRIMARY KEY
				return true
			}
		}
	}
	return false
}

// ddlWords returns the words of a CREATE TABLE statement, upper-cased,
// outside comments, strings and quoted names (each of which reads as an
// empty word); nil if a quote is not closed.
func ddlWords(def string) []string {
	var words []string
	var w strings.Builder
	flush := func() {
		if w.Len() > 0 {
			words = append(words, strings.ToUpper(w.String()))
			w.Reset()
		}
	}
	for i := 0; i < len(def); i++ {
		c := def[i]
		switch {
		case c == '-' && strings.HasPrefix(def[i:], "--"):
			flush()
			if j := strings.IndexByte(def[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(def)
			}
		case c == '/' && strings.HasPrefix(def[i:], "/*"):
			flush()
			if j := strings.Index(def[i+2:], "*/"); j >= 0 {
				i += j + 3
			} else {
				i = len(def)
			}
		case c == '\'' || c == '"' || c == '`' || c == '[':
			flush()
			end := c
			if c == '[' {
				end = ']'
			}
			j := strings.IndexByte(def[i+1:], end)
			if j < 0 {
				return nil
			}
			i += j + 1 // a doubled quote reads as two strings: no word either way
			words = append(words, "")
		case c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80:
			w.WriteByte(c)
		default:
			flush()
		}
	}
	flush()
	return words
}

// documentTable checks a table with a content column: id TEXT PRIMARY
// KEY, content JSON, projection columns.
func documentTable(t Table, cols []column, orAbort string) (*tableInfo, error) {
	if t.AppendOnly || len(t.Merge) > 0 {
		return nil, fmt.Errorf("drivesync: table %s is a document table (it has a content column): AppendOnly and Merge apply to ordinary tables, whose columns are the record's fields", t.Name)
	}
	ti := &tableInfo{name: t.Name, orAbort: orAbort}
	haveID := false
	npk := 0
	for _, c := range cols {
		if c.pk > 0 {
			npk++
		}
		utyp := strings.ToUpper(c.typ)
		switch {
		case c.name == "id":
			if c.pk != 1 || !(strings.Contains(utyp, "TEXT") || strings.Contains(utyp, "CHAR") || strings.Contains(utyp, "CLOB")) {
				return nil, fmt.Errorf("drivesync: table %s: column id must be the TEXT PRIMARY KEY (found type %q, pk=%d): records are keyed by ids shared across devices, such as UUIDs", t.Name, c.typ, c.pk)
			}
			haveID = true
		case c.name == "content":
			ti.jsonb = strings.Contains(utyp, "JSONB") || strings.Contains(utyp, "BLOB")
		case c.hidden:
		default:
			if !identRE.MatchString(c.name) {
				return nil, fmt.Errorf("drivesync: table %s: column %q is not a plain identifier; projection columns take their value from the same-named key of content", t.Name, c.name)
			}
			ti.columns = append(ti.columns, c.name)
			if d := constantDefault(c.dflt); c.notNull && d != "" && orAbort != "" {
				// OR ABORT overrides a NOT NULL ON CONFLICT REPLACE,
				// which stored the default for a NULL: the engine
				// fills it in itself. (A projection is not synced: a
				// row that shows the default is no edit.)
				if ti.fillDefaults == nil {
					ti.fillDefaults = map[string]string{}
				}
				ti.fillDefaults[c.name] = d
			}
		}
	}
	switch {
	case !haveID:
		return nil, fmt.Errorf("drivesync: table %s has a column content but no column id: a table with a content column is a document table (id TEXT PRIMARY KEY, content JSON); rename content to sync the table's columns as they are", t.Name)
	case npk != 1:
		return nil, fmt.Errorf("drivesync: table %s has a composite primary key and a content column: a document table needs id TEXT PRIMARY KEY alone (rename content to sync the table's columns as they are)", t.Name)
	}
	ti.buildSQL()
	return ti, nil
}

// ordinaryTable checks a table without a content column: it needs a
// declared primary key whose values the devices share.
func ordinaryTable(ctx context.Context, q querier, t Table, cols []column, orAbort string) (*tableInfo, error) {
	// Rows are read as UTF-8 bytes (see typedValue).
	var enc string
	if err := q.QueryRowContext(ctx, `PRAGMA encoding`).Scan(&enc); err != nil {
		return nil, fmt.Errorf("drivesync: inspect table %s: %w", t.Name, err)
	}
	if enc != "UTF-8" {
		return nil, fmt.Errorf("drivesync: table %s: the database's text encoding is %s; ordinary tables need a UTF-8 database (SQLite's default: PRAGMA encoding before the first table is created)", t.Name, enc)
	}
	ti := &tableInfo{name: t.Name, ordinary: true, orAbort: orAbort}
	var keys []column
	for _, c := range cols {
		if c.hidden {
			continue
		}
		if !identRE.MatchString(c.name) {
			return nil, fmt.Errorf("drivesync: table %s: column %q is not a plain identifier (letters, digits, underscore): each column is a field of the synced record, named after it", t.Name, c.name)
		}
		if c.pk > 0 {
			keys = append(keys, c)
			continue
		}
		ti.fields = append(ti.fields, c.name)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("drivesync: table %s has no PRIMARY KEY: a synced table needs one whose values all devices share, such as a TEXT column of UUIDs or a composite key like (uuid, gen)", t.Name)
	}
	slices.SortFunc(keys, func(a, b column) int { return a.pk - b.pk })
	var strict, withoutRowid bool
	if err := q.QueryRowContext(ctx, `SELECT strict, wr FROM pragma_table_list WHERE name = ?1 AND schema = 'main'`, t.Name).Scan(&strict, &withoutRowid); err != nil {
		return nil, fmt.Errorf("drivesync: inspect table %s: %w", t.Name, err)
	}
	for _, k := range keys {
		// SQLite's affinity rules, in their order.
		switch utyp := strings.ToUpper(k.typ); {
		case strings.Contains(utyp, "INT"):
			ti.keyTypes = append(ti.keyTypes, 'i')
		case strings.Contains(utyp, "CHAR") || strings.Contains(utyp, "CLOB") || strings.Contains(utyp, "TEXT"):
			ti.keyTypes = append(ti.keyTypes, 't')
		case utyp == "" || strings.Contains(utyp, "BLOB") || strict && utyp == "ANY":
			ti.keyTypes = append(ti.keyTypes, 'b')
		case strings.Contains(utyp, "REAL") || strings.Contains(utyp, "FLOA") || strings.Contains(utyp, "DOUB"):
			return nil, fmt.Errorf("drivesync: table %s: key column %s is %s: a key must be TEXT, INTEGER or BLOB, equal on every device", t.Name, k.name, k.typ)
		default:
			ti.keyTypes = append(ti.keyTypes, 'i') // NUMERIC
		}
		ti.keys = append(ti.keys, k.name)
	}
	ti.rowidKey = len(keys) == 1 && strings.EqualFold(keys[0].typ, "INTEGER") && !withoutRowid
	if ti.rowidKey && !t.UniqueIntegerKey {
		return nil, fmt.Errorf("drivesync: table %s: %s INTEGER PRIMARY KEY is SQLite's rowid, numbered 1, 2, 3… on each device, so two devices would create different records under one key: use a TEXT key of UUIDs, or a composite key such as (uuid, gen); if the app itself assigns integers unique across devices, set Table.UniqueIntegerKey", t.Name, keys[0].name)
	}
	ti.ordinarySQL()
	ti.appendOnly = t.AppendOnly
	for col, rule := range t.Merge {
		switch {
		case !ti.hasField(col):
			return nil, fmt.Errorf("drivesync: table %s: Merge names column %q, which is not one of its non-key columns (%s)", t.Name, col, strings.Join(ti.fields, ", "))
		case rule != MergeLastWriter && rule != MergeMax:
			return nil, fmt.Errorf("drivesync: table %s: column %s: unknown merge rule %v", t.Name, col, rule)
		case rule != MergeLastWriter:
			if ti.rules == nil {
				ti.rules = map[string]MergeRule{}
			}
			ti.rules[col] = rule
		}
	}
	if err := ti.readDefaults(ctx, q); err != nil {
		return nil, fmt.Errorf("drivesync: inspect table %s: %w", t.Name, err)
	}
	return ti, nil
}

// projection is the SQL value of projection column col taken from the
// JSON in src: the same expression wherever the engine fills or checks it.
func projection(src, col string) string {
	return fmt.Sprintf("json_extract(%s, '$.%s')", src, col)
}

// projection is the package's projection of col from src, with the
// default filled in where the table needs it (see fillDefaults).
func (ti *tableInfo) projection(src, col string) string {
	if d, ok := ti.fillDefaults[col]; ok {
		return fmt.Sprintf("coalesce(%s, %s)", projection(src, col), d)
	}
	return projection(src, col)
}

func (ti *tableInfo) buildSQL() {
	tbl := quoteIdent(ti.name)
	content := "?2"
	if ti.jsonb {
		content = "jsonb(?2)"
	}
	cols := []string{"id", "content"}
	vals := []string{"?1", content}
	sets := []string{"content = excluded.content"}
	for _, c := range ti.columns {
		extract := ti.projection("?2", c)
		cols = append(cols, quoteIdent(c))
		vals = append(vals, extract)
		sets = append(sets, fmt.Sprintf("%s = excluded.%s", quoteIdent(c), quoteIdent(c)))
	}
	// OR ABORT where needed: see upsertFor.
	ti.upsertSQL = fmt.Sprintf("INSERT %sINTO %s (%s) VALUES (%s) ON CONFLICT (id COLLATE BINARY) DO UPDATE SET %s",
		ti.orAbort, tbl, strings.Join(cols, ", "), strings.Join(vals, ", "), strings.Join(sets, ", "))
	assign := make([]string, 0, len(cols)-1)
	for i := 1; i < len(cols); i++ {
		assign = append(assign, cols[i]+" = "+vals[i])
	}
	ti.updateSQL = fmt.Sprintf("UPDATE %s%s SET %s WHERE id = ?1 COLLATE BINARY", ti.orAbort, tbl, strings.Join(assign, ", "))
	ti.deleteSQL = fmt.Sprintf("DELETE FROM %s WHERE id = ?1 COLLATE BINARY", tbl)
	ti.existsSQL = fmt.Sprintf("SELECT 1 FROM %s WHERE id = ?1 COLLATE BINARY", tbl)
	ti.readSQL = fmt.Sprintf("SELECT json(content) FROM %s WHERE id = ?1 COLLATE BINARY", tbl)
	ti.sameSQL = fmt.Sprintf("SELECT content = jsonb(?2) FROM %s WHERE id = ?1 COLLATE BINARY", tbl)
}

// fileMoved reports whether the database file is another than the one
// recorded when the engine last opened it, and records this one. A file
// is known by its device and inode (see fileID); a database without a
// file of its own, or on a system where the engine cannot tell, is never
// moved.
func fileMoved(ctx context.Context, q querier) (bool, error) {
	var path string
	if err := q.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&path); err != nil {
		return false, err
	}
	id := fileID(path)
	if id == "" {
		return false, nil
	}
	stored, err := getMeta(ctx, q, metaFileID)
	if err != nil || stored == id {
		return false, err
	}
	return stored != "", setMeta(ctx, q, metaFileID, id)
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getMeta(ctx context.Context, q querier, key string) (string, error) {
	var v string
	err := q.QueryRowContext(ctx, `SELECT value FROM sync_meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

func setMeta(ctx context.Context, q querier, key, value string) error {
	_, err := q.ExecContext(ctx, `INSERT INTO sync_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, value)
	return err
}

func getMetaInt(ctx context.Context, q querier, key string) (int64, error) {
	s, err := getMeta(ctx, q, key)
	if err != nil || s == "" {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// installSchema creates the engine's tables and this device's identity.
// It is idempotent and runs in the caller's transaction.
func installSchema(ctx context.Context, q querier, deviceID string) (string, error) {
	var from string
	var installed bool
	err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_meta')`).Scan(&installed)
	if err == nil && installed {
		from, err = getMeta(ctx, q, metaSchema)
	}
	if err != nil {
		return "", fmt.Errorf("drivesync: install schema: %w", err)
	}
	if from != "" {
		cur, err := strconv.Atoi(from)
		if err != nil {
			return "", fmt.Errorf("drivesync: install schema: sync_meta %s is %q", metaSchema, from)
		}
		if want, _ := strconv.Atoi(schemaVersion); cur > want {
			// Its capture may record changes where this version does not
			// look: opening it here could lose them.
			return "", fmt.Errorf("drivesync: this database was synced by a newer drivesync (engine schema %d; this version knows %d): open it with that version or a newer one", cur, want)
		}
		for _, m := range migrations {
			if cur >= m.version {
				continue
			}
			for _, stmt := range m.sql {
				if _, err := q.ExecContext(ctx, stmt); err != nil {
					return "", fmt.Errorf("drivesync: upgrade schema %s to %d: %w", from, m.version, err)
				}
			}
			if m.fn != nil {
				if err := m.fn(ctx, q); err != nil {
					return "", fmt.Errorf("drivesync: upgrade schema %s to %d: %w", from, m.version, err)
				}
			}
		}
	}
	if _, err := q.ExecContext(ctx, schemaSQL); err != nil {
		return "", fmt.Errorf("drivesync: install schema: %w", err)
	}
	stored, err := getMeta(ctx, q, metaDeviceID)
	if err != nil {
		return "", err
	}
	moved, err := fileMoved(ctx, q)
	if err != nil {
		return "", err
	}
	var outbox bool
	if err := q.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM sync_outbox)`).Scan(&outbox); err != nil {
		return "", err
	}
	owed, err := getMeta(ctx, q, metaRenewID)
	if err != nil {
		return "", err
	}
	if deviceID == "" && owed != "" && owed != "1" {
		// An id the app gave and has taken back: the engine chooses
		// again (a copy owes "1" below).
		if _, err := q.ExecContext(ctx, `DELETE FROM sync_meta WHERE key = ?`, metaRenewID); err != nil {
			return "", err
		}
		owed = ""
	}
	switch {
	case deviceID == "" && stored != "" && moved && outbox:
		// As below, but the outbox holds an upload named and stamped
		// with the old id: the next sync publishes and adopts it under
		// that id, then takes the new one (see renewMovedID).
		deviceID = stored
		if err := setMeta(ctx, q, metaRenewID, "1"); err != nil {
			return "", err
		}
	case deviceID == "" && stored != "" && moved:
		// Not the file that took the id: a copy of the database (or
		// a backup put back). Two copies syncing under one id stamp
		// their changes alike, and two writes under one stamp split
		// the devices for good (see checkCopied, which finds a copy
		// only once its files are listed): the copy takes its own id
		// before it stamps anything. Versions go on from max_version.
		deviceID = uuid.NewString()
	case deviceID == "" && stored != "":
		deviceID = stored
	case deviceID != "" && (stored == deviceID || owed == deviceID) && (moved || owed == "1"):
		// The app's id (or the one it gave and this database owes), on
		// another file than the one that took it (or on a copy an
		// earlier Open found, which owes a new id). The engine never
		// changes an id the app sets: if this is a copy, the two would
		// stamp their changes alike.
		return "", fmt.Errorf("drivesync: this database file is not the one that took device id %q: it was copied, restored from a copy, or moved to another disk. Two copies syncing under one id would split the devices: give this one its own Config.DeviceID (also safe if it is the only copy), or leave DeviceID empty and the engine gives a copy an id of its own", deviceID)
	case deviceID != "" && stored != "" && stored != deviceID && outbox:
		// The app gives this database a new id (a copy's, say), while
		// the outbox holds an upload named and stamped with the old
		// one: the next sync publishes and adopts it under that id,
		// then takes the app's (see renewMovedID).
		if err := setMeta(ctx, q, metaRenewID, deviceID); err != nil {
			return "", err
		}
		deviceID = stored
	case deviceID != "":
		// The app's id, or a new one it gives this database: versions
		// go on from max_version, so no stamp is reused. Nothing else
		// is owed.
		if _, err := q.ExecContext(ctx, `DELETE FROM sync_meta WHERE key = ?`, metaRenewID); err != nil {
			return "", err
		}
	case deviceID == "":
		deviceID = uuid.NewString()
	}
	if err := merge.CheckDeviceID(deviceID); err != nil {
		return "", err
	}
	if err := setMeta(ctx, q, metaDeviceID, deviceID); err != nil {
		return "", err
	}
	if err := setMeta(ctx, q, metaSchema, schemaVersion); err != nil {
		return "", err
	}
	return deviceID, nil
}

// beginImmediate starts a write transaction on conn that holds SQLite's
// write lock from its first statement, so it cannot fail half way with
// SQLITE_BUSY when it upgrades a read lock. A busy database is retried
// with jittered backoff until ctx is done: busy_timeout already waits
// inside SQLite, this covers apps that set none.
func beginImmediate(ctx context.Context, conn *sql.Conn) error {
	backoff := 5 * time.Millisecond
	var busy error // the last SQLITE_BUSY seen, if any
	locked := func() error {
		return fmt.Errorf("drivesync: database stayed locked by another writer: %w (last error: %v)", ctx.Err(), busy)
	}
	for {
		_, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		if err == nil {
			return nil
		}
		// The driver may report a context that ended during a BEGIN that
		// did begin: never leave the connection inside a transaction.
		endTx(conn)
		if !sqliteerr.IsBusy(err) {
			// A driver that interrupts its own wait when ctx ends reports
			// the context, not the lock it was waiting for.
			if busy != nil && ctx.Err() != nil {
				return locked()
			}
			return err
		}
		busy = err
		sleep := backoff/2 + rand.N(backoff)
		select {
		case <-ctx.Done():
			return locked()
		case <-time.After(sleep):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// endTx rolls back whatever transaction conn may be in; without one,
// SQLite's error is the expected answer and is ignored.
func endTx(conn *sql.Conn) {
	conn.ExecContext(context.Background(), "ROLLBACK")
}
