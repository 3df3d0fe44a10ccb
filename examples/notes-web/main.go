// Command notes-web is the notes app as a small local web app: the notes,
// newest first a page at a time, to add, edit and delete, a "Sync now"
// button whose progress bar the engine feeds live (server-sent events),
// the sync's status (a page opened during a sync says that one runs),
// and the values concurrent edits overwrote, to keep or dismiss. Each
// instance is one device: its own database, syncing through a shared
// folder.
//
//	go run ./examples/notes-web -db a.db -remote DIR
//
// It serves on 127.0.0.1 only and prints the address to open. With no
// flags it keeps notes.db and syncs through notes-shared, a folder beside
// it, on port 8090 (or a free port if that one is taken; 8080 is the
// sync server's).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/examples/internal/notesapp"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "notes-web:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	flags := flag.NewFlagSet("notes-web", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dbPath := flags.String("db", "notes.db", "database file")
	remoteDir := flags.String("remote", os.Getenv("NOTES_REMOTE"), "shared folder to sync through (default: notes-shared beside the database)")
	addr := flags.String("addr", "127.0.0.1:8090", "address to serve on (127.0.0.1:0 picks a free port)")
	passphrase := flags.String("passphrase", os.Getenv("NOTES_PASSPHRASE"), "encrypt the store with this passphrase")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	// Listen first: a port already in use fails before anything is
	// created (the database, the shared folder).
	l, err := net.Listen("tcp", *addr)
	if err != nil && !addrSet(flags) {
		l, err = net.Listen("tcp", "127.0.0.1:0") // 8090 is taken: any free port
	}
	if err != nil {
		return err
	}
	defer l.Close()
	if *remoteDir == "" {
		// A first run with no flags: a shared folder beside the database,
		// which a second instance (-db other.db) can sync through.
		*remoteDir = filepath.Join(filepath.Dir(*dbPath), "notes-shared")
		if err := os.MkdirAll(*remoteDir, 0o755); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "notes-web: %s syncs through %s\n", *dbPath, *remoteDir)
	remote, err := drivesync.NewFolderRemote(*remoteDir)
	if err != nil {
		return err
	}
	srv, err := newServer(ctx, *dbPath, drivesync.Config{Remote: remote}, *passphrase)
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintf(stdout, "notes-web: open http://%s (Ctrl-C to stop)\n", l.Addr())
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs.Shutdown(shut)
	}()
	if err := hs.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// newServer opens the device's app and returns its web handler.
func newServer(ctx context.Context, dbPath string, cfg drivesync.Config, passphrase string) (*server, error) {
	s := &server{events: newHub()}
	if passphrase != "" {
		cfg.Encryption = drivesync.Passphrase(passphrase)
	}
	cfg.Progress = s.progress
	a, err := notesapp.Open(ctx, dbPath, cfg)
	if err != nil {
		return nil, err
	}
	s.app = a
	s.routes()
	return s, nil
}

// addrSet reports whether -addr was given.
func addrSet(flags *flag.FlagSet) (set bool) {
	flags.Visit(func(f *flag.Flag) { set = set || f.Name == "addr" })
	return set
}
