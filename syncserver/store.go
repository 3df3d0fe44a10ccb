package syncserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver
)

// A Store is where the server keeps its stores' records: a PostgreSQL
// database, which several server processes may share, or an SQLite file,
// which one process owns. Both keep the same tables and run the same
// statements; they differ in how a push takes its store's lock.
//
// The records of one user's store are written by one push at a time: a
// push holds its store's row lock (PostgreSQL) or the database's write
// lock (SQLite) from before it reads anything until it commits. Each
// write a push makes takes the next microsecond of the store's clock,
// after everything committed before it, so the order of the writes'
// times is the order of their commits. That makes a time a cursor that
// skips nothing: a pull that sees a store's clock at T sees every write
// up to T, and every later write is stamped after T.
type Store struct {
	db      *sql.DB // writes; for SQLite the one write connection
	read    *sql.DB // pulls; for PostgreSQL the same as db
	dialect dialect

	mu      sync.Mutex
	swept   time.Time // when expired idempotency keys were last deleted
	chunks  time.Time // when abandoned uploads' chunks were last deleted
	closeMu sync.Once
}

type dialect int

const (
	postgres dialect = iota
	sqlite
)

// Open opens the store spec names: "sqlite:PATH" for an SQLite file
// (created if missing), or a "postgres://" (or "postgresql://") URL. It
// creates the server's tables if they are missing.
func Open(ctx context.Context, spec string) (*Store, error) {
	switch {
	case strings.HasPrefix(spec, "sqlite:"):
		return openSQLite(ctx, strings.TrimPrefix(spec, "sqlite:"))
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return openPostgres(ctx, spec)
	}
	return nil, fmt.Errorf("syncserver: store %q: want sqlite:PATH or a postgres:// URL", spec)
}

func openSQLite(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("syncserver: store sqlite: needs a file path, as in sqlite:drivesync-server.db")
	}
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)"
	w, err := sql.Open("sqlite", dsn+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("syncserver: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1) // one writer: SQLite has one write lock
	r, err := sql.Open("sqlite", dsn)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("syncserver: open %s: %w", path, err)
	}
	s := &Store{db: w, read: r, dialect: sqlite}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("syncserver: open %s: %w", path, err)
	}
	return s, nil
}

func openPostgres(ctx context.Context, url string) (*Store, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("syncserver: open PostgreSQL: %w", err)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	s := &Store{db: db, read: db, dialect: postgres}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("syncserver: open PostgreSQL: %w", err)
	}
	return s, nil
}

// Close closes the store's database connections.
func (s *Store) Close() error {
	var err error
	s.closeMu.Do(func() {
		err = s.db.Close()
		if s.read != s.db {
			err = errors.Join(err, s.read.Close())
		}
	})
	return err
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	return s.read.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
}

// The server's tables. Times are microseconds since the Unix epoch (UTC):
// exact in both databases, and what cursors compare.
const schema = `
CREATE TABLE IF NOT EXISTS sync_server_stores (
	id          TEXT PRIMARY KEY,
	owner       TEXT NOT NULL,
	name        TEXT NOT NULL,
	created_us  BIGINT NOT NULL,
	last_us     BIGINT NOT NULL,
	max_version BIGINT NOT NULL,
	UNIQUE (owner, name)
);
CREATE TABLE IF NOT EXISTS sync_server_records (
	store_id   TEXT NOT NULL,
	table_name TEXT NOT NULL,
	record_id  TEXT NOT NULL,
	data       TEXT NOT NULL,
	clock      TEXT NOT NULL,
	deleted    INTEGER NOT NULL,
	updated_us BIGINT NOT NULL,
	deleted_us BIGINT,
	PRIMARY KEY (store_id, table_name, record_id)
);
CREATE INDEX IF NOT EXISTS sync_server_records_cursor ON sync_server_records (store_id, updated_us);
CREATE TABLE IF NOT EXISTS sync_server_keys (
	store_id   TEXT NOT NULL,
	key        TEXT NOT NULL,
	hash       TEXT NOT NULL,
	response   TEXT NOT NULL,
	created_us BIGINT NOT NULL,
	PRIMARY KEY (store_id, key)
);
CREATE INDEX IF NOT EXISTS sync_server_keys_created ON sync_server_keys (created_us);
CREATE TABLE IF NOT EXISTS sync_server_files (
	store_id   TEXT NOT NULL,
	name       TEXT NOT NULL,
	upload_id  TEXT NOT NULL,
	size       BIGINT NOT NULL,
	sha256     TEXT NOT NULL,
	created_us BIGINT NOT NULL,
	PRIMARY KEY (store_id, name)
);
CREATE INDEX IF NOT EXISTS sync_server_files_created ON sync_server_files (store_id, created_us);
CREATE TABLE IF NOT EXISTS sync_server_chunks (
	upload_id  TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	data       BYTEA NOT NULL,
	created_us BIGINT NOT NULL,
	PRIMARY KEY (upload_id, seq)
);
CREATE INDEX IF NOT EXISTS sync_server_chunks_created ON sync_server_chunks (created_us);
`

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if s.dialect == postgres {
		// Server processes starting together must not race to create
		// the same tables.
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(7301482215)`); err != nil {
			return err
		}
	}
	for stmt := range strings.SplitSeq(schema, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	// Columns added since the first version: a store keeps records or
	// files (see files.go), and stores made before files existed keep
	// records; a record keeps what its writes had seen (see seen.go).
	for _, c := range []struct{ table, column, decl string }{
		{"sync_server_stores", "kind", "TEXT NOT NULL DEFAULT 'records'"},
		{"sync_server_records", "seen", "TEXT NOT NULL DEFAULT ''"},
	} {
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT count(*) FROM `+map[dialect]string{
			postgres: `information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2`,
			sqlite:   `pragma_table_info($1) WHERE name = $2`,
		}[s.dialect]), c.table, c.column).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			if _, err := tx.ExecContext(ctx, `ALTER TABLE `+c.table+` ADD COLUMN `+c.column+` `+c.decl); err != nil {
				return err
			}
		}
	}
	return tx.Commit()
}

