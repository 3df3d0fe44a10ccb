package drivesync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A store's limits come from its marker, whatever each device's Config
// says: a file is readable on every device or on none.
func TestLimitsAreTheStores(t *testing.T) {
	remote := NewMemoryRemote()
	a := newDevice(t, "dev-a", remote)
	a.cfg.Limits = Limits{MaxRecordSize: 2048}
	a.open()
	a.put("n1", `{"v":1}`)
	a.sync() // creates the store with a's limits

	b := newDevice(t, "dev-b", remote) // default Config.Limits: 4 MiB records
	b.sync()
	big := strings.Repeat("x", 3000)
	writeRaw(t, remote, "2026/01/01/patch_20260101T000000.000Z_dev-x.json.gz", true,
		fmt.Sprintf(`{"format":1,"device":"dev-x","changes":[{"table_name":"notes","record_id":"big","patch":{"t":%q},"is_deleted":false,"sync_version":9}]}`, big))
	for _, d := range []*device{a, b} {
		r := d.sync()
		if len(r.Rejected) != 1 || !errors.Is(r.Rejected[0].Err, ErrFileTooLarge) {
			t.Errorf("%s: rejected %v, want the 3000-byte change over the store's 2048-byte limit", d.name, r.Rejected)
		}
	}
	// b's own record over the store's limit is not sent, whatever b's
	// Config says.
	b.put("mine", fmt.Sprintf(`{"t":%q}`, big))
	r := b.sync()
	if len(r.Skipped) != 1 || r.Skipped[0].Record != "mine" || r.ChangesSent != 0 {
		t.Fatalf("b sent a record over the store's limit: skipped %v, sent %d", r.Skipped, r.ChangesSent)
	}
	if b.pendingCount() != 1 {
		t.Fatal("the skipped record is no longer pending")
	}
}

// A marker whose limits are absurd is refused, not obeyed.
func TestMarkerLimitsBounded(t *testing.T) {
	for _, body := range []string{
		`{"format":1,"store":"s1","created":"2026-01-01T00:00:00Z","limits":{"max_file_size":1099511627776000,"max_expanded_size":1048576,"max_record_size":4096,"max_snapshot_size":1048576,"max_held_files":2048}}`,
		`{"format":1,"store":"s1","created":"2026-01-01T00:00:00Z","limits":{"max_file_size":0,"max_expanded_size":1048576,"max_record_size":4096,"max_snapshot_size":1048576,"max_held_files":2048}}`,
	} {
		remote := NewMemoryRemote()
		writeRaw(t, remote, markerName, false, body)
		a := newDevice(t, "dev-a", remote)
		_, err := a.eng.Sync(context.Background())
		if !errors.Is(err, ErrCorruptFile) || !strings.Contains(err.Error(), "max_") && !strings.Contains(err.Error(), "Max") {
			t.Errorf("marker %s: got %v, want ErrCorruptFile naming the limit", body, err)
		}
	}
	remote := NewMemoryRemote()
	d := &device{t: t, name: "dev-a", remote: remote}
	d.cfg = Config{Remote: remote, Tables: []Table{{Name: "notes"}}, Limits: Limits{MaxRecordSize: 10}}
	db := newDevice(t, "dev-z", remote).db
	if _, err := Open(context.Background(), db, d.cfg); err == nil || !strings.Contains(err.Error(), "MaxRecordSize") {
		t.Errorf("Open with a 10-byte record limit: got %v, want an error naming MaxRecordSize", err)
	}
}
