//go:build cgo

package drivesync

// haveCgo: mattn/go-sqlite3 works (without cgo it registers a stub).
const haveCgo = true