var dollarRE = regexp.MustCompile(`\$(\d+)`)

// q adapts a statement written with PostgreSQL's $N placeholders.
func (s *Store) q(stmt string) string {
	if s.dialect == sqlite {
		return dollarRE.ReplaceAllString(stmt, "?$1")
	}
	return stmt
}

// storeInfo is a row of sync_server_stores.
type storeInfo struct {
	id         string
	created    int64 // µs
	last       int64 // µs: the time of the store's newest write
	maxVersion int64 // the largest version of any write it holds
	kind       string
}

// record is a row of sync_server_records.
type record struct {
	table, id   string
	data, clock string
	seen        string // what the writes of its paths had seen (see seen.go), "" if nothing known
	deleted     bool
	updated     int64 // µs
	deletedAt   int64 // µs, 0 when not deleted
}

// pushTx is one push's transaction, holding its store's write lock.
type pushTx struct {
	s     *Store
	tx    *sql.Tx
	ctx   context.Context
	store storeInfo
	put   *sql.Stmt
	get   *sql.Stmt
}

// push runs fn in a transaction that holds the write lock of owner's store
// name, creating the store if it does not exist. fn's error rolls
// everything back.
func (s *Store) push(ctx context.Context, owner, name string, now int64, fn func(*pushTx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO sync_server_stores (id, owner, name, created_us, last_us, max_version)
		VALUES ($1, $2, $3, $4, 0, 0) ON CONFLICT (owner, name) DO NOTHING`), uuid.NewString(), owner, name, now); err != nil {
		return err
	}
	lock := ""
	if s.dialect == postgres {
		lock = " FOR UPDATE"
	}
	p := &pushTx{s: s, tx: tx, ctx: ctx}
	if err := tx.QueryRowContext(ctx, s.q(`SELECT id, created_us, last_us, max_version, kind FROM sync_server_stores WHERE owner = $1 AND name = $2`+lock), owner, name).
		Scan(&p.store.id, &p.store.created, &p.store.last, &p.store.maxVersion, &p.store.kind); err != nil {
		return err
	}
	if p.store.kind != kindRecords {
		return wrongKind(name, p.store.kind)
	}
	if p.get, err = tx.PrepareContext(ctx, s.q(`SELECT data, clock, seen, deleted, updated_us, coalesce(deleted_us, 0) FROM sync_server_records WHERE store_id = $1 AND table_name = $2 AND record_id = $3`)); err != nil {
		return err
	}
	if p.put, err = tx.PrepareContext(ctx, s.q(`INSERT INTO sync_server_records (store_id, table_name, record_id, data, clock, seen, deleted, updated_us, deleted_us)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (store_id, table_name, record_id) DO UPDATE SET data = excluded.data, clock = excluded.clock, seen = excluded.seen,
			deleted = excluded.deleted, updated_us = excluded.updated_us, deleted_us = excluded.deleted_us`)); err != nil {
		return err
	}
	if err := fn(p); err != nil {
		return err
	}
	return tx.Commit()
}

// key returns the hash and response stored for an idempotency key of the
// push's store created at or after notBefore. Keys belong to a store: a
// store deleted and created again starts with none, and pushes with one
// key, holding the store's lock, never race.
func (p *pushTx) key(key string, notBefore int64) (hash, response string, found bool, err error) {
	err = p.tx.QueryRowContext(p.ctx, p.s.q(`SELECT hash, response FROM sync_server_keys WHERE store_id = $1 AND key = $2 AND created_us >= $3`), p.store.id, key, notBefore).Scan(&hash, &response)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false, nil
	}
	return hash, response, err == nil, err
}

// saveKey stores the response to the push that sent key, replacing an
// expired one.
func (p *pushTx) saveKey(key, hash, response string, now int64) error {
	_, err := p.tx.ExecContext(p.ctx, p.s.q(`DELETE FROM sync_server_keys WHERE store_id = $1 AND key = $2`), p.store.id, key)
	if err == nil {
		_, err = p.tx.ExecContext(p.ctx, p.s.q(`INSERT INTO sync_server_keys (store_id, key, hash, response, created_us) VALUES ($1, $2, $3, $4, $5)`), p.store.id, key, hash, response, now)
	}
	return err
}

// record reads a record of the push's store.
func (p *pushTx) record(table, id string) (record, bool, error) {
	r := record{table: table, id: id}
	var deleted int64
	err := p.get.QueryRowContext(p.ctx, p.store.id, table, id).Scan(&r.data, &r.clock, &r.seen, &deleted, &r.updated, &r.deletedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	r.deleted = deleted != 0
	return r, err == nil, err
}

// putRecord writes a record of the push's store.
func (p *pushTx) putRecord(r record) error {
	var deletedAt any
	if r.deleted {
		deletedAt = r.deletedAt
	}
	_, err := p.put.ExecContext(p.ctx, p.store.id, r.table, r.id, r.data, r.clock, r.seen, boolInt(r.deleted), r.updated, deletedAt)
	return err
}

// setClock records the store's newest write time and version.
func (p *pushTx) setClock(last, maxVersion int64) error {
	_, err := p.tx.ExecContext(p.ctx, p.s.q(`UPDATE sync_server_stores SET last_us = $1, max_version = $2 WHERE id = $3`), last, maxVersion, p.store.id)
	return err
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// due reports whether a sweep last run at *last is due again after
// every, and if so marks it run now.
func (s *Store) due(last *time.Time, every time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(*last) <= every {
		return false
	}
	*last = time.Now()
	return true
}

// sweepKeys deletes the idempotency keys that expired before notBefore,
// at most once a minute per process.
func (s *Store) sweepKeys(ctx context.Context, notBefore int64) {
	if s.due(&s.swept, time.Minute) {
		s.db.ExecContext(ctx, s.q(`DELETE FROM sync_server_keys WHERE created_us < $1`), notBefore)
	}
}

// page is what a pull reads: the store and up to limit records written
// after since, oldest first.
type page struct {
	found   bool
	store   storeInfo
	records []record
	more    bool // records after these exist
}

// pull reads, in one snapshot, owner's store name and its records written
// after since, at most limit of them and, past the first, at most
// maxBytes of data.
func (s *Store) pull(ctx context.Context, owner, name string, since int64, limit, maxBytes int) (page, error) {
	var pg page
	opts := &sql.TxOptions{ReadOnly: true}
	if s.dialect == postgres {
		opts.Isolation = sql.LevelRepeatableRead
	}
	tx, err := s.read.BeginTx(ctx, opts)
	if err != nil {
		return pg, err
	}
	defer tx.Rollback()
	err = tx.QueryRowContext(ctx, s.q(`SELECT id, created_us, last_us, max_version, kind FROM sync_server_stores WHERE owner = $1 AND name = $2`), owner, name).
		Scan(&pg.store.id, &pg.store.created, &pg.store.last, &pg.store.maxVersion, &pg.store.kind)
	if errors.Is(err, sql.ErrNoRows) {
		return pg, nil
	}
	if err != nil {
		return pg, err
	}
	if pg.store.kind != kindRecords {
		return pg, wrongKind(name, pg.store.kind)
	}
	pg.found = true
	rows, err := tx.QueryContext(ctx, s.q(`SELECT table_name, record_id, data, clock, seen, deleted, updated_us, coalesce(deleted_us, 0)
		FROM sync_server_records WHERE store_id = $1 AND updated_us > $2 ORDER BY updated_us LIMIT $3`), pg.store.id, since, limit+1)
	if err != nil {
		return pg, err
	}
	defer rows.Close()
	size := 0
	for rows.Next() {
		if len(pg.records) == limit || (len(pg.records) > 0 && size >= maxBytes) {
			pg.more = true
			break
		}
		var r record
		var deleted int64
		if err := rows.Scan(&r.table, &r.id, &r.data, &r.clock, &r.seen, &deleted, &r.updated, &r.deletedAt); err != nil {
			return pg, err
		}
		r.deleted = deleted != 0
		size += len(r.data) + len(r.clock) + len(r.seen) + len(r.id)
		pg.records = append(pg.records, r)
	}
	return pg, rows.Err()
}

// owner returns the user whose store has id and the store's name, or ""
// if none has.
func (s *Store) owner(ctx context.Context, id string) (owner, name string, err error) {
	err = s.read.QueryRowContext(ctx, s.q(`SELECT owner, name FROM sync_server_stores WHERE id = $1`), id).Scan(&owner, &name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", nil
	}
	return owner, name, err
}
