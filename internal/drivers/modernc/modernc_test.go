// Package modernc_test runs the driver suite on modernc.org/sqlite, the
// driver of the engine's own tests, on both devices: the baseline the
// other drivers' runs compare with.
package modernc_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/drivertest"
)

func dsn(path string, busyTimeout time.Duration) string {
	return fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate",
		path, busyTimeout.Milliseconds())
}

func TestDriver(t *testing.T) {
	drivertest.Run(t, drivertest.Driver{Name: "sqlite", DSN: dsn})
}
