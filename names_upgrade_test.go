package drivesync

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A device that synced the outer store with an engine that took files in
// any folder applied the nested store's file, and recorded it in
// sync_files as applied. After the upgrade that name stays in the ledger
// (the file is still listed, so pruning keeps it). It once went into every
// snapshot header, which the decoder, taking only names in their day
// folder, refused: the device could never write a snapshot again, and
// the store was never compacted. Such a name is left out of headers now.
func TestUpgradedLedgerWithNestedNameStillSnapshots(t *testing.T) {
	_, outer, _, foreign := nestedSetup(t)
	o := newDevice(t, "dev-o", outer)
	o.put("y", `{"v":"outer"}`)
	o.sync()
	// What the old engine's apply wrote for the nested file.
	o.exec(`INSERT OR REPLACE INTO sync_files (name, status, size) VALUES (?, 'applied', 100)`, foreign)
	o.put("y", `{"v":"outer2"}`)
	o.sync()
	if _, err := o.eng.Snapshot(context.Background()); err != nil {
		t.Fatalf("Snapshot after upgrade, ledger holding %s (applied by the old engine): %v", foreign, err)
	}
}

// A snapshot written by such an older engine on the outer store lists the
// nested file in "included" (its writer had applied it). A header naming a
// file outside its day folder was once refused whole, and once the older
// engine had compacted the patch files the snapshot held, a device joining
// could not get their records. Headers take names in any folder.
func TestOldSnapshotListingNestedNameAccepted(t *testing.T) {
	root, outer, _, foreign := nestedSetup(t)
	o := newDevice(t, "dev-o", outer)
	o.put("y", `{"v":"outer"}`)
	o.sync()
	own := ""
	for _, n := range remoteFiles(t, outer, kindPatch) {
		if strings.Contains(n, "_dev-o.") {
			own = n
		}
	}
	if own == "" {
		t.Fatal("no patch file of dev-o")
	}
	// The snapshot the old engine wrote: exactly writeState's output, with
	// the ledger's applied names (the nested one included) in the header.
	ctx := context.Background()
	now := time.Now().UTC().Add(time.Second)
	h := stateHeader{device: "dev-o", store: o.store(), covers: now, cutoff: now, included: []string{foreign, own}}
	var buf bytes.Buffer
	if _, err := writeStateFile(ctx, o.db, &buf, h, Limits{}.withDefaults().MaxRecordSize, nil); err != nil {
		t.Fatal(err)
	}
	snap := remoteFileName(kindSnapshot, now, "dev-o")
	if err := outer.Create(ctx, snap, &buf); err != nil {
		t.Fatal(err)
	}
	// The old engine's compaction deleted the files the snapshot held
	// (the nested one too, which is the bug c18536f fixed; here only ours).
	if err := outer.Delete(ctx, own); err != nil {
		t.Fatal(err)
	}
	_ = root
	n := newDevice(t, "dev-n", outer)
	rep := n.sync()
	if got := n.get("y"); got != `{"v":"outer"}` {
		t.Errorf("a device joining after the upgrade has y = %q, want {\"v\":\"outer\"}; report: %+v", got, rep)
	}
}

func harnessCount(kind string) int64 {
	if c, ok := counters.Load(kind); ok {
		return c.(*atomic.Int64).Load()
	}
	return 0
}

// runSchedules runs as many schedules as asked, in batches whose share
// is under rapid's checks too, and under -short, where rapid runs a fifth
// of its checks (it once ran fewer schedules then, or none, and passed).
func TestRunSchedulesRunsWhatItAsks(t *testing.T) {
	const n = 7
	before := harnessCount("schedules")
	t.Run("run", func(t *testing.T) { runSchedules(t, n, n, n, backend{}) })
	if got := harnessCount("schedules") - before; got != int64(n) {
		t.Errorf("runSchedules(%d) ran %d schedules", n, got)
	}
}

var review11bN = flag.Int("review11b-n", 60, "schedules for TestRunSchedulesRunsWhatItAsks")
