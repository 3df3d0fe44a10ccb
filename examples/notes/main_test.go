package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/drivesync/drivesync/syncserver"
)

func TestDemo(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"demo"}, &out, &errOut); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	for _, want := range []string{"desktop's edit wins", "both devices agree: yes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}

// cli runs notes commands as one device: its own database, the shared
// remote that flags name ("-remote DIR" or "-drive").
type cli struct {
	t     *testing.T
	db    string
	flags []string
}

func (c cli) run(args ...string) string {
	c.t.Helper()
	out, err := c.try(args...)
	if err != nil {
		c.t.Fatalf("notes %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// fail runs a command that must fail and returns its error message.
func (c cli) fail(args ...string) string {
	c.t.Helper()
	out, err := c.try(args...)
	if err == nil {
		c.t.Fatalf("notes %s succeeded, want an error; stdout:\n%s", strings.Join(args, " "), out)
	}
	return err.Error()
}

func (c cli) try(args ...string) (string, error) {
	out, _, err := c.tryBoth(args...)
	return out, err
}

// tryBoth runs a command and returns its standard output and error.
func (c cli) tryBoth(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	args = append(append([]string{"-db", c.db}, c.flags...), args...)
	err = run(args, &out, &errOut)
	if err != nil {
		err = fmt.Errorf("%w\nstderr: %s", err, errOut.String())
	}
	return out.String(), errOut.String(), err
}

// rows counts the note's rows, soft-deleted or not.
func (c cli) rows(id string) int {
	c.t.Helper()
	db, err := sql.Open("sqlite", "file:"+c.db)
	if err != nil {
		c.t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM notes WHERE id = ?`, id).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

func TestTwoDevices(t *testing.T) {
	t.Setenv("NOTES_DB", "")
	t.Setenv("NOTES_REMOTE", "")
	dir := t.TempDir()
	remote := t.TempDir()
	a := cli{t, filepath.Join(dir, "a.db"), []string{"-remote", remote}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-remote", remote}}

	first := strings.TrimSpace(a.run("add", "first note"))
	second := strings.TrimSpace(a.run("add", "second note"))
	if len(first) != 36 || len(second) != 36 || first == second {
		t.Fatalf("add printed ids %q and %q, want two UUIDs", first, second)
	}
	if got := a.run("sync"); !strings.Contains(got, "sent 2 changes") || !strings.Contains(got, "uploaded ") {
		t.Errorf("a sync: %q", got)
	}
	if got := b.run("sync"); !strings.Contains(got, "received 2 changes from 1 file") {
		t.Errorf("b sync: %q", got)
	}
	list := b.run("list")
	for _, want := range []string{first, "first note", second, "second note"} {
		if !strings.Contains(list, want) {
			t.Errorf("b lists %q, want it to contain %q", list, want)
		}
	}

	// An edit on b shows on a once both have synced.
	b.run("edit", first, "first note, edited")
	b.run("sync")
	a.run("sync")
	if list := a.run("list"); !strings.Contains(list, "first note, edited") {
		t.Errorf("a lists %q after b's edit", list)
	}

	// A soft delete hides the note on both devices, but the row stays.
	a.run("delete", second)
	a.run("sync")
	b.run("sync")
	for _, c := range []cli{a, b} {
		if list := c.run("list"); strings.Contains(list, second) || !strings.Contains(list, first) {
			t.Errorf("%s lists %q after soft delete", c.db, list)
		}
		if n := c.rows(second); n != 1 {
			t.Errorf("%s has %d rows for the soft-deleted note, want 1", c.db, n)
		}
	}

	// A purge removes the row on both devices.
	b.run("purge", second)
	b.run("sync")
	a.run("sync")
	for _, c := range []cli{a, b} {
		if n := c.rows(second); n != 0 {
			t.Errorf("%s has %d rows for the purged note, want 0", c.db, n)
		}
		if n := c.rows(first); n != 1 {
			t.Errorf("%s has %d rows for the kept note, want 1", c.db, n)
		}
	}
	if got := a.run("sync"); strings.TrimSpace(got) != "up to date" {
		t.Errorf("a's last sync printed %q, want up to date", got)
	}
}

func TestErrors(t *testing.T) {
	t.Setenv("NOTES_REMOTE", "")
	db := filepath.Join(t.TempDir(), "notes.db")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-db", db, "sync"}, "NOTES_REMOTE"},
		{[]string{"-db", db, "-remote", filepath.Join(t.TempDir(), "missing"), "sync"}, "does not exist"},
		{[]string{"-db", db, "-remote", t.TempDir(), "edit", "nope", "text"}, "no note with id nope"},
		{[]string{"-db", db, "-remote", t.TempDir(), "add"}, "add takes 1 argument"},
		{[]string{"frobnicate"}, "unknown command"},
	} {
		var out, errOut bytes.Buffer
		err := run(tt.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}

// TestEmptiedRemote: a remote folder that was emptied stops sync with a
// message naming the choices; "fresh" uploads the notes again, "join"
// brings a second device along, and a snapshot starts a third.
func TestEmptiedRemote(t *testing.T) {
	t.Setenv("NOTES_DB", "")
	t.Setenv("NOTES_REMOTE", "")
	dir, remote := t.TempDir(), t.TempDir()
	a := cli{t, filepath.Join(dir, "a.db"), []string{"-remote", remote}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-remote", remote}}
	a.run("add", "kept note")
	a.run("sync")
	b.run("sync")
	a.run("sync") // a has read its store's marker back
	entries, err := os.ReadDir(remote)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(remote, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if msg := a.fail("sync"); !strings.Contains(msg, "notes fresh") {
		t.Fatalf("sync of an emptied remote: %s", msg)
	}
	if got := a.run("fresh"); !strings.Contains(got, "wrote snapshot") {
		t.Fatalf("fresh: %q", got)
	}
	if msg := b.fail("sync"); !strings.Contains(msg, "notes join") {
		t.Fatalf("b's sync: %s", msg)
	}
	b.run("join")
	b.run("sync")
	c := cli{t, filepath.Join(dir, "c.db"), []string{"-remote", remote}}
	c.run("sync")
	for _, d := range []cli{a, b, c} {
		if list := d.run("list"); !strings.Contains(list, "kept note") {
			t.Errorf("%s lists %q", d.db, list)
		}
	}
}

// startServer serves a sync server over SQLite on loopback with tokens
// (token -> user), for the CLI to reach through -server, and clears the
// environment the CLI would otherwise read its settings from.
func startServer(t *testing.T, tokens map[string]string) *httptest.Server {
	t.Helper()
	for _, v := range []string{"NOTES_DB", "NOTES_REMOTE", "NOTES_SERVER", "NOTES_TOKEN"} {
		t.Setenv(v, "")
	}
	st, err := syncserver.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := httptest.NewServer(syncserver.NewHandler(st, syncserver.Options{Tokens: tokens}))
	t.Cleanup(srv.Close)
	return srv
}

// Two devices sync through a sync server, as the README's quick start
// does; a device's sync after its push says it is up to date.
func TestTwoDevicesThroughServer(t *testing.T) {
	const token = "alice-token-0123456789"
	srv := startServer(t, map[string]string{token: "alice"})
	dir := t.TempDir()
	a := cli{t, filepath.Join(dir, "a.db"), []string{"-server", srv.URL, "-token", token}}
	b := cli{t, filepath.Join(dir, "b.db"), []string{"-server", srv.URL, "-token", token}}
	id := strings.TrimSpace(a.run("add", "through the server"))
	if got := a.run("sync"); !strings.Contains(got, "sent 1 change") {
		t.Errorf("a sync: %q", got)
	}
	// a holds what it sent: its next sync pulls nothing back.
	if got := a.run("sync"); strings.TrimSpace(got) != "up to date" {
		t.Errorf("a's next sync printed %q, want up to date", got)
	}
	if got := b.run("sync"); !strings.Contains(got, "received 1 change") {
		t.Errorf("b sync: %q", got)
	}
	if list := b.run("list"); !strings.Contains(list, id) || !strings.Contains(list, "through the server") {
		t.Errorf("b lists %q", list)
	}
	if _, err := (cli{t, filepath.Join(dir, "c.db"), []string{"-server", srv.URL, "-token", "wrong-token-0123456789"}}).try("sync"); err == nil || !strings.Contains(err.Error(), "refused the token") {
		t.Errorf("a wrong token: %v", err)
	}
}

// A token the sync server refuses gets a message about the token and
// where it comes from, never the Google sign-in's: a token it does not
// know (401), and the token of another user than the one whose store
// this database syncs with (403).
func TestServerRefusesToken(t *testing.T) {
	const alice, bob = "alice-token-0123456789", "bob-token-0123456789ab"
	srv := startServer(t, map[string]string{alice: "alice", bob: "bob"})
	db := filepath.Join(t.TempDir(), "a.db")
	a := cli{t, db, []string{"-server", srv.URL, "-token", alice}}
	a.run("add", "alice's note")
	a.run("sync")
	for _, tc := range []struct{ name, token string }{
		{"unknown token", "wrong-token-0123456789"},
		{"another user's token", bob},
	} {
		msg := cli{t, db, []string{"-server", srv.URL, "-token", tc.token}}.fail("sync")
		if strings.Contains(msg, "Google") || !strings.Contains(msg, "the sync server refused the token") || !strings.Contains(msg, "NOTES_TOKEN") {
			t.Errorf("%s: %s\nwant a message about the sync server's token and $NOTES_TOKEN, not Google", tc.name, msg)
		}
	}
}

// Two remotes given, by flags or the environment (the README's folder and
// server steps in one shell export both), are refused before anything is
// opened: the message names each setting as it was given and how to drop
// it, never a flag the user did not pass.
func TestTwoRemotesRefused(t *testing.T) {
	isolate(t)
	dir, folder := t.TempDir(), t.TempDir()
	const server = "http://127.0.0.1:1"
	for _, tc := range []struct {
		name        string
		env         map[string]string
		args        []string
		want, never []string
	}{
		{"both from the environment", map[string]string{"NOTES_REMOTE": folder, "NOTES_SERVER": server, "NOTES_TOKEN": "alice-token-0123456789"}, []string{"sync"},
			[]string{"$NOTES_REMOTE=" + folder, "$NOTES_SERVER=" + server, "unset NOTES_SERVER", "unset NOTES_REMOTE"}, []string{"-server", "-remote"}},
		{"a local command too", map[string]string{"NOTES_REMOTE": folder, "NOTES_SERVER": server}, []string{"add", "x"},
			[]string{"$NOTES_REMOTE=" + folder, "$NOTES_SERVER=" + server}, nil},
		{"-remote and $NOTES_SERVER", map[string]string{"NOTES_SERVER": server, "NOTES_TOKEN": "alice-token-0123456789"}, []string{"-remote", folder, "sync"},
			[]string{"-remote " + folder, "$NOTES_SERVER=" + server, "unset NOTES_SERVER", "leave out -remote"}, []string{"-server"}},
		{"-server and $NOTES_REMOTE", map[string]string{"NOTES_REMOTE": folder}, []string{"-server", server, "-token", "alice-token-0123456789", "sync"},
			[]string{"-server " + server, "$NOTES_REMOTE=" + folder, "unset NOTES_REMOTE", "leave out -server"}, []string{"-remote "}},
		{"-server and -remote", nil, []string{"-server", server, "-remote", folder, "sync"},
			[]string{"-server " + server, "-remote " + folder, "leave out -server", "leave out -remote"}, []string{"$NOTES"}},
		{"-drive and $NOTES_REMOTE", map[string]string{"NOTES_REMOTE": folder}, []string{"-drive", "sync"},
			[]string{"-drive", "$NOTES_REMOTE=" + folder, "unset NOTES_REMOTE", "leave out -drive"}, nil},
		{"all three", map[string]string{"NOTES_SERVER": server}, []string{"-drive", "-remote", folder, "status"},
			[]string{"-drive", "-remote " + folder, "$NOTES_SERVER=" + server, "leave out -remote and unset NOTES_SERVER"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range []string{"NOTES_REMOTE", "NOTES_SERVER", "NOTES_TOKEN"} {
				t.Setenv(v, tc.env[v])
			}
			db := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".db")
			msg := cli{t, db, nil}.fail(tc.args...)
			msg, _, _ = strings.Cut(msg, "\nstderr:")
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			for _, w := range tc.never {
				if strings.Contains(msg, w) {
					t.Errorf("message %q names %q, which was not given", msg, w)
				}
			}
			if _, err := os.Stat(db); err == nil {
				t.Errorf("the refused command created %s", db)
			}
		})
	}
}

// A database that syncs through a folder, pointed at a sync server, is
// told that it syncs elsewhere, not that its store was deleted, and how
// to sync it where it belongs or merge it into the server's store.
func TestFolderDatabaseOnServer(t *testing.T) {
	const token = "alice-token-0123456789"
	srv := startServer(t, map[string]string{token: "alice"})
	dir, folder := t.TempDir(), t.TempDir()
	work := cli{t, filepath.Join(dir, "work.db"), []string{"-server", srv.URL, "-token", token}}
	work.run("add", "on the server")
	work.run("sync")
	laptop := cli{t, filepath.Join(dir, "laptop.db"), []string{"-remote", folder}}
	laptop.run("add", "in the folder")
	laptop.run("sync")
	laptop.flags = work.flags
	msg := laptop.fail("sync")
	if strings.Contains(msg, "deleted") || !strings.Contains(msg, "syncs through the folder "+folder) || !strings.Contains(msg, "-remote "+folder) || !strings.Contains(msg, "notes join") {
		t.Errorf("a folder's database on a server: %s\nwant it to name the folder it syncs through, -remote, notes join, and nothing deleted", msg)
	}
	// join merges it into the server's store.
	laptop.run("join")
	laptop.run("sync")
	if list := laptop.run("list"); !strings.Contains(list, "on the server") || !strings.Contains(list, "in the folder") {
		t.Errorf("after the join: %q", list)
	}
}

// A database of the server's store "notes" pointed at a store name never
// used hears that it syncs with "notes", not that "notes"'s id no longer
// exists under the other name.
func TestServerStoreOfAnotherName(t *testing.T) {
	const token = "alice-token-0123456789"
	srv := startServer(t, map[string]string{token: "alice"})
	a := cli{t, filepath.Join(t.TempDir(), "a.db"), []string{"-server", srv.URL, "-token", token}}
	a.run("add", "in notes")
	a.run("sync")
	for _, other := range []string{"other", "taken"} {
		if other == "taken" {
			b := cli{t, filepath.Join(t.TempDir(), "b.db"), []string{"-server", srv.URL, "-token", token, "-store", "taken"}}
			b.run("add", "in taken")
			b.run("sync")
		}
		a.flags = []string{"-server", srv.URL, "-token", token, "-store", other}
		msg := a.fail("sync")
		if strings.Contains(msg, "no longer exists") || strings.Contains(msg, "deleted") || !strings.Contains(msg, `"notes"`) || !strings.Contains(msg, `"`+other+`"`) {
			t.Errorf("-store %s: %s\nwant it to name both stores, and nothing deleted", other, msg)
		}
	}
}
