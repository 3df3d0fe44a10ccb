//go:build !race

package drivesync

const raceEnabled = false
