package drivesync

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
