// Command dotart is a small local-first dot-art app: 16×16 pictures that
// people pass to each other as QR payloads, each edit a new generation.
// One user's devices keep its database in sync with drivesync through a
// shared folder.
//
// Its three tables are ordinary tables with foreign keys: dots holds every
// generation of every picture (append-only: a generation never changes),
// dot_instances points at the generation a device holds (current_gen only
// moves forward: MergeMax), and action_logs records what was shown and
// scanned (insert-only). Run "dotart -h" for usage, or "dotart demo" to
// watch three devices play the app's scenarios.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
)

// schema is the app's data model, as the app defines it; drivesync syncs
// it as it is.
const schema = `
CREATE TABLE IF NOT EXISTS dots (
	uuid          TEXT NOT NULL,
	gen           INTEGER NOT NULL CHECK (gen >= 0),
	pixel_data    BLOB NOT NULL CHECK (length(pixel_data) = 512),
	lineage_data  BLOB NOT NULL,
	lineage_count INTEGER NOT NULL CHECK (lineage_count BETWEEN 0 AND 20),
	crc32_u32     INTEGER NOT NULL,
	created_at    INTEGER NOT NULL,
	PRIMARY KEY (uuid, gen)
);
CREATE TABLE IF NOT EXISTS dot_instances (
	uuid        TEXT PRIMARY KEY,
	current_gen INTEGER NOT NULL,
	is_owner    BOOLEAN NOT NULL,
	title       TEXT CHECK (length(title) <= 64),
	acquired_at INTEGER NOT NULL,
	deleted_at  INTEGER,
	FOREIGN KEY (uuid, current_gen) REFERENCES dots(uuid, gen)
);
CREATE TABLE IF NOT EXISTS action_logs (
	id          TEXT PRIMARY KEY,
	dot_uuid    TEXT NOT NULL,
	dot_gen     INTEGER NOT NULL,
	action_type TEXT NOT NULL CHECK (action_type IN ('QR_SHOWN', 'QR_SCANNED')),
	timestamp   INTEGER NOT NULL,
	FOREIGN KEY (dot_uuid, dot_gen) REFERENCES dots(uuid, gen)
);
CREATE INDEX IF NOT EXISTS dot_instances_acquired ON dot_instances (acquired_at);`

// tables are the synced tables: the dots and the logs never change once
// written, and a device's pointer to a picture only moves to a newer
// generation.
var tables = []drivesync.Table{
	{Name: "dots", AppendOnly: true},
	{Name: "dot_instances", Merge: map[string]drivesync.MergeRule{"current_gen": drivesync.MergeMax}},
	{Name: "action_logs", AppendOnly: true},
}

