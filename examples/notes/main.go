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

	"golang.org/x/oauth2"
	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/examples/internal/notesapp"
	"github.com/drivesync/drivesync/httpremote"
)

const usage = `usage: notes [-db PATH] [-remote DIR | -drive [-credentials JSON] | -server URL [-token T] [-store NAME]] [-passphrase P] <command> [args]
  add TEXT            add a note, print its id
  edit ID TEXT        change a note's text
  delete ID           soft-delete a note
  purge ID            physically delete a note
  list                list notes that are not deleted
  sync                sync with the remote folder, Google Drive or the server
  watch               sync by itself (after changes, every minute, and when
                      you press Enter) until Ctrl-C
  status              what waits, how the last sync went, the remote
  conflicts           list values that concurrent edits overwrote here
  resolve ID mine|theirs
                      bring a conflict's overwritten value back (mine) or
                      dismiss it (theirs)
  snapshot            sync, then write a snapshot and delete old files
  join                merge with the store the remote holds (after a
                      "not the store" error: another account or folder)
  fresh               upload this database as a new store (after a
                      "not the store" error: the remote was emptied)
  signin              (-drive) sign in to Google again
  signout             (-drive) delete the saved Google sign-in
notes demo            two devices syncing through a temp folder
A note's ID may be given by its first characters, as the demo shows them.
add, edit, delete, purge and list work without a remote.
-db defaults to $NOTES_DB or notes.db, -remote to $NOTES_REMOTE. Give
one remote, -remote, -drive or -server: notes refuses two, whether from
flags or variables.
-passphrase (default $NOTES_PASSPHRASE) encrypts everything notes
uploads; every device of the store needs the same passphrase.
-drive syncs through your Google Drive instead of a folder. It needs the
app's OAuth client of type Desktop app: -credentials JSON, default
$NOTES_GOOGLE_CREDENTIALS (see the README, Google Drive). The first use
opens your browser to sign in.
-server (default $NOTES_SERVER) syncs through a drivesync-server (see
the README, Sync server), signing in with -token (default $NOTES_TOKEN),
in its store -store (default notes).
`

// options are the command line's settings.
type options struct {
	dbPath         string
	remoteDir      string    // -remote: the shared folder
	drive          bool      // -drive: Google Drive instead of a folder
	credentials    string    // -credentials: the OAuth client JSON, for -drive
	server         string    // -server: a sync server's URL
	token          string    // -token: the server's token for this user
	store          string    // -store: the store's name on the server
	passphrase     string    // -passphrase: encrypts what is uploaded
	passphraseFrom string    // "-passphrase" or "$NOTES_PASSPHRASE", for messages
	prompt         io.Writer // where sign-in talks to the user
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
	flags.StringVar(&opts.passphrase, "passphrase", os.Getenv("NOTES_PASSPHRASE"), "encrypt the store with this passphrase")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := oneRemote(flags); err != nil {
		return err
	}
	opts.passphraseFrom = "$NOTES_PASSPHRASE"
	flags.Visit(func(f *flag.Flag) {
		if f.Name == "passphrase" {
			opts.passphraseFrom = "-passphrase"
		}
	})
	if opts.server != "" && opts.token == "" {
		return errors.New("-server needs -token (or $NOTES_TOKEN): a token from the server's tokens file")
	}
	cmd, args := flags.Arg(0), flags.Args()[min(1, flags.NArg()):]
	want := map[string]int{"add": 1, "edit": 2, "delete": 1, "purge": 1, "list": 0, "sync": 0, "watch": 0, "status": 0, "conflicts": 0, "resolve": 2,
		"snapshot": 0, "join": 0, "fresh": 0, "demo": 0, "signin": 0, "signout": 0}
	local := map[string]bool{"add": true, "edit": true, "delete": true, "purge": true, "list": true}
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
	case !opts.drive && opts.remoteDir == "" && opts.server == "" && !local[cmd]:
		return errors.New("no remote: pass -remote DIR or set NOTES_REMOTE to the folder your devices share, -drive to sync through Google Drive, or -server URL to sync through a sync server")
	}

	cfg := drivesync.Config{}
	if opts.passphrase != "" {
		cfg.Encryption = drivesync.Passphrase(opts.passphrase)
	}
	switch {
	case local[cmd]:
		// The notes alone: no remote needed, and none opened (a Drive
		// sign-in would be asked for). The next sync sends the changes.
	case opts.server != "":
		cfg.Server = httpremote.New(opts.server, opts.token, httpremote.Options{Store: opts.store})
	default:
		remote, err := openRemote(ctx, opts)
		if err != nil {
			return remoteHelp(opts, err)
		}
		cfg.Remote = remote
	}
	bar := newProgressBar(stderr, opts.server != "")
	cfg.Progress = bar.show
	a, err := notesapp.Open(ctx, opts.dbPath, cfg)
	if err != nil {
		return err
	}
	defer a.Close()
	switch cmd {
	case "add":
		id, err := a.Add(ctx, args[0])
		if err == nil {
			fmt.Fprintln(stdout, id)
		}
		return err
	case "edit":
		return a.Update(ctx, args[0], "text", args[1])
	case "delete":
		return a.Update(ctx, args[0], "deleted_at", notesapp.Now())
	case "purge":
		return a.Purge(ctx, args[0])
	case "list":
		notes, err := a.List(ctx)
		for _, n := range notes {
			fmt.Fprintf(stdout, "%s  %s  %s\n", n.ID, n.UpdatedAt, n.Text)
		}
		return err
	case "status":
		return printStatus(ctx, stdout, a)
	case "conflicts":
		return printConflicts(ctx, stdout, a)
	case "resolve":
		return resolve(ctx, stdout, a, args[0], args[1])
	case "watch":
		return watch(ctx, stdout, a.Engine, bar, opts)
	case "join":
		if err := a.Engine.JoinRemote(ctx); err != nil {
			return advise(ctx, a.Engine, opts, err)
		}
		fmt.Fprintln(stdout, "joined the remote's store: the next sync merges it with this database")
		return nil
	}
	var r drivesync.Report
	switch cmd {
	case "snapshot":
		r, err = a.Engine.Snapshot(ctx)
	case "fresh":
		r, err = a.Engine.StartFresh(ctx)
	default: // sync
		r, err = a.Engine.Sync(ctx)
	}
	bar.done()
	if err != nil {
		// Only the error, and what to do: nothing "up to date" about it.
		return advise(ctx, a.Engine, opts, err)
	}
	printReport(stdout, r)
	return nil
}

