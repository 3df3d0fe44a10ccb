package merge

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// What writes had seen, for the devices' conflict logs. A write lists, for
// each path it writes where its device held a value, the stamp of that
// value: [[path], version, device]. A record's state kept by a sync server
// lists, for each path a write set, what that write had seen there and
// the write's own stamp: [[path], seen version, seen device, writer
// version, writer device], the seen stamp zero when it held nothing.

// A SeenEntry is an entry of a state's list: the write stamped Writer set
// Path over a value stamped Seen (zero: none).
type SeenEntry struct {
	Path         []string
	Seen, Writer Stamp
}

// PathKey is a path as a map key.
func PathKey(path []string) string { return strings.Join(path, "\x00") }

var errSeenList = errors.New("must be a list of [[path], version, device]")

// ParseSeenList reads a write's list into stamps by path (see PathKey).
func ParseSeenList(raw []byte) (map[string]Stamp, error) {
	var entries [][]json.RawMessage
	if json.Unmarshal(raw, &entries) != nil {
		return nil, errSeenList
	}
	out := make(map[string]Stamp, len(entries))
	for _, e := range entries {
		var path []string
		var s Stamp
		if len(e) != 3 || json.Unmarshal(e[0], &path) != nil || len(path) == 0 ||
			json.Unmarshal(e[1], &s.Version) != nil || json.Unmarshal(e[2], &s.Device) != nil || s.Version < 1 || s.Device == "" {
			return nil, errSeenList
		}
		out[PathKey(path)] = s
	}
	return out, nil
}

// ParseStateSeen reads a state's list; one that cannot be read gives nil.
func ParseStateSeen(raw []byte) []SeenEntry {
	var entries [][]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &entries) != nil {
		return nil
	}
	out := make([]SeenEntry, 0, len(entries))
	for _, e := range entries {
		var x SeenEntry
		if len(e) != 5 || json.Unmarshal(e[0], &x.Path) != nil || len(x.Path) == 0 ||
			json.Unmarshal(e[1], &x.Seen.Version) != nil || json.Unmarshal(e[2], &x.Seen.Device) != nil ||
			json.Unmarshal(e[3], &x.Writer.Version) != nil || json.Unmarshal(e[4], &x.Writer.Device) != nil {
			return nil
		}
		out = append(out, x)
	}
	return out
}

// AppendStateSeen appends es as a state's list.
func AppendStateSeen(b []byte, es []SeenEntry) []byte {
	b = append(b, '[')
	for i, e := range es {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, "[["...)
		for j, k := range e.Path {
			if j > 0 {
				b = append(b, ',')
			}
			b = jsonv.AppendString(b, k)
		}
		b = append(b, "],"...)
		b = strconv.AppendInt(b, e.Seen.Version, 10)
		b = jsonv.AppendString(append(b, ','), e.Seen.Device)
		b = append(b, ',')
		b = strconv.AppendInt(b, e.Writer.Version, 10)
		b = jsonv.AppendString(append(b, ','), e.Writer.Device)
		b = append(b, ']')
	}
	return append(b, ']')
}
