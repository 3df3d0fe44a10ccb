package merge

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// MaxRecordIDLen bounds a record id, in bytes.
const MaxRecordIDLen = 1024

// MaxVersion bounds the versions the engine reads and writes, far below
// the int64 limit. A device never stamps past it (Sync fails with a clear
// error instead): a broken or hostile file claiming a huge version can
// stop a store from taking changes, but can never make one device write
// files the others refuse, which would split them.
const MaxVersion = 1 << 53

// Received versions are bounded by time. A file named at remote time T
// may carry no version above VersionsAllowed(T): a base, plus a million
// (2^20) versions for every second since 2020. Versions grow by one per
// change, and no store makes a million changes a second, so honest files
// stay far below; a file above is broken or hostile and is rejected.
//
// Without such a bound, one file stamped near MaxVersion would stop the
// store from stamping changes for good, on every device and through every
// snapshot. A bound relative to what each device has seen would split
// devices instead: one that is behind, or new, would refuse a file the
// others accepted, and with it every honest file stamped after it. The
// time bound depends only on the file and on the clock, which moves
// forward for every device: a file named in the future is refused until
// the device's clock reaches the time its versions need, and then taken
// by every device alike. No sequence of files can take the store's
// versions faster than the clock, which reaches MaxVersion in about 270
// years.
var VersionEpoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	VersionRate = 1 << 20 // versions allowed per second
	VersionBase = 1 << 32 // versions allowed at the epoch
)

// VersionsAllowed returns the largest version a file named at "at" may
// carry. Names carry milliseconds, and so does the bound: a device judging
// a file by its own clock (see checkVersions) takes no version that a
// snapshot it names at that clock's time could not carry.
func VersionsAllowed(at time.Time) int64 {
	d := max(at.Truncate(time.Millisecond).Sub(VersionEpoch), 0)
	v := VersionBase + int64(d/time.Second)*VersionRate + int64(d%time.Second)*VersionRate/int64(time.Second)
	return min(v, MaxVersion)
}

// VersionTime returns when VersionsAllowed first reaches v: a whole
// millisecond.
func VersionTime(v int64) time.Time {
	if v <= VersionBase {
		return VersionEpoch
	}
	n := v - VersionBase
	t := VersionEpoch.Add(time.Duration(n/VersionRate)*time.Second + time.Duration((n%VersionRate)*int64(time.Second)/VersionRate)).Truncate(time.Millisecond)
	for VersionsAllowed(t) < v {
		t = t.Add(time.Millisecond)
	}
	return t
}

// Names of the engine's tables, which an app table may not use.
var reservedTables = map[string]bool{
	"sync_control": true, "sync_pending_log": true, "sync_pending_changes": true, "sync_states": true,
	"sync_meta": true, "sync_files": true, "sync_outbox": true, "sync_unwritten": true, "sync_tables": true, "sync_uploaded": true,
	"sync_immutable": true, "sync_placed": true,
}

// isIdent reports whether name is a plain identifier: a letter or an
// underscore, then letters, digits and underscores (ASCII only). Every
// record of a downloaded file names its table, so this is a loop, not a
// regular expression.
func isIdent(name string) bool {
	if name == "" || '0' <= name[0] && name[0] <= '9' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// CheckTableName reports whether name may be a synced table: a plain
// identifier that is neither SQLite's nor the engine's own. The same check
// guards table names read from remote files, before any SQL sees them.
func CheckTableName(name string) error {
	switch {
	case !isIdent(name) || len(name) > 128:
		return fmt.Errorf("table name %q is not a plain identifier (letters, digits, underscore)", name)
	case len(name) >= 7 && strings.EqualFold(name[:7], "sqlite_"):
		return fmt.Errorf("table name %q is reserved by SQLite", name)
	case reservedTables[strings.ToLower(name)]:
		return fmt.Errorf("table name %q is one of drivesync's own tables", name)
	}
	return nil
}

var deviceIDRE = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)

// CheckDeviceID keeps device ids safe inside file names.
func CheckDeviceID(id string) error {
	if !deviceIDRE.MatchString(id) {
		return fmt.Errorf("drivesync: device id %q must be 1-64 letters, digits or '-' (it is part of file names)", id)
	}
	return nil
}

// CheckRecordClock checks a record's state as checkClock does, and its
// delete's stamp. A record may be known only by its delete (a device that
// received the delete before the record's writes): no stamp but that one.
func CheckRecordClock(n *Node, devices map[string]bool) error {
	if !n.Gone.IsZero() {
		if err := checkStamp(n.Gone, devices); err != nil {
			return err
		}
		if n.Stamp.IsZero() && n.Kind == AbsentNode {
			return nil
		}
	}
	return checkClock(n, Stamp{Version: MaxVersion + 1}, devices)
}

// CheckStamp checks a stamp of a record's clock as CheckRecordClock does:
// its version in range and its device a valid id (devices caches the
// ids found valid).
func CheckStamp(s Stamp, devices map[string]bool) error { return checkStamp(s, devices) }

func checkStamp(s Stamp, devices map[string]bool) error {
	if s.Version < 1 || s.Version > MaxVersion {
		return fmt.Errorf("%w: version %d out of range", ErrBadClock, s.Version)
	}
	if !devices[s.Device] {
		if CheckDeviceID(s.Device) != nil {
			return fmt.Errorf("%w: device %q", ErrBadClock, s.Device)
		}
		devices[s.Device] = true
	}
	return nil
}

// checkClock checks what the merge rules guarantee of every state they
// build: stamps in range, a node's stamp not below its children's, a floor
// below its node's stamp and below every child kept over it.
func checkClock(n *Node, parent Stamp, devices map[string]bool) error {
	for _, s := range []Stamp{n.Stamp, n.Floor} {
		if s.IsZero() {
			continue
		}
		if err := checkStamp(s, devices); err != nil {
			return err
		}
	}
	if n.Stamp.IsZero() || parent.Less(n.Stamp) || (!n.Floor.IsZero() && !n.Floor.Less(n.Stamp)) {
		return fmt.Errorf("%w: stamps out of order", ErrBadClock)
	}
	for _, k := range n.Kids {
		if !n.Floor.IsZero() && !n.Floor.Less(k.Node.Stamp) {
			return fmt.Errorf("%w: a member older than its object's reset", ErrBadClock)
		}
		if err := checkClock(k.Node, n.Stamp, devices); err != nil {
			return err
		}
	}
	return nil
}

// ServerDevice reports whether device is one a sync server stamps its own
// writes with ("server-<store id>"), or the plain "server": no device
// may stamp writes with such an id.
func ServerDevice(device string) bool {
	return device == "server" || strings.HasPrefix(device, "server-")
}
