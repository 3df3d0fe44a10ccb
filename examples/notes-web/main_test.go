package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Started on a port already in use, notes-web fails before it creates
// anything: no database, no shared folder beside it.
func TestBusyPortCreatesNothing(t *testing.T) {
	t.Setenv("NOTES_REMOTE", "")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	err = run([]string{"-db", filepath.Join(dir, "notes.db"), "-addr", busy.Addr().String()}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("run on a busy port: %v, want the bind error", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("the failed start created %s", e.Name())
	}
}
