//go:build race

package drivesync

const raceEnabled = true
