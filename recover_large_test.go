package drivesync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A sync whose upload failed leaves its file in the outbox, and the next
// sync publishes it and decodes it again. That decoding is unbounded
// (the file is the device's own), and the unbounded per-value limit once
// overflowed to 64 KiB: a value larger than that made every later sync
// fail to recover the file, and the device was stuck with its change.
func TestRecoveredUploadOfLargeValue(t *testing.T) {
	for _, afterStoring := range []bool{false, true} {
		t.Run(fmt.Sprint("stored=", afterStoring), func(t *testing.T) {
			mem := NewMemoryRemote()
			fr := &failingRemote{Remote: mem}
			a, b := newDevice(t, "dev-a", fr), newDevice(t, "dev-b", mem)
			a.sync()
			big := `{"text":"` + strings.Repeat("x", 200<<10) + `"}`
			a.put("n", big)
			fr.failCreate, fr.createThenFail = !afterStoring, afterStoring
			if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrRemote) {
				t.Fatalf("sync with the upload failing: %v, want ErrRemote", err)
			}
			fr.failCreate, fr.createThenFail = false, false
			if _, err := a.eng.Sync(context.Background()); err != nil {
				t.Fatalf("the next sync: %v", err)
			}
			b.sync()
			if got := b.get("n"); got != big {
				t.Errorf("b has %d bytes of n, want %d", len(got), len(big))
			}
		})
	}
}
