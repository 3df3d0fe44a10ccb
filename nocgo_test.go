//go:build !cgo

package drivesync

const haveCgo = false
