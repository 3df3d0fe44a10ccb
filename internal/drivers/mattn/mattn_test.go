//go:build cgo

// Package mattn_test runs the driver suite on github.com/mattn/go-sqlite3,
// which needs cgo. It has a package of its own because
// github.com/ncruces/go-sqlite3 registers the same database/sql name.
package mattn_test

import (
	"fmt"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/drivesync/drivesync/internal/drivertest"
)

// dsn spells the README's pragmas as mattn/go-sqlite3 takes them.
func dsn(path string, busyTimeout time.Duration) string {
	return fmt.Sprintf("file:%s?_journal_mode=WAL&_busy_timeout=%d&_synchronous=NORMAL&_txlock=immediate",
		path, busyTimeout.Milliseconds())
}

func TestDriver(t *testing.T) {
	drivertest.Run(t, drivertest.Driver{Name: "sqlite3", DSN: dsn})
}
