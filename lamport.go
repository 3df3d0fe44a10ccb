package drivesync

import (
	"strings"
	"time"
)

// maxVersion bounds the versions the engine reads and writes, far below
// the int64 limit. A device never stamps past it (Sync fails with a clear
// error instead): a broken or hostile file claiming a huge version can
// stop a store from taking changes, but can never make one device write
// files the others refuse, which would split them.
const maxVersion = 1 << 53

// Received versions are bounded by time. A file named at remote time T
// may carry no version above versionsAllowed(T): a base, plus a million
// (2^20) versions for every second since 2020. Versions grow by one per
// change, and no store makes a million changes a second, so honest files
// stay far below; a file above is broken or hostile and is rejected.
//
// Without such a bound, one file stamped near maxVersion would stop the
// store from stamping changes for good, on every device and through every
// snapshot. A bound relative to what each device has seen would split
// devices instead: one that is behind, or new, would refuse a file the
// others accepted, and with it every honest file stamped after it. The
// time bound depends only on the file and on the clock, which moves
// forward for every device: a file named in the future is refused until
// the device's clock reaches the time its versions need, and then taken
// by every device alike. No sequence of files can take the store's
// versions faster than the clock, which reaches maxVersion in about 270
// years.
var versionEpoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	versionRate = 1 << 20 // versions allowed per second
	versionBase = 1 << 32 // versions allowed at the epoch
)

// versionsAllowed returns the largest version a file named at "at" may
// carry. Names carry milliseconds, and so does the bound: a device judging
// a file by its own clock (see checkVersions) takes no version that a
// snapshot it names at that clock's time could not carry.
func versionsAllowed(at time.Time) int64 {
	d := max(at.Truncate(time.Millisecond).Sub(versionEpoch), 0)
	v := versionBase + int64(d/time.Second)*versionRate + int64(d%time.Second)*versionRate/int64(time.Second)
	return min(v, maxVersion)
}

// versionTime returns when versionsAllowed first reaches v: a whole
// millisecond.
func versionTime(v int64) time.Time {
	if v <= versionBase {
		return versionEpoch
	}
	n := v - versionBase
	t := versionEpoch.Add(time.Duration(n/versionRate)*time.Second + time.Duration((n%versionRate)*int64(time.Second)/versionRate)).Truncate(time.Millisecond)
	for versionsAllowed(t) < v {
		t = t.Add(time.Millisecond)
	}
	return t
}

// A stamp identifies one write: the Lamport version it was given and the
// device that made it. Stamps are totally ordered by version and then by
// device id, so two devices that stamp the same version still agree on a
// winner. Every write a device makes gets a version no other write of
// that device has, so a stamp names exactly one write.
type stamp struct {
	version int64
	device  string
}

func (a stamp) compare(b stamp) int {
	switch {
	case a.version < b.version:
		return -1
	case a.version > b.version:
		return 1
	}
	return strings.Compare(a.device, b.device)
}

func (a stamp) less(b stamp) bool { return a.compare(b) < 0 }

func (a stamp) isZero() bool { return a.version == 0 && a.device == "" }

// nextVersions hands out the versions of one sync's own changes: change i
// (in pending order) gets maxSeen+1+i. maxSeen is the largest version the
// device has seen anywhere — its synced state, the files it just
// downloaded, and versions it reserved for an earlier upload that may
// have reached the remote without being committed locally — so its own
// changes always order after everything it has seen ("git pull --rebase").
type versionCounter struct{ next int64 }

func newVersionCounter(maxSeen int64) *versionCounter {
	return &versionCounter{next: maxSeen + 1}
}

func (c *versionCounter) take() int64 {
	v := c.next
	c.next++
	return v
}

// last returns the largest version handed out so far (maxSeen if none).
func (c *versionCounter) last() int64 { return c.next - 1 }
