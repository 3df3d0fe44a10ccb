package syncserver

import (
	"encoding/json"
	"fmt"
	"strings"

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

type seenEntry struct {
	path   []string
	seen   merge.Stamp // zero: the writer held nothing there
	writer merge.Stamp
}

// parseSeenList reads an engine write's "seen" member into stamps by
// path.
func parseSeenList(v jsonv.Value) (map[string]merge.Stamp, error) {
	raw := jsonv.Encode(v)
	if len(raw) > maxSeenBytes {
		return nil, fmt.Errorf("over %d bytes", maxSeenBytes)
	}
	var entries [][]json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("must be a list of [[path], version, device]")
	}
	out := make(map[string]merge.Stamp, len(entries))
	for _, e := range entries {
		var path []string
		var s merge.Stamp
		if len(e) != 3 || json.Unmarshal(e[0], &path) != nil || len(path) == 0 ||
			json.Unmarshal(e[1], &s.Version) != nil || json.Unmarshal(e[2], &s.Device) != nil || s.Version < 1 || s.Device == "" {
			return nil, fmt.Errorf("must be a list of [[path], version, device]")
		}
		out[pathKey(path)] = s
	}
	return out, nil
}

func pathKey(path []string) string { return strings.Join(path, "\x00") }

// decodeSeen reads a record's stored entries; what cannot be read is
// none.
func decodeSeen(s string) []seenEntry {
	var raw [][]json.RawMessage
	if s == "" || json.Unmarshal([]byte(s), &raw) != nil {
		return nil
	}
	out := make([]seenEntry, 0, len(raw))
	for _, r := range raw {
		var e seenEntry
		if len(r) != 5 || json.Unmarshal(r[0], &e.path) != nil || json.Unmarshal(r[1], &e.seen.Version) != nil || json.Unmarshal(r[2], &e.seen.Device) != nil ||
			json.Unmarshal(r[3], &e.writer.Version) != nil || json.Unmarshal(r[4], &e.writer.Device) != nil {
			return nil
		}
		out = append(out, e)
	}
	return out
}

func encodeSeen(es []seenEntry) string {
	if len(es) == 0 {
		return ""
	}
	b := []byte{'['}
	for i, e := range es {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "[["...)
		for j, k := range e.path {
			if j > 0 {
				b = append(b, ',')
			}
			b = jsonv.AppendString(b, k)
		}
		b = fmt.Appendf(b, "],%d,", e.seen.Version)
		b = jsonv.AppendString(b, e.seen.Device)
		b = fmt.Appendf(b, ",%d,", e.writer.Version)
		b = jsonv.AppendString(b, e.writer.Device)
		b = append(b, ']')
	}
	if b = append(b, ']'); len(b) > maxSeenBytes {
		return ""
	}
	return string(b)
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
// patch that holds its value now (which replaces a stored one).
func updateSeen(stored string, n *merge.Node, w *merge.Write, seen map[string]merge.Stamp) string {
	var out []seenEntry
	mine := map[string]bool{}
	if w != nil && seen != nil && !w.Deleted {
		var walk func(patch jsonv.Value, path []string)
		walk = func(patch jsonv.Value, path []string) {
			for _, m := range patch.Members {
				p := append(path[:len(path):len(path)], m.Key)
				if at, ok := stampAt(n, p); ok && at == w.At {
					out = append(out, seenEntry{path: p, seen: seen[pathKey(p)], writer: w.At})
					mine[pathKey(p)] = true
				}
				if m.Value.IsObject() {
					walk(m.Value, p)
				}
			}
		}
		walk(w.Patch, nil)
	}
	for _, e := range decodeSeen(stored) {
		if at, ok := stampAt(n, e.path); ok && at == e.writer && !mine[pathKey(e.path)] {
			out = append(out, e)
		}
	}
	return encodeSeen(out)
}
