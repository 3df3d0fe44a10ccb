// Command notes is a small notes app whose SQLite database syncs across
// devices with drivesync, through a shared folder (Dropbox, iCloud Drive,
// Syncthing, a network share) or, with -drive, through the app's hidden
// app-data folder in the user's Google Drive.
//
// The app reads and writes its notes table with plain SQL. drivesync.Open
// installs triggers that capture every write; Engine.Sync exchanges the
// captured changes with the other devices. Run "notes -h" for usage, or
// "notes demo" to watch two devices sync. drive.go has the Google sign-in.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/oauth2"
	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
)

// schema is the app's synced table: drivesync needs id TEXT PRIMARY KEY and
// the record as a JSON object in content. updated_at is a projection: the
// engine fills it from content's "updated_at" when it writes a synced row,
// and the app keeps it in step when it writes, so it can be indexed and sorted.
const schema = `CREATE TABLE IF NOT EXISTS notes (
	id TEXT PRIMARY KEY,
	content JSONB NOT NULL,
	updated_at TEXT
)`

const usage = `usage: notes [-db PATH] [-remote DIR | -drive [-credentials JSON] | -server URL [-token T] [-store NAME]] <command> [args]
  add TEXT            add a note, print its id
  edit ID TEXT        change a note's text
  delete ID           soft-delete a note
  purge ID            physically delete a note
  list                list notes that are not deleted
  sync                sync with the remote folder, Google Drive or the server
  snapshot            sync, then write a snapshot and delete old files
  join                merge with the store the remote holds (after a
                      "not the store" error: another account or folder)
  fresh               upload this database as a new store (after a
                      "not the store" error: the remote was emptied)
  signin              (-drive) sign in to Google again
  signout             (-drive) delete the saved Google sign-in
notes demo            two devices syncing through a temp folder
-db defaults to $NOTES_DB or notes.db, -remote to $NOTES_REMOTE.
-drive syncs through your Google Drive instead of a folder. It needs the
app's OAuth client of type Desktop app: -credentials JSON, default
$NOTES_GOOGLE_CREDENTIALS (see the README, Google Drive). The first use
opens your browser to sign in.
-server syncs through a drivesync-server (see the README, Sync server),
signing in with -token (default $NOTES_TOKEN), in its store -store
(default notes).
`

