// Package notesapp is the data layer of the notes examples (the notes
// command and the notes-web app): a notes table in a SQLite database,
// read and written with plain SQL, synced by a drivesync Engine.
package notesapp

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
)

// Schema is the app's synced table: drivesync needs id TEXT PRIMARY KEY and
// the record as a JSON object in content. updated_at is a projection: the
// engine fills it from content's "updated_at" when it writes a synced row,
// and the app keeps it in step when it writes, so it can be indexed and sorted.
const Schema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content JSONB NOT NULL,
	updated_at TEXT
)`

// newestIndex serves Older and Newer: the notes not soft-deleted, in the
// order they walk (backward, for the newest first), so that a page seeks
// to its first note and reads on rather than sorting every note.
const newestIndex = `CREATE INDEX IF NOT EXISTS notes_newest ON notes (updated_at, id)
WHERE content ->> '$.deleted_at' IS NULL`

// Now is the time stamp notes carry: RFC 3339 in UTC.
func Now() string { return time.Now().UTC().Format(time.RFC3339) }

// App is one device: its database and, when it syncs, the engine.
type App struct {
	DB     *sql.DB
	Engine *drivesync.Engine // nil for an app opened without a remote
}

// openDB opens the database and creates the notes table.
func openDB(ctx context.Context, dbPath string) (*sql.DB, error) {
	dsn := "file:" + dbPath + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	for _, ddl := range []string{Schema, newestIndex} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			db.Close()
			return nil, fmt.Errorf("open %s: %w", dbPath, err)
		}
	}
	return db, nil
}

// Open opens the database, creates the notes table and, if cfg names a
// Remote or a Server, opens the sync engine on it. The engine is opened
// before the app writes: Open installs the triggers that capture writes.
// Without a remote the app works on its notes alone; rows written then
// are sent by the first sync (drivesync.Open marks them pending).
func Open(ctx context.Context, dbPath string, cfg drivesync.Config) (*App, error) {
	db, err := openDB(ctx, dbPath)
	if err != nil {
		return nil, err
	}
	a := &App{DB: db}
	if cfg.Remote == nil && cfg.Server == nil {
		return a, nil
	}
	cfg.Tables = []drivesync.Table{{Name: "notes"}}
	if a.Engine, err = drivesync.Open(ctx, db, cfg); err != nil {
		db.Close()
		return nil, err
	}
	return a, nil
}

// Close closes the engine and the database.
func (a *App) Close() error {
	if a.Engine != nil {
		a.Engine.Close()
	}
	return a.DB.Close()
}

// Add inserts a note and returns its id. Ids must be unique across devices,
// hence UUIDs.
func (a *App) Add(ctx context.Context, text string) (string, error) {
	id, ts := uuid.NewString(), Now()
	content, err := json.Marshal(map[string]any{"text": text, "updated_at": ts, "deleted_at": nil})
	if err != nil {
		return "", err
	}
	// content is passed as a string: jsonb() would read a []byte as JSONB.
	_, err = a.DB.ExecContext(ctx, `INSERT INTO notes (id, content, updated_at) VALUES (?, jsonb(?), ?)`, id, string(content), ts)
	return id, err
}

// ID returns the id of the note that id names: the whole id, or the start
// of exactly one note's id (at least 4 characters), as lists show them.
func (a *App) ID(ctx context.Context, id string) (string, error) {
	if len(id) < 4 {
		return "", fmt.Errorf("no note with id %s: give at least the first 4 characters of an id (run notes list)", id)
	}
	rows, err := a.DB.QueryContext(ctx, `SELECT id FROM notes WHERE id = ?1 OR substr(id, 1, length(?1)) = ?1 ORDER BY id = ?1 DESC LIMIT 2`, id)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return "", err
		}
		ids = append(ids, s)
	}
	switch {
	case rows.Err() != nil:
		return "", rows.Err()
	case len(ids) == 0:
		return "", fmt.Errorf("no note with id %s (run notes list)", id)
	case ids[0] == id || len(ids) == 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%s is the start of several notes' ids: give more of it", id)
}

// Update sets one field of a note's content, and updated_at, keeping every
// other field as it is (including fields a newer app version may have
// added). id may be the start of an id (see ID).
func (a *App) Update(ctx context.Context, id, field string, value any) error {
	id, err := a.ID(ctx, id)
	if err != nil {
		return err
	}
	tx, err := a.DB.BeginTx(ctx, nil) // _txlock=immediate: takes the write lock now
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var raw string
	err = tx.QueryRowContext(ctx, `SELECT json(content) FROM notes WHERE id = ?`, id).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("no note with id %s", id)
	}
	if err != nil {
		return err
	}
	var content map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &content); err != nil {
		return fmt.Errorf("note %s: %w", id, err)
	}
	ts := Now()
	for k, v := range map[string]any{field: value, "updated_at": ts} {
		if content[k], err = json.Marshal(v); err != nil {
			return err
		}
	}
	b, err := json.Marshal(content)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE notes SET content = jsonb(?), updated_at = ? WHERE id = ?`, string(b), ts, id); err != nil {
		return err
	}
	return tx.Commit()
}