const usage = `usage: dotart [-db PATH] [-remote DIR] <command> [args]
  new [TITLE]         draw a new picture (generation 0), print its uuid
  edit UUID           save an edit: a new generation
  show UUID           show the picture's QR payload (logs QR_SHOWN)
  scan PAYLOAD        take a picture from another person's QR payload
  delete UUID         delete the picture from this user's collection
  list                list the pictures held
  sync                sync with the remote folder
dotart demo           three devices of one user playing the scenarios
-db defaults to $DOTART_DB or dotart.db, -remote to $DOTART_REMOTE.
`

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "dotart:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	flags := flag.NewFlagSet("dotart", flag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() { fmt.Fprint(stderr, usage) }
	dbPath := flags.String("db", envOr("DOTART_DB", "dotart.db"), "database file")
	remoteDir := flags.String("remote", os.Getenv("DOTART_REMOTE"), "shared folder to sync through")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cmd, args := flags.Arg(0), flags.Args()[min(1, flags.NArg()):]
	want := map[string][2]int{"new": {0, 1}, "edit": {1, 1}, "show": {1, 1}, "scan": {1, 1}, "delete": {1, 1}, "list": {0, 0}, "sync": {0, 0}, "demo": {0, 0}}
	n, ok := want[cmd]
	switch {
	case cmd == "":
		flags.Usage()
		return errors.New("no command given")
	case !ok:
		return fmt.Errorf("unknown command %q (run dotart -h for help)", cmd)
	case len(args) < n[0] || len(args) > n[1]:
		return fmt.Errorf("%s takes %d to %d argument(s), got %d (run dotart -h for help)", cmd, n[0], n[1], len(args))
	case cmd == "demo":
		return demo(ctx, stdout)
	case *remoteDir == "":
		return errors.New("no remote: pass -remote DIR or set DOTART_REMOTE to the folder your devices share")
	}
	remote, err := drivesync.NewFolderRemote(*remoteDir)
	if err != nil {
		return err
	}
	a, err := openApp(ctx, *dbPath, remote, "")
	if err != nil {
		return err
	}
	defer a.Close()
	switch cmd {
	case "new":
		id, err := a.create(ctx, strings.Join(args, " "))
		if err == nil {
			fmt.Fprintln(stdout, id)
		}
		return err
	case "edit":
		gen, err := a.edit(ctx, args[0])
		if err == nil {
			fmt.Fprintf(stdout, "%s is at generation %d\n", args[0], gen)
		}
		return err
	case "show":
		payload, err := a.show(ctx, args[0])
		if err == nil {
			fmt.Fprintln(stdout, payload)
		}
		return err
	case "scan":
		result, err := a.scan(ctx, args[0])
		if err == nil {
			fmt.Fprintln(stdout, result)
		}
		return err
	case "delete":
		return a.remove(ctx, args[0])
	case "list":
		items, err := a.list(ctx)
		for _, it := range items {
			fmt.Fprintln(stdout, it)
		}
		return err
	default: // sync
		r, err := a.engine.Sync(ctx)
		printReport(stdout, r)
		return err
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// app is one device: its database and the engine that syncs it.
type app struct {
	db     *sql.DB
	engine *drivesync.Engine
	now    func() time.Time
}

// openApp opens (or creates) a device's database with foreign keys on,
// and the engine that syncs it through remote.
func openApp(ctx context.Context, path string, remote drivesync.Remote, device string) (*app, error) {
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, err
	}
	eng, err := drivesync.Open(ctx, db, drivesync.Config{Remote: remote, Tables: tables, DeviceID: device})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &app{db: db, engine: eng, now: time.Now}, nil
}

func (a *app) Close() error {
	a.engine.Close()
	return a.db.Close()
}

// dot is one generation of a picture, as its QR payload carries it.
type dot struct {
	uuid    string
	gen     int64
	pixels  []byte // 512 bytes: 16×16 RGBA5551
	lineage []byte // 16 bytes per ancestor generation's picture, at most 20
}

func (d dot) crc() uint32 {
	return crc32.ChecksumIEEE(append(append([]byte(d.uuid+"|"+strconv.FormatInt(d.gen, 10)+"|"), d.pixels...), d.lineage...))
}

// payload is the QR wire format: v3|uuid|gen|pixels|lineage|crc.
func (d dot) payload() string {
	b64 := base64.RawURLEncoding.EncodeToString
	return fmt.Sprintf("v3|%s|%d|%s|%s|%d", d.uuid, d.gen, b64(d.pixels), b64(d.lineage), d.crc())
}

// parsePayload reads a QR payload, checking its form and checksum.
func parsePayload(s string) (dot, error) {
	parts := strings.Split(s, "|")
	if len(parts) != 6 || parts[0] != "v3" {
		return dot{}, errors.New("not a v3 dot-art payload (v3|uuid|gen|pixels|lineage|crc)")
	}
	var d dot
	var err error
	if _, err = uuid.Parse(parts[1]); err != nil {
		return dot{}, fmt.Errorf("payload uuid: %w", err)
	}
	d.uuid = parts[1]
	if d.gen, err = strconv.ParseInt(parts[2], 10, 64); err != nil || d.gen < 0 {
		return dot{}, fmt.Errorf("payload generation %q is not a number >= 0", parts[2])
	}
	if d.pixels, err = base64.RawURLEncoding.DecodeString(parts[3]); err != nil || len(d.pixels) != 512 {
		return dot{}, errors.New("payload pixels are not 512 bytes")
	}
	if d.lineage, err = base64.RawURLEncoding.DecodeString(parts[4]); err != nil || len(d.lineage)%16 != 0 || len(d.lineage) > 16*20 {
		return dot{}, errors.New("payload lineage is not whole 16-byte entries, at most 20")
	}
	crc, err := strconv.ParseUint(parts[5], 10, 32)
	if err != nil || uint32(crc) != d.crc() {
		return dot{}, errors.New("payload checksum does not match: the payload is damaged")
	}
	return d, nil
}

