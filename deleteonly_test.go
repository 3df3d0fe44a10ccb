package drivesync

import (
	"context"
	"testing"

	"github.com/drivesync/drivesync/internal/merge"
)

// A device that receives a record's delete before the record's writes
// (its listing lags the writer's file) stores the record known only by
// its delete. Its snapshots must still be readable: before, every reader
// (and the writer's own check) refused such a record, so the device
// could write no snapshot until the writes arrived.
func TestSnapshotWithRecordKnownOnlyByItsDelete(t *testing.T) {
	lag := &laggingRemote{Remote: NewMemoryRemote(), hidden: map[string][]string{}}
	a, b, c := newDevice(t, "dev-a", lag.as("dev-a")), newDevice(t, "dev-b", lag.as("dev-b")), newDevice(t, "dev-c", lag.as("dev-c"))
	syncAll(t, a, b, c)
	lag.hide("dev-b", "dev-a") // b does not see a's files yet
	a.put("r", `{"title":"x"}`)
	a.sync()
	c.sync()
	c.exec(`DELETE FROM notes WHERE id = 'r'`)
	c.sync()
	b.sync()
	if _, err := b.eng.Snapshot(context.Background()); err != nil {
		t.Fatalf("b's snapshot with r known only by its delete: %v", err)
	}
	lag.hide("dev-b")
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)
	for _, d := range []*device{a, b, c} {
		if got := d.get("r"); got != "" {
			t.Errorf("%s: r = %q, want deleted", d.name, got)
		}
	}
	// A device that starts from b's snapshot converges too.
	n := newDevice(t, "dev-n", lag.as("dev-n"))
	syncAll(t, a, b, c, n)
	assertConverged(t, a, b, c, n)
}

// The delete's stamp of a state file's record is checked like every other
// stamp.
func TestStateEntryDeleteStampChecked(t *testing.T) {
	n := &merge.Node{}
	n.ApplyDelete(merge.Stamp{Version: 5, Device: "dev-b"})
	data, clock := merge.EncodeState(n)
	e := stateEntry{Table: "notes", Record: "r", State: []byte(data), Clock: []byte(clock), Deleted: true}
	if _, err := validateStateEntry(e, 1<<20, map[string]bool{}); err != nil {
		t.Fatalf("a record known only by its delete: %v", err)
	}
	for _, bad := range []string{`{"d":["dev-b"],"x":[0,0]}`, `{"d":["dev-b"],"x":[9007199254740993,0]}`, `{"d":["not a device!"],"x":[5,0]}`} {
		e.Clock = []byte(bad)
		if _, err := validateStateEntry(e, 1<<20, map[string]bool{}); err == nil {
			t.Errorf("clock %s accepted", bad)
		}
	}
}
