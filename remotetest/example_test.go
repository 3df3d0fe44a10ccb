package remotetest_test

import (
	"testing"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/remotetest"
)

// TestMemoryRemote is how a Remote's own tests run the suite: one call to
// Run, with a function that makes a new, empty Remote for each subtest.
// A Remote backed by real storage would make a new folder, bucket or
// prefix there, and remove it with t.Cleanup.
func TestMemoryRemote(t *testing.T) {
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		return drivesync.NewMemoryRemote()
	})
}