// bookkeeping reports whether a conflict is on updated_at, which every
// edit sets: two devices editing a note in different seconds conflict
// there too, which says nothing the conflict on the field the user changed
// does not.
func bookkeeping(c drivesync.Conflict) bool {
	return len(c.Path) == 1 && c.Path[0] == "updated_at"
}

// Conflicts returns the conflicts to show the user: those on notes'
// fields, newest first, without those on updated_at.
func (a *App) Conflicts(ctx context.Context) ([]drivesync.Conflict, error) {
	all, err := a.Engine.Conflicts(ctx, drivesync.ConflictFilter{Table: "notes"})
	shown := all[:0]
	for _, c := range all {
		if !bookkeeping(c) {
			shown = append(shown, c)
		}
	}
	return shown, err
}

// Resolve resolves conflict id as the user chose, and dismisses the
// unshown updated_at conflicts of the same note with it.
func (a *App) Resolve(ctx context.Context, id int64, keep drivesync.Resolution) error {
	all, err := a.Engine.Conflicts(ctx, drivesync.ConflictFilter{Table: "notes"})
	if err != nil {
		return err
	}
	if err := a.Engine.ResolveConflict(ctx, id, keep); err != nil {
		return err
	}
	record := ""
	for _, c := range all {
		if c.ID == id {
			record = c.Record
		}
	}
	for _, c := range all {
		if c.Record == record && bookkeeping(c) {
			if err := a.Engine.ResolveConflict(ctx, c.ID, drivesync.KeepWinner); err != nil {
				return err
			}
		}
	}
	return nil
}

// Purge deletes the row; the next sync deletes it on the other devices.
func (a *App) Purge(ctx context.Context, id string) error {
	id, err := a.ID(ctx, id)
	if err != nil {
		return err
	}
	_, err = a.DB.ExecContext(ctx, `DELETE FROM notes WHERE id = ?`, id)
	return err
}

// Note is a note as lists show it.
type Note struct{ ID, Text, UpdatedAt string }

// List returns the notes that are not soft-deleted, oldest change first.
func (a *App) List(ctx context.Context) ([]Note, error) {
	rows, err := a.DB.QueryContext(ctx, `SELECT id, coalesce(content ->> '$.text', ''), coalesce(updated_at, '')
FROM notes WHERE content ->> '$.deleted_at' IS NULL
ORDER BY updated_at, content ->> '$.text', id`)
	if err != nil {
		return nil, err
	}
	return scanNotes(rows)
}

func scanNotes(rows *sql.Rows) ([]Note, error) {
	defer rows.Close()
	var notes []Note
	for rows.Next() {
		var n Note
		if err := rows.Scan(&n.ID, &n.Text, &n.UpdatedAt); err != nil {
			return nil, err
		}
		notes = append(notes, n)
	}
	return notes, rows.Err()
}

// Key is a note's place in the order Older and Newer list notes in: the
// newest change first, and among notes changed in the same second the
// greater id first; notes without updated_at (NULL) come last. A page of
// notes is named by the key of its first or last note, so that notes
// added or deleted before it do not shift it, as counting from the start
// would.
type Key struct {
	UpdatedAt sql.NullString
	ID        string
}

// Page is a page of notes in the newest-first order (see Key).
type Page struct {
	Notes []Note
	Keys  []Key // Keys[i] is Notes[i]'s place in the order
	// More says that more notes lie beyond the page, on the side it was
	// read toward: older ones after a page from Older, newer ones before
	// a page from Newer.
	More bool
}