// advise returns a sync's error err as the user of notes can act on it:
// in the terms of its flags and commands, where the library's message
// speaks to the app's developer (Config fields, JoinRemote). The result
// wraps err, for errors.Is.
func advise(ctx context.Context, e *drivesync.Engine, opts options, err error) error {
	switch {
	case errors.Is(err, drivesync.ErrWrongKey) && opts.passphrase == "":
		return &advised{"this store is encrypted: give its passphrase with -passphrase or $NOTES_PASSPHRASE. Nothing was received or sent", err}
	case errors.Is(err, drivesync.ErrWrongKey):
		drop := "leave out -passphrase"
		if opts.passphraseFrom != "-passphrase" {
			drop = "unset NOTES_PASSPHRASE"
		}
		return &advised{fmt.Sprintf("the passphrase of %s does not open this store: every device of a store uses the passphrase the store was started with, and a store started without one takes none. Nothing was received or sent. Give the store's passphrase, or if the store is not encrypted, %s", opts.passphraseFrom, drop), err}
	case errors.Is(err, drivesync.ErrRemoteChanged) && opts.server != "":
		// The server cannot tell a store it never held from one it
		// deleted; the database knows where it last synced.
		st, serr := e.Status(ctx)
		switch {
		case serr != nil:
		case strings.HasPrefix(st.Remote, "folder:"):
			dir := strings.TrimPrefix(st.Remote, "folder:")
			return &advised{fmt.Sprintf("this database syncs through the folder %s (store %s), not through the sync server %s. Nothing was received or sent. Sync it through the folder with -remote %s, or run \"notes join\" to merge it into the server's store %q", dir, st.Store, opts.server, dir, opts.store), err}
		case strings.HasPrefix(st.Remote, "drive:"):
			return &advised{fmt.Sprintf("this database syncs through Google Drive (store %s), not through the sync server %s. Nothing was received or sent. Sync it through Google Drive with -drive, or run \"notes join\" to merge it into the server's store %q", st.Store, opts.server, opts.store), err}
		}
	}
	if errors.Is(err, drivesync.ErrRemoteChanged) {
		err = fmt.Errorf("%w\n(run \"notes join\" to merge with the remote's store, or \"notes fresh\" if the remote was emptied)", err)
	}
	return remoteHelp(opts, err)
}

// advised is an error that notes shows in its own words.
type advised struct {
	msg string
	err error
}

func (a *advised) Error() string { return a.msg }
func (a *advised) Unwrap() error { return a.err }

