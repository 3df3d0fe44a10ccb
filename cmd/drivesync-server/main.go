// Command drivesync-server serves drivesync's push/pull sync protocol over
// HTTP, storing records in an SQLite file or a PostgreSQL database.
//
//	drivesync-server -addr 127.0.0.1:8080 -store sqlite:drivesync-server.db -tokens tokens.txt
//	drivesync-server -store postgres://user:pass@db.example/drivesync -tokens tokens.txt
//
// The tokens file holds one "USER TOKEN" pair per line; blank lines and
// lines starting with # are skipped. Several processes may serve one
// PostgreSQL database behind a load balancer. Logs are JSON lines on
// standard error, each with its request's trace id.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/drivesync/drivesync/syncserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	store := flag.String("store", "sqlite:drivesync-server.db", "where records live: sqlite:PATH or a postgres:// URL")
	tokens := flag.String("tokens", "", `file of "USER TOKEN" lines (required)`)
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *store, *tokens, log); err != nil {
		log.Error("drivesync-server: " + err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, store, tokensFile string, log *slog.Logger) error {
	if tokensFile == "" {
		return errors.New(`-tokens is required: a file with one "USER TOKEN" pair per line`)
	}
	f, err := os.Open(tokensFile)
	if err != nil {
		return err
	}
	tokens, err := syncserver.ReadTokens(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", tokensFile, err)
	}
	// Listen first: a port already in use fails before the database is
	// created, and "listening" is logged only once requests are taken.
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer l.Close()
	st, err := syncserver.Open(ctx, store)
	if err != nil {
		return err
	}
	defer st.Close()
	srv := &http.Server{
		Handler:           syncserver.NewHandler(st, syncserver.Options{Tokens: tokens, Logger: log}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.Info("drivesync-server listening", "addr", l.Addr().String(), "users", len(uniqueUsers(tokens)))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

func uniqueUsers(tokens map[string]string) map[string]bool {
	users := map[string]bool{}
	for _, u := range tokens {
		users[u] = true
	}
	return users
}
