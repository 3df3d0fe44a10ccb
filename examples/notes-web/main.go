// Command notes-web is the notes app as a small local web app: a list of
// notes to add, edit and delete, a "Sync now" button whose progress bar
// the engine feeds live (server-sent events), the sync's status, and the
// values concurrent edits overwrote, to keep or dismiss. Each instance is
// one device: its own database, syncing through a shared folder.
//
//	go run ./examples/notes-web -db a.db -remote DIR
//
// It serves on 127.0.0.1 only and prints the address to open.
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
	remoteDir := flags.String("remote", os.Getenv("NOTES_REMOTE"), "shared folder to sync through")
	addr := flags.String("addr", "127.0.0.1:8080", "address to serve on (127.0.0.1:0 picks a free port)")
	passphrase := flags.String("passphrase", os.Getenv("NOTES_PASSPHRASE"), "encrypt the store with this passphrase")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *remoteDir == "" {
		return errors.New("no remote: pass -remote DIR, the folder your devices share (any empty folder to start)")
	}
	remote, err := drivesync.NewFolderRemote(*remoteDir)
	if err != nil {
		return err
	}
	srv, err := newServer(ctx, *dbPath, drivesync.Config{Remote: remote}, *passphrase)
	if err != nil {
		return err
	}
	defer srv.Close()
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
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
