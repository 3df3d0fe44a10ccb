package drivesync

import (
	"strings"
	"testing"
)

// A record whose id no reader takes (empty, or over MaxRecordIDLen) is not
// sent: it is reported and stays pending, and the other changes of the
// sync reach the other devices. (It used to go in the patch file, which
// every other device then rejected whole, with the other changes.)
func TestUnsendableRecordID(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	for _, id := range []string{"", strings.Repeat("x", 1025)} {
		a.put(id, `{"t":"bad id"}`)
	}
	a.put("ok", `{"t":"fine"}`)
	r := a.sync()
	if len(r.Skipped) != 2 || r.ChangesSent != 1 {
		t.Fatalf("a sync: skipped %v, sent %d; want the two bad ids skipped and one change sent", r.Skipped, r.ChangesSent)
	}
	if r := b.sync(); len(r.Rejected) != 0 || b.get("ok") == "" {
		t.Fatalf("b: rejected %v, note ok %q", r.Rejected, b.get("ok"))
	}
	if n := a.pendingCount(); n != 2 {
		t.Errorf("%d records pending on a, want the two bad ids", n)
	}
}