// remoteHelp says what the user can do about the errors of the remote
// they chose that only they can fix, keeping err for errors.Is and the
// details. A folder has none: its errors say what is wrong.
func remoteHelp(opts options, err error) error {
	switch {
	case opts.drive:
		return driveHelp(err)
	case opts.server != "" && errors.Is(err, drivesync.ErrAuth):
		return fmt.Errorf("the sync server refused the token: check -token or $NOTES_TOKEN against your line in the server's tokens file (%w)", err)
	}
	return err
}

// oneRemote refuses two remotes: a database syncs through one, and a
// setting left in the environment (the README's folder and server steps
// in one shell) must not pick the remote behind the user's back. The
// message names each setting as it was given, flag or variable, and how
// to drop it.
func oneRemote(flags *flag.FlagSet) error {
	given := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { given[f.Name] = true })
	type setting struct{ shown, through, drop string }
	var set []setting
	for _, r := range []struct{ flag, env, through string }{
		{"drive", "", "Google Drive"},
		{"remote", "NOTES_REMOTE", "the folder"},
		{"server", "NOTES_SERVER", "the sync server"},
	} {
		v := flags.Lookup(r.flag).Value.String()
		switch {
		case r.flag == "drive" && v == "true":
			set = append(set, setting{"-drive", r.through, "leave out -drive"})
		case r.flag == "drive" || v == "":
		case given[r.flag]:
			set = append(set, setting{"-" + r.flag + " " + v, r.through, "leave out -" + r.flag})
		default:
			set = append(set, setting{"$" + r.env + "=" + v, r.through, "unset " + r.env})
		}
	}
	if len(set) < 2 {
		return nil
	}
	var shown, ways []string
	for i, s := range set {
		shown = append(shown, s.shown)
		var drops []string
		for j, o := range set {
			if j != i {
				drops = append(drops, o.drop)
			}
		}
		ways = append(ways, fmt.Sprintf("to sync through %s, %s", s.through, strings.Join(drops, " and ")))
	}
	return fmt.Errorf("%s and %s each choose a remote, and a database syncs through one: %s",
		strings.Join(shown[:len(shown)-1], ", "), shown[len(shown)-1], strings.Join(ways, "; "))
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
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

// printReport prints what a sync did, file names and problems included.
func printReport(w io.Writer, r drivesync.Report) {
	fmt.Fprintln(w, notesapp.Summary(r))
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
		fmt.Fprintf(w, "deleted %s older than the retention\n", notesapp.Plural(r.Deleted, "old file"))
	}
	for _, f := range r.Rejected {
		fmt.Fprintf(w, "rejected %s: %v\n", f.Name, f.Err)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "not sent %s/%s: %v\n", s.Table, s.Record, s.Err)
	}
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
		a, err := notesapp.Open(ctx, filepath.Join(dir, name+".db"), drivesync.Config{Remote: remote, DeviceID: name})
		if err != nil {
			return err
		}
		defer a.Close()
		devs[i] = &device{name: name, App: a}
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

	var lists [2][]notesapp.Note
	for i, dev := range devs {
		if lists[i], err = dev.List(ctx); err != nil {
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
	*notesapp.App
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
		id, d.err = dev.Add(d.ctx, text)
		fmt.Fprintf(d.w, "%s adds %s %q\n", dev.name, short(id), text)
	}
	return id
}

func (d *demoRun) edit(dev *device, id, text string) {
	if d.err == nil {
		d.err = dev.Update(d.ctx, id, "text", text)
		fmt.Fprintf(d.w, "%s edits %s to %q\n", dev.name, short(id), text)
	}
}

func (d *demoRun) softDelete(dev *device, id string) {
	if d.err == nil {
		d.err = dev.Update(d.ctx, id, "deleted_at", notesapp.Now())
		fmt.Fprintf(d.w, "%s deletes %s\n", dev.name, short(id))
	}
}

func (d *demoRun) sync(dev *device) {
	if d.err == nil {
		var r drivesync.Report
		r, d.err = dev.Engine.Sync(d.ctx)
		fmt.Fprintf(d.w, "%s syncs: %s\n", dev.name, notesapp.Summary(r))
	}
}

func (d *demoRun) show(dev *device) {
	if d.err != nil {
		return
	}
	var notes []notesapp.Note
	notes, d.err = dev.List(d.ctx)
	fmt.Fprintf(d.w, "%s lists %s:\n", dev.name, notesapp.Plural(len(notes), "note"))
	for _, n := range notes {
		fmt.Fprintf(d.w, "  %s  %s\n", short(n.ID), n.Text)
	}
}

func short(id string) string { return id[:min(8, len(id))] }
