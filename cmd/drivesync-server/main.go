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
	if err := run(*addr, *store, *tokens, log); err != nil {
		log.Error("drivesync-server: " + err.Error())
		os.Exit(1)
	}
}

func run(addr, store, tokensFile string, log *slog.Logger) error {
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	st, err := syncserver.Open(ctx, store)
	if err != nil {
		return err
	}
	defer st.Close()
	srv := &http.Server{
		Addr:              addr,
		Handler:           syncserver.NewHandler(st, syncserver.Options{Tokens: tokens, Logger: log}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("drivesync-server listening", "addr", addr, "users", len(uniqueUsers(tokens)))
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
