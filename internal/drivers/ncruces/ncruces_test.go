// Package ncruces_test runs the driver suite on
// github.com/ncruces/go-sqlite3 (SQLite compiled to Go, no cgo). It has a
// package of its own because github.com/mattn/go-sqlite3 registers the
// same database/sql name.
package ncruces_test

import (
	"fmt"
	"testing"
	"time"

	_ "github.com/ncruces/go-sqlite3/driver"

	"github.com/drivesync/drivesync/internal/drivertest"
)

// dsn spells the README's pragmas as ncruces/go-sqlite3 takes them; the
// busy timeout comes first, as that driver asks. Naming any pragma
// replaces the driver's default busy timeout of a minute.
func dsn(path string, busyTimeout time.Duration) string {
	return fmt.Sprintf("file:%s?_pragma=busy_timeout(%d)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate",
		path, busyTimeout.Milliseconds())
}

func TestDriver(t *testing.T) {
	drivertest.Run(t, drivertest.Driver{Name: "sqlite3", DSN: dsn})
}