// Older returns up to limit notes that are not soft-deleted, newest
// change first, from those after after in that order (from the newest
// if after is nil).
func (a *App) Older(ctx context.Context, after *Key, limit int) (Page, error) {
	r := pageReader{db: a.DB, limit: limit}
	switch {
	case after == nil: // NULLs sort first, so last backward
		r.read(ctx, `ORDER BY updated_at DESC, id DESC`)
	case after.UpdatedAt.Valid:
		r.read(ctx, `AND (updated_at, id) < (?, ?) ORDER BY updated_at DESC, id DESC`, after.UpdatedAt.String, after.ID)
		r.read(ctx, `AND updated_at IS NULL ORDER BY id DESC`)
	default:
		r.read(ctx, `AND updated_at IS NULL AND id < ? ORDER BY id DESC`, after.ID)
	}
	return r.done()
}

// Newer returns the up to limit notes that are not soft-deleted and come
// just before before in the newest-first order, in that order.
func (a *App) Newer(ctx context.Context, before Key, limit int) (Page, error) {
	r := pageReader{db: a.DB, limit: limit}
	if before.UpdatedAt.Valid {
		r.read(ctx, `AND (updated_at, id) > (?, ?) ORDER BY updated_at, id`, before.UpdatedAt.String, before.ID)
	} else {
		r.read(ctx, `AND updated_at IS NULL AND id > ? ORDER BY id`, before.ID)
		r.read(ctx, `AND updated_at IS NOT NULL ORDER BY updated_at, id`)
	}
	p, err := r.done()
	slices.Reverse(p.Notes)
	slices.Reverse(p.Keys)
	return p, err
}

// pageReader gathers a page from the stretches of the order that Older
// and Newer read in turn, each an index range, reading one note more
// than the page holds to tell whether more follow.
type pageReader struct {
	db    *sql.DB
	limit int
	page  Page
	err   error
}

// read appends the notes that the query's tail (after the condition that
// a note is not deleted) picks, until the page is full.
func (r *pageReader) read(ctx context.Context, tail string, args ...any) {
	want := r.limit + 1 - len(r.page.Notes)
	if r.err != nil || want <= 0 {
		return
	}
	rows, err := r.db.QueryContext(ctx, `SELECT id, coalesce(content ->> '$.text', ''), updated_at
FROM notes WHERE content ->> '$.deleted_at' IS NULL `+tail+` LIMIT `+strconv.Itoa(want), args...)
	if err != nil {
		r.err = err
		return
	}
	defer rows.Close()
	for rows.Next() {
		var n Note
		var k Key
		if err := rows.Scan(&k.ID, &n.Text, &k.UpdatedAt); err != nil {
			r.err = err
			return
		}
		n.ID, n.UpdatedAt = k.ID, k.UpdatedAt.String
		r.page.Notes, r.page.Keys = append(r.page.Notes, n), append(r.page.Keys, k)
	}
	r.err = rows.Err()
}

func (r *pageReader) done() (Page, error) {
	p := r.page
	if p.More = len(p.Notes) > r.limit; p.More {
		p.Notes, p.Keys = p.Notes[:r.limit], p.Keys[:r.limit]
	}
	return p, r.err
}

// Summary says in one line what a sync did.
func Summary(r drivesync.Report) string {
	var parts []string
	if r.Recovered != "" {
		// An earlier sync failed after saving its file for upload; this
		// one finished sending it.
		parts = append(parts, "sent the changes of a sync that failed")
	}
	switch {
	case len(r.Downloaded) > 0:
		parts = append(parts, fmt.Sprintf("received %s from %s", Plural(r.ChangesReceived, "change"), Plural(len(r.Downloaded), "file")))
	case r.ChangesReceived > 0: // pulled from a sync server
		parts = append(parts, "received "+Plural(r.ChangesReceived, "change"))
	}
	if r.ChangesSent > 0 { // through a sync server, Uploaded names no file
		parts = append(parts, "sent "+Plural(r.ChangesSent, "change"))
	}
	if len(r.Rejected) > 0 {
		parts = append(parts, "rejected "+Plural(len(r.Rejected), "file"))
	}
	if len(parts) == 0 {
		return "up to date"
	}
	return strings.Join(parts, ", ")
}

// Plural says n nouns.
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