func (a *app) insertDot(ctx context.Context, tx *sql.Tx, d dot) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO dots VALUES (?, ?, ?, ?, ?, ?, ?)`,
		d.uuid, d.gen, d.pixels, d.lineage, len(d.lineage)/16, int64(d.crc()), a.now().UnixMilli())
	return err
}

func (a *app) logAction(ctx context.Context, tx *sql.Tx, action, id string, gen int64) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO action_logs VALUES (?, ?, ?, ?, ?)`, uuid.NewString(), id, gen, action, a.now().UnixMilli())
	return err
}

// inTx runs fn in one transaction of the app's.
func (a *app) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// create draws a new picture: generation 0 of a new uuid.
func (a *app) create(ctx context.Context, title string) (string, error) {
	d := dot{uuid: uuid.NewString(), pixels: make([]byte, 512), lineage: []byte{}}
	rand.Read(d.pixels)
	var t any
	if title != "" {
		t = title
	}
	return d.uuid, a.inTx(ctx, func(tx *sql.Tx) error {
		if err := a.insertDot(ctx, tx, d); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO dot_instances VALUES (?, 0, 1, ?, ?, NULL)`, d.uuid, t, a.now().UnixMilli())
		return err
	})
}

// current returns the generation of the picture this device holds.
func (a *app) current(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id string) (dot, error) {
	var d dot
	err := q.QueryRowContext(ctx, `SELECT d.uuid, d.gen, d.pixel_data, d.lineage_data FROM dot_instances i
JOIN dots d ON d.uuid = i.uuid AND d.gen = i.current_gen WHERE i.uuid = ? AND i.deleted_at IS NULL`, id).Scan(&d.uuid, &d.gen, &d.pixels, &d.lineage)
	if errors.Is(err, sql.ErrNoRows) {
		return d, fmt.Errorf("no picture %s here (run dotart list)", id)
	}
	return d, err
}

// edit saves an edit of the picture: a new generation whose lineage adds
// the edited one.
func (a *app) edit(ctx context.Context, id string) (int64, error) {
	var gen int64
	return gen, a.inTx(ctx, func(tx *sql.Tx) error {
		prev, err := a.current(ctx, tx, id)
		if err != nil {
			return err
		}
		sum := crc32.ChecksumIEEE(prev.pixels)
		next := dot{uuid: id, gen: prev.gen + 1, pixels: bytes.Clone(prev.pixels)}
		// The edit: a stroke somewhere (as a user's own, unlike another
		// device's edit of the same generation).
		var stroke [3]byte
		rand.Read(stroke[:])
		next.pixels[(int(stroke[0])<<8|int(stroke[1]))%512] ^= stroke[2] | 1
		entry := make([]byte, 16)
		copy(entry, fmt.Sprintf("%08x%08x", prev.gen, sum))
		next.lineage = append(bytes.Clone(prev.lineage), entry...)
		if len(next.lineage) > 16*20 {
			next.lineage = next.lineage[16:]
		}
		if err := a.insertDot(ctx, tx, next); err != nil {
			return err
		}
		gen = next.gen
		_, err = tx.ExecContext(ctx, `UPDATE dot_instances SET current_gen = ?, is_owner = 1, acquired_at = ? WHERE uuid = ?`, next.gen, a.now().UnixMilli(), id)
		return err
	})
}

// show returns the picture's QR payload and logs that it was shown.
func (a *app) show(ctx context.Context, id string) (string, error) {
	var payload string
	return payload, a.inTx(ctx, func(tx *sql.Tx) error {
		d, err := a.current(ctx, tx, id)
		if err != nil {
			return err
		}
		payload = d.payload()
		return a.logAction(ctx, tx, "QR_SHOWN", d.uuid, d.gen)
	})
}

// errConflict is a scanned payload that differs from the generation held
// under the same uuid and gen: damaged or forged, so refused.
var errConflict = errors.New("a different picture is already held under this uuid and generation: the payload is refused")

// scan takes a picture from another person's QR payload: a generation not
// held is added (and the instance moves to it if it is newer); the same
// one again changes nothing but the log; a different picture under the
// same uuid and generation is refused.
func (a *app) scan(ctx context.Context, payload string) (string, error) {
	d, err := parsePayload(payload)
	if err != nil {
		return "", err
	}
	var result string
	return result, a.inTx(ctx, func(tx *sql.Tx) error {
		var pixels, lineage []byte
		err := tx.QueryRowContext(ctx, `SELECT pixel_data, lineage_data FROM dots WHERE uuid = ? AND gen = ?`, d.uuid, d.gen).Scan(&pixels, &lineage)
		switch {
		case err == nil && (!bytes.Equal(pixels, d.pixels) || !bytes.Equal(lineage, d.lineage)):
			return fmt.Errorf("%s generation %d: %w", d.uuid, d.gen, errConflict)
		case err == nil:
			result = "already held"
		case errors.Is(err, sql.ErrNoRows):
			if err := a.insertDot(ctx, tx, d); err != nil {
				return err
			}
			result = "added"
		default:
			return err
		}
		var cur int64
		err = tx.QueryRowContext(ctx, `SELECT current_gen FROM dot_instances WHERE uuid = ?`, d.uuid).Scan(&cur)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if _, err := tx.ExecContext(ctx, `INSERT INTO dot_instances VALUES (?, ?, 0, NULL, ?, NULL)`, d.uuid, d.gen, a.now().UnixMilli()); err != nil {
				return err
			}
		case err != nil:
			return err
		case d.gen > cur:
			if _, err := tx.ExecContext(ctx, `UPDATE dot_instances SET current_gen = ?, acquired_at = ?, deleted_at = NULL WHERE uuid = ?`, d.gen, a.now().UnixMilli(), d.uuid); err != nil {
				return err
			}
			result += ", now at this generation"
		case d.gen < cur:
			result += fmt.Sprintf(", older than generation %d held: kept as history", cur)
		}
		return a.logAction(ctx, tx, "QR_SCANNED", d.uuid, d.gen)
	})
}

// remove deletes the picture from the collection: a tombstone on the
// instance; its generations stay, for their lineage.
func (a *app) remove(ctx context.Context, id string) error {
	res, err := a.db.ExecContext(ctx, `UPDATE dot_instances SET deleted_at = ? WHERE uuid = ? AND deleted_at IS NULL`, a.now().UnixMilli(), id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("no picture %s here (run dotart list)", id)
	}
	return nil
}

// list returns the pictures held, newest first.
func (a *app) list(ctx context.Context) ([]string, error) {
	rows, err := a.db.QueryContext(ctx, `SELECT uuid, current_gen, is_owner, coalesce(title, '') FROM dot_instances
WHERE deleted_at IS NULL ORDER BY acquired_at DESC, uuid`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, title string
		var gen int64
		var owner bool
		if err := rows.Scan(&id, &gen, &owner, &title); err != nil {
			return nil, err
		}
		whose := "scanned"
		if owner {
			whose = "mine"
		}
		out = append(out, fmt.Sprintf("%s  gen %d  %s  %s", id, gen, whose, title))
	}
	return out, rows.Err()
}

func printReport(w io.Writer, r drivesync.Report) {
	fmt.Fprintf(w, "received %d change(s) in %d file(s), sent %d\n", r.ChangesReceived, len(r.Downloaded), r.ChangesSent)
	for _, u := range r.Unwritten {
		fmt.Fprintf(w, "  not written: %s %s: %v\n", u.Table, u.Record, u.Err)
	}
	for _, o := range r.Overruled {
		fmt.Fprintf(w, "  overruled: %s %s: %v\n", o.Table, o.Record, o.Err)
	}
	for _, f := range r.Rejected {
		fmt.Fprintf(w, "  skipped file %s: %v\n", f.Name, f.Err)
	}
}
