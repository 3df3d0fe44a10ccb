package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func tokensFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(path, []byte("alice alice-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// On a port already in use the server fails without saying it listens,
// and without creating its database.
func TestBusyPortFailsBeforeAnything(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	db := filepath.Join(t.TempDir(), "server.db")
	var logs bytes.Buffer
	err = run(context.Background(), busy.Addr().String(), "sqlite:"+db, tokensFile(t), slog.New(slog.NewJSONHandler(&logs, nil)))
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("run on a busy port: %v, want the bind error", err)
	}
	if strings.Contains(logs.String(), "listening") {
		t.Errorf("the server logged that it listens on a port it could not bind:\n%s", logs.String())
	}
	if _, err := os.Stat(db); err == nil {
		t.Errorf("the server created %s before it could listen", db)
	}
}

// Once the server logs that it listens, it answers: a script may wait
// for the line, or poll /healthz, and then sync.
func TestListeningMeansItAnswers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	logs, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "127.0.0.1:0", "sqlite:"+filepath.Join(t.TempDir(), "server.db"), tokensFile(t), slog.New(slog.NewJSONHandler(w, nil)))
		w.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	lines := bufio.NewScanner(logs)
	var addr string
	for addr == "" && lines.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "drivesync-server listening" {
			addr = line.Addr
		}
	}
	if addr == "" {
		t.Fatal("the server never logged that it listens")
	}
	go io.Copy(io.Discard, logs) // the request logs
	client := http.Client{Timeout: 10 * time.Second}
	res, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz once the server logged that it listens on %s: %v", addr, err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz: %s", res.Status)
	}
}
