package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/drivesync/drivesync"
)

// The app's scenario table, played by one user's three devices syncing
// after each step: every cell of the table, on every device.
func TestScenarioTable(t *testing.T) {
	ctx := context.Background()
	w, err := newWorld(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// What every device holds after each step (A is the user's picture,
	// B the friend's; the friend made B up to generation 6).
	want := []string{
		// New: dots INSERT (A,0); instances INSERT (A,0); no log.
		"dot A 0\ninstance A gen 0 mine\n",
		// Edit: dots INSERT (A,1); instances UPDATE gen=1.
		"dot A 0\ndot A 1\ninstance A gen 1 mine\n",
		// Scan, new: dots INSERT (B,5); instances INSERT (B,5); log SCANNED B 5.
		"dot A 0\ndot A 1\ndot B 5\ninstance A gen 1 mine\ninstance B gen 5 scanned\nlog QR_SCANNED B 5\n",
		// Scan, update: dots INSERT (B,6); instances UPDATE gen=6; log SCANNED B 6.
		"dot A 0\ndot A 1\ndot B 5\ndot B 6\ninstance A gen 1 mine\ninstance B gen 6 scanned\nlog QR_SCANNED B 5\nlog QR_SCANNED B 6\n",
		// Scan, existing: dots skip; instances skip; log SCANNED B 5.
		"dot A 0\ndot A 1\ndot B 5\ndot B 6\ninstance A gen 1 mine\ninstance B gen 6 scanned\nlog QR_SCANNED B 5\nlog QR_SCANNED B 5\nlog QR_SCANNED B 6\n",
		// Scan, conflict: refused, nothing written.
		"dot A 0\ndot A 1\ndot B 5\ndot B 6\ninstance A gen 1 mine\ninstance B gen 6 scanned\nlog QR_SCANNED B 5\nlog QR_SCANNED B 5\nlog QR_SCANNED B 6\n",
		// Show: log SHOWN A 1.
		"dot A 0\ndot A 1\ndot B 5\ndot B 6\ninstance A gen 1 mine\ninstance B gen 6 scanned\nlog QR_SCANNED B 5\nlog QR_SCANNED B 5\nlog QR_SCANNED B 6\nlog QR_SHOWN A 1\n",
		// Delete: instances UPDATE deleted_at.
		"dot A 0\ndot A 1\ndot B 5\ndot B 6\ninstance A gen 1 mine deleted\ninstance B gen 6 scanned\nlog QR_SCANNED B 5\nlog QR_SCANNED B 5\nlog QR_SCANNED B 6\nlog QR_SHOWN A 1\n",
	}
	var s scenarioState
	for i, st := range scenario {
		if _, err := st.run(ctx, w, &s); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if err := w.syncAll(ctx); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		names := map[string]string{s.a: "A"}
		if s.b != "" {
			names[s.b] = "B"
		}
		for d, a := range w.devs {
			got, err := a.summary(ctx, names)
			if err != nil {
				t.Fatal(err)
			}
			if got != want[i] {
				t.Errorf("%s, on %s:\n%s\nwant\n%s", st.name, w.names[d], got, want[i])
			}
		}
	}
	if !errors.Is(s.refusedError, errConflict) {
		t.Errorf("the forged payload was not refused as a conflict: %v", s.refusedError)
	}
}

// Two devices edit the same picture while apart: each makes generation 2
// with its own pixels. dots is append-only, so each keeps its own
// generation 2 and both report the conflict; the instance's current_gen
// never goes back on any device.
func TestConcurrentEditsOfOnePicture(t *testing.T) {
	ctx := context.Background()
	w, err := newWorld(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	laptop, phone := w.devs[0], w.devs[1]
	a, err := laptop.create(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := laptop.edit(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := w.syncAll(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := laptop.edit(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := phone.edit(ctx, a); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, d := range []*app{laptop, phone} {
			if _, err := d.engine.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, d := range []*app{laptop, phone} {
		r, err := d.engine.Sync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var conflicts int
		for _, u := range r.Unwritten {
			if errors.Is(u.Err, drivesync.ErrImmutableConflict) && u.Table == "dots" {
				conflicts++
			}
		}
		if conflicts != 1 {
			t.Errorf("Unwritten %v, want the conflict of generation 2", r.Unwritten)
		}
		var out bytes.Buffer
		printReport(&out, r)
		if !strings.Contains(out.String(), "not written: dots") {
			t.Errorf("the sync report does not show the conflict:\n%s", out.String())
		}
		var gen int
		d.db.QueryRowContext(ctx, `SELECT current_gen FROM dot_instances`).Scan(&gen)
		if gen != 2 {
			t.Errorf("current_gen = %d, want 2", gen)
		}
	}
}
