package drivesync

import "strings"

// maxVersion bounds the versions the engine reads and writes, far below
// the int64 limit. A device never stamps past it (Sync fails with a clear
// error instead): a broken or hostile file claiming a huge version can
// stop a store from taking changes, but can never make one device write
// files the others refuse, which would split them.
const maxVersion = 1 << 53

// maxJump bounds how far above the largest version a device has seen a
// received version may be. Versions grow by one per change, so an honest
// file is never that far ahead: one that jumps more is broken or hostile,
// and is rejected. Without this bound one file stamped near maxVersion
// would stop the store from stamping changes for good, on every device
// and through every snapshot. With it, the largest version a device holds
// grows by at most maxJump per sync: reaching maxVersion would take two
// million syncs that each accept a hostile file.
//
// The bound is relative, so two devices that have seen different things
// may judge a file near it differently. A file rejected for its jump is
// therefore read again once the device's own largest version has grown
// (see retryDue): a device that was behind catches up as it receives
// honest files. A device with no state at all takes the snapshot it
// starts from as it is.
const maxJump = 1 << 32

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
