package syncserver

import (
	"fmt"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// What a record's writes had seen, for the devices' conflict logs.
//
// An engine's write lists, in "seen", the stamp its device held at each
// path it writes: [[path], version, device], one per path where it held
// a value. A device that receives the write and showed, at such a path, a
// value stamped above that (one the writer had not seen) logs it as
// overwritten by a concurrent edit. Through the server a device receives
// merged states, not writes, so the server keeps, for each path whose
// value an engine's write set, what that write had seen there, and a
// pull's drivesync view sends it with the state: "seen" is a list of
// [[path], seen version, seen device, writer version, writer device]
// (seen 0 and "" when the writer held nothing there). An entry is dropped
// once another write sets its path; a write without a list (a plain
// client's, a state) leaves its paths without one, and devices then log
// nothing for them.

// maxSeenBytes bounds a write's list and a record's entries; past it the
// record keeps none.
const maxSeenBytes = 64 << 10

// parseSeenList reads an engine write's "seen" member into stamps by
// path (see merge.PathKey).
func parseSeenList(v jsonv.Value) (map[string]merge.Stamp, error) {
	raw := jsonv.Encode(v)
	if len(raw) > maxSeenBytes {
		return nil, fmt.Errorf("over %d bytes", maxSeenBytes)
	}
	return merge.ParseSeenList(raw)
}

// stampAt returns the stamp of n's node at path, and whether it has one.
func stampAt(n *merge.Node, path []string) (merge.Stamp, bool) {
	for _, k := range path {
		if n = n.Child(k, false); n == nil {
			return merge.Stamp{}, false
		}
	}
	return n.Stamp, true
}

// updateSeen returns a record's entries after a write merged into its
// state n: the stored ones whose paths still hold their writers' values,
// and, for an engine's write w with a seen list, one for each path of its
// patch that holds its value now (which replaces a stored one). Past
// maxSeenBytes the record keeps none.
func updateSeen(stored string, n *merge.Node, w *merge.Write, seen map[string]merge.Stamp) string {
	var out []merge.SeenEntry
	mine := map[string]bool{}
	if w != nil && seen != nil && !w.Deleted {
		var walk func(patch jsonv.Value, path []string)
		walk = func(patch jsonv.Value, path []string) {
			for _, m := range patch.Members {
				p := append(path[:len(path):len(path)], m.Key)
				if at, ok := stampAt(n, p); ok && at == w.At {
					out = append(out, merge.SeenEntry{Path: p, Seen: seen[merge.PathKey(p)], Writer: w.At})
					mine[merge.PathKey(p)] = true
				}
				if m.Value.IsObject() {
					walk(m.Value, p)
				}
			}
		}
		walk(w.Patch, nil)
	}
	for _, e := range merge.ParseStateSeen([]byte(stored)) {
		if at, ok := stampAt(n, e.Path); ok && at == e.Writer && !mine[merge.PathKey(e.Path)] {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return ""
	}
	if b := merge.AppendStateSeen(nil, out); len(b) <= maxSeenBytes {
		return string(b)
	}
	return ""
}
