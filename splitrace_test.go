package drivesync

import (
	"strings"
	"testing"
)

// splitRace runs one race between device a, whose change to r is sent
// whole (a large record limit) or split into parts (a small one), and
// device b, which writes concurrently without seeing a's file, and
// returns what r ends as.
func splitRace(t *testing.T, limit int64, start, aRow string, bEdit func(b *device)) string {
	t.Helper()
	lag := &laggingRemote{Remote: NewMemoryRemote(), hidden: map[string][]string{}}
	a, b := newDevice(t, "dev-a", lag.as("dev-a")), newDevice(t, "dev-b", lag.as("dev-b"))
	a.cfg.Limits = Limits{MaxRecordSize: limit}
	a.open()
	a.put("r", start)
	syncAll(t, a, b)
	a.put("r", aRow)
	bEdit(b)
	a.sync()
	lag.hide("dev-b", "dev-a") // b's change is concurrent with a's
	b.sync()
	lag.hide("dev-b")
	syncAll(t, a, b)
	assertConverged(t, a, b)
	return a.get("r")
}

// A change sent in parts is one write: a concurrent write of another
// device orders against all its parts alike, exactly as against the whole
// change. Before, the parts took consecutive versions, and a write stamped
// between them (same version as the first part, a larger device id) won
// over some parts and lost to others.
func TestSplitChangeIsOneWrite(t *testing.T) {
	big := func(c string) string { return strings.Repeat(c, 600) }
	aRow := `{"p":"` + big("a") + `","q":"` + big("A") + `"}`
	cases := []struct {
		name, start, aRow string
		b                 func(*device)
	}{
		{"delete vs edit", `{"p":"x","q":"y"}`, aRow, func(b *device) { b.exec(`DELETE FROM notes WHERE id = 'r'`) }},
		{"edit vs edit", `{"p":"x","q":"y"}`, aRow, func(b *device) { b.put("r", `{"p":"b","q":"B"}`) }},
		{"nested removal vs nested edit", `{"o":{"x":"0"}}`, `{"o":{"x":"` + big("x") + `","y":"` + big("y") + `"}}`, func(b *device) { b.put("r", `{}`) }},
	}
	for _, c := range cases {
		whole, split := splitRace(t, 1<<20, c.start, c.aRow, c.b), splitRace(t, 1024, c.start, c.aRow, c.b)
		if whole != split {
			t.Errorf("%s: whole change gives r = %.80q, split gives r = %.80q", c.name, whole, split)
		}
	}
}