// options are the command line's settings.
type options struct {
	dbPath      string
	remoteDir   string    // -remote: the shared folder
	drive       bool      // -drive: Google Drive instead of a folder
	credentials string    // -credentials: the OAuth client JSON, for -drive
	server      string    // -server: a sync server's URL
	token       string    // -token: the server's token for this user
	store       string    // -store: the store's name on the server
	prompt      io.Writer // where sign-in talks to the user
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "notes:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	flags := flag.NewFlagSet("notes", flag.ContinueOnError)
	flags.SetOutput(stderr)
	flags.Usage = func() { fmt.Fprint(stderr, usage) }
	opts := options{prompt: stderr}
	flags.StringVar(&opts.dbPath, "db", envOr("NOTES_DB", "notes.db"), "database file")
	flags.StringVar(&opts.remoteDir, "remote", os.Getenv("NOTES_REMOTE"), "shared folder to sync through")
	flags.BoolVar(&opts.drive, "drive", false, "sync through Google Drive")
	flags.StringVar(&opts.credentials, "credentials", os.Getenv("NOTES_GOOGLE_CREDENTIALS"), "OAuth client JSON, for -drive")
	flags.StringVar(&opts.server, "server", os.Getenv("NOTES_SERVER"), "sync server URL, such as http://127.0.0.1:8080")
	flags.StringVar(&opts.token, "token", os.Getenv("NOTES_TOKEN"), "token for -server")
	flags.StringVar(&opts.store, "store", "notes", "store name on the server, for -server")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	// $NOTES_REMOTE is ignored with -drive; an explicit -remote is a mistake.
	remoteFlag := false
	flags.Visit(func(f *flag.Flag) { remoteFlag = remoteFlag || f.Name == "remote" })
	if opts.drive && remoteFlag {
		return errors.New("-drive and -remote are exclusive: sync through Google Drive or through a shared folder, not both")
	}
	if opts.server != "" && (opts.drive || remoteFlag) {
		return errors.New("-server syncs through a sync server: leave out -remote and -drive")
	}
	if opts.server != "" && opts.token == "" {
		return errors.New("-server needs -token (or $NOTES_TOKEN): a token from the server's tokens file")
	}
	cmd, args := flags.Arg(0), flags.Args()[min(1, flags.NArg()):]
	want := map[string]int{"add": 1, "edit": 2, "delete": 1, "purge": 1, "list": 0, "sync": 0, "snapshot": 0, "join": 0, "fresh": 0, "demo": 0, "signin": 0, "signout": 0}
	n, ok := want[cmd]
	switch {
	case cmd == "":
		flags.Usage()
		return errors.New("no command given")
	case !ok:
		return fmt.Errorf("unknown command %q (run notes -h for help)", cmd)
	case len(args) != n:
		return fmt.Errorf("%s takes %d argument(s), got %d (run notes -h for help)", cmd, n, len(args))
	case cmd == "demo":
		return demo(ctx, stdout)
	case (cmd == "signin" || cmd == "signout") && !opts.drive:
		return fmt.Errorf("%s is about Google Drive: run notes -drive %s", cmd, cmd)
	case cmd == "signin":
		return signInAgain(ctx, opts)
	case cmd == "signout":
		return signOut(stdout)
	case !opts.drive && opts.remoteDir == "" && opts.server == "":
		return errors.New("no remote: pass -remote DIR or set NOTES_REMOTE to the folder your devices share, -drive to sync through Google Drive, or -server URL to sync through a sync server")
	}

	var link func(*drivesync.Config)
	if opts.server != "" {
		srv := httpremote.New(opts.server, opts.token, httpremote.Options{Store: opts.store})
		link = func(c *drivesync.Config) { c.Server = srv }
	} else {
		remote, err := openRemote(ctx, opts)
		if err != nil {
			return driveHelp(err)
		}
		link = func(c *drivesync.Config) { c.Remote = remote }
	}
	a, err := openApp(ctx, opts.dbPath, link, "")
	if err != nil {
		return err
	}
	defer a.Close()
	switch cmd {
	case "add":
		id, err := a.add(ctx, args[0])
		if err == nil {
			fmt.Fprintln(stdout, id)
		}
		return err
	case "edit":
		return a.update(ctx, args[0], "text", args[1])
	case "delete":
		return a.update(ctx, args[0], "deleted_at", now())
	case "purge":
		return a.purge(ctx, args[0])
	case "list":
		notes, err := a.list(ctx)
		for _, n := range notes {
			fmt.Fprintf(stdout, "%s  %s  %s\n", n.ID, n.UpdatedAt, n.Text)
		}
		return err
	case "snapshot":
		r, err := a.engine.Snapshot(ctx)
		printReport(stdout, r)
		return driveHelp(err)
	case "join":
		if err := a.engine.JoinRemote(ctx); err != nil {
			return driveHelp(err)
		}
		fmt.Fprintln(stdout, "joined the remote's store: the next sync merges it with this database")
		return nil
	case "fresh":
		r, err := a.engine.StartFresh(ctx)
		printReport(stdout, r)
		return driveHelp(err)
	default: // sync
		r, err := a.engine.Sync(ctx)
		printReport(stdout, r)
		if errors.Is(err, drivesync.ErrRemoteChanged) {
			return fmt.Errorf("%w\n(run \"notes join\" to merge with the remote's store, or \"notes fresh\" if the remote was emptied)", err)
		}
		return driveHelp(err)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// now is the time stamp notes carry: RFC 3339 in UTC.
func now() string { return time.Now().UTC().Format(time.RFC3339) }

// app is one device: its database and the engine that syncs it.
type app struct {
	db     *sql.DB
	engine *drivesync.Engine
}

// openRemote returns the remote the devices share: the folder of -remote,
// or with -drive the app-data folder in the user's Google Drive, signing
// in first if no sign-in is saved. With a saved sign-in it needs no
// network: the local commands work offline, and sync finds out whether
// Drive takes the sign-in.
func openRemote(ctx context.Context, opts options) (drivesync.Remote, error) {
	if !opts.drive {
		return drivesync.NewFolderRemote(opts.remoteDir)
	}
	cfg, err := oauthConfig(opts.credentials)
	if err != nil {
		return nil, err
	}
	store, err := tokenStore()
	if err != nil {
		return nil, err
	}
	tok, err := store.Load(ctx)
	if errors.Is(err, fs.ErrNotExist) {
		tok, err = signIn(ctx, cfg, store, opts.prompt, false)
	}
	if err != nil {
		return nil, err
	}
	// The token source refreshes the access token when it expires and
	// saves each new token, so that the sign-in lasts across runs.
	client := oauth2.NewClient(ctx, drivesync.SavingTokenSource(ctx, cfg, tok, store))
	svc, err := newDriveService(ctx, client)
	if err != nil {
		return nil, err
	}
	// The zero DriveOptions keep the files in the app-data folder, the
	// only place the scope ScopeAppData lets the app see.
	return drivesync.NewDriveRemote(ctx, svc, drivesync.DriveOptions{})
}

// openApp opens the database, creates the notes table and opens the sync
// engine on it. The engine must be opened before the app writes: Open
// installs the triggers that capture writes. deviceID "" lets the engine
// pick and store a random id.
// link sets the Config's Remote or Server.
func openApp(ctx context.Context, dbPath string, link func(*drivesync.Config), deviceID string) (*app, error) {
	dsn := "file:" + dbPath + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", dbPath, err)
	}
	cfg := drivesync.Config{Tables: []drivesync.Table{{Name: "notes"}}, DeviceID: deviceID}
	link(&cfg)
	engine, err := drivesync.Open(ctx, db, cfg)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &app{db: db, engine: engine}, nil
}

func (a *app) Close() error {
	a.engine.Close()
	return a.db.Close()
}

// add inserts a note and returns its id. Ids must be unique across devices,
// hence UUIDs.
func (a *app) add(ctx context.Context, text string) (string, error) {
	id, ts := uuid.NewString(), now()
	content, err := json.Marshal(map[string]any{"text": text, "updated_at": ts, "deleted_at": nil})
	if err != nil {
		return "", err
	}
	// content is passed as a string: jsonb() would read a []byte as JSONB.
	_, err = a.db.ExecContext(ctx, `INSERT INTO notes (id, content, updated_at) VALUES (?, jsonb(?), ?)`, id, string(content), ts)
	return id, err
}

// update sets one field of a note's content, and updated_at, keeping every
// other field as it is (including fields a newer app version may have added).
func (a *app) update(ctx context.Context, id, field string, value any) error {
	tx, err := a.db.BeginTx(ctx, nil) // _txlock=immediate: takes the write lock now
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
	ts := now()
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

// purge deletes the row; the next sync deletes it on the other devices.
func (a *app) purge(ctx context.Context, id string) error {
	res, err := a.db.ExecContext(ctx, `DELETE FROM notes WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("no note with id %s", id)
	}
	return nil
}

type note struct{ ID, Text, UpdatedAt string }

// list returns the notes that are not soft-deleted, oldest change first.
func (a *app) list(ctx context.Context) ([]note, error) {
	rows, err := a.db.QueryContext(ctx, `SELECT id, coalesce(content ->> '$.text', ''), coalesce(updated_at, '')
FROM notes WHERE content ->> '$.deleted_at' IS NULL
ORDER BY updated_at, content ->> '$.text', id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var notes []note
	for rows.Next() {
		var n note
		if err := rows.Scan(&n.ID, &n.Text, &n.UpdatedAt); err != nil {
			return nil, err
		}
		notes = append(notes, n)
	}
	return notes, rows.Err()
}

// printReport prints what a sync did, file names and problems included.
func printReport(w io.Writer, r drivesync.Report) {
	fmt.Fprintln(w, summary(r))
	if r.Recovered != "" {
		fmt.Fprintln(w, "uploaded", r.Recovered, "(left by a sync that failed)")
	}
	if r.Uploaded != "" {
		fmt.Fprintln(w, "uploaded", r.Uploaded)
	}
	if r.Snapshot != "" {
		fmt.Fprintln(w, "wrote snapshot", r.Snapshot)
	}
	if r.Deleted > 0 {
		fmt.Fprintf(w, "deleted %s older than the retention\n", plural(r.Deleted, "old file"))
	}
	for _, f := range r.Rejected {
		fmt.Fprintf(w, "rejected %s: %v\n", f.Name, f.Err)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "not sent %s/%s: %v\n", s.Table, s.Record, s.Err)
	}
}

// summary says in one line what a sync did.
func summary(r drivesync.Report) string {
	var parts []string
	if r.Recovered != "" {
		// An earlier sync failed after saving its file for upload; this
		// one finished sending it.
		parts = append(parts, "sent the changes of a sync that failed")
	}
	switch {
	case len(r.Downloaded) > 0:
		parts = append(parts, fmt.Sprintf("received %s from %s", plural(r.ChangesReceived, "change"), plural(len(r.Downloaded), "file")))
	case r.ChangesReceived > 0: // pulled from a sync server
		parts = append(parts, "received "+plural(r.ChangesReceived, "change"))
	}
	if r.Uploaded != "" {
		parts = append(parts, "sent "+plural(r.ChangesSent, "change"))
	}
	if len(r.Rejected) > 0 {
		parts = append(parts, "rejected "+plural(len(r.Rejected), "file"))
	}
	if len(parts) == 0 {
		return "up to date"
	}
	return strings.Join(parts, ", ")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// demo runs two devices, a laptop and a desktop, each with its own database,
// syncing through a shared folder in a temp dir.
func demo(ctx context.Context, w io.Writer) error {
	dir, err := os.MkdirTemp("", "notes-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o755); err != nil {
		return err
	}
	var devs [2]*device
	for i, name := range []string{"laptop", "desktop"} {
		remote, err := openRemote(ctx, options{remoteDir: shared})
		if err != nil {
			return err
		}
		a, err := openApp(ctx, filepath.Join(dir, name+".db"), func(c *drivesync.Config) { c.Remote = remote }, name)
		if err != nil {
			return err
		}
		defer a.Close()
		devs[i] = &device{name: name, app: a}
	}
	laptop, desktop := devs[0], devs[1]
	d := &demoRun{ctx: ctx, w: w}

	d.step("laptop adds two notes and syncs")
	milk := d.add(laptop, "buy milk")
	mom := d.add(laptop, "call mom")
	d.sync(laptop)

	d.step("desktop syncs and lists")
	d.sync(desktop)
	d.show(desktop)

	d.step("desktop edits one note while laptop soft-deletes the other; laptop, desktop, laptop sync")
	d.edit(desktop, milk, "buy oat milk")
	d.softDelete(laptop, mom)
	d.sync(laptop)
	d.sync(desktop)
	d.sync(laptop)
	d.show(laptop)
	d.show(desktop)

	d.step("both edit the same note before syncing; laptop syncs first, then desktop, then laptop")
	d.edit(laptop, milk, "buy oat milk and eggs")
	d.edit(desktop, milk, "buy almond milk")
	d.sync(laptop)
	d.sync(desktop)
	d.sync(laptop)
	d.show(laptop)
	d.show(desktop)
	if d.err != nil {
		return d.err
	}

	var lists [2][]note
	for i, dev := range devs {
		if lists[i], err = dev.list(ctx); err != nil {
			return err
		}
	}
	desktopWon := len(lists[0]) == 1 && lists[0][0].Text == "buy almond milk"
	if desktopWon {
		fmt.Fprintln(w, "\ndesktop's edit wins on both devices: the device that syncs later wins")
	}
	if !slices.Equal(lists[0], lists[1]) {
		fmt.Fprintln(w, "both devices agree: no")
		return errors.New("the devices did not converge")
	}
	fmt.Fprintln(w, "both devices agree: yes")
	if !desktopWon {
		return errors.New("the edit synced last did not win")
	}
	return nil
}

type device struct {
	name string
	*app
}

// demoRun prints the demo's steps. After the first error every step does
// nothing, and demo returns that error.
type demoRun struct {
	ctx context.Context
	w   io.Writer
	n   int
	err error
}

func (d *demoRun) step(what string) {
	d.n++
	fmt.Fprintf(d.w, "\n%d. %s\n", d.n, what)
}

func (d *demoRun) add(dev *device, text string) (id string) {
	if d.err == nil {
		id, d.err = dev.add(d.ctx, text)
		fmt.Fprintf(d.w, "%s adds %s %q\n", dev.name, short(id), text)
	}
	return id
}

func (d *demoRun) edit(dev *device, id, text string) {
	if d.err == nil {
		d.err = dev.update(d.ctx, id, "text", text)
		fmt.Fprintf(d.w, "%s edits %s to %q\n", dev.name, short(id), text)
	}
}

func (d *demoRun) softDelete(dev *device, id string) {
	if d.err == nil {
		d.err = dev.update(d.ctx, id, "deleted_at", now())
		fmt.Fprintf(d.w, "%s deletes %s\n", dev.name, short(id))
	}
}

func (d *demoRun) sync(dev *device) {
	if d.err == nil {
		var r drivesync.Report
		r, d.err = dev.engine.Sync(d.ctx)
		fmt.Fprintf(d.w, "%s syncs: %s\n", dev.name, summary(r))
	}
}

func (d *demoRun) show(dev *device) {
	if d.err != nil {
		return
	}
	var notes []note
	notes, d.err = dev.list(d.ctx)
	fmt.Fprintf(d.w, "%s lists %s:\n", dev.name, plural(len(notes), "note"))
	for _, n := range notes {
		fmt.Fprintf(d.w, "  %s  %s\n", short(n.ID), n.Text)
	}
}

func short(id string) string { return id[:min(8, len(id))] }
