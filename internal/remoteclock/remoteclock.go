// Package remoteclock estimates a server's clock from the Date headers of
// its responses, for the remotes whose files are named by the server's
// time rather than the device's.
package remoteclock

import (
	"net/http"
	"sync"
	"time"
)

// Clock is a server's time, estimated from Date headers. They have whole
// seconds: each one narrows the estimate, never resets it, so the clock
// keeps millisecond steps. The zero value has no estimate yet.
type Clock struct {
	mu     sync.Mutex
	offset time.Duration // the server's time minus the local clock
	have   bool
}

// Note narrows the estimate from a response's header: when it says D,
// the server's time on arrival was within [D, D+1s).
func (c *Clock) Note(h http.Header) {
	d, err := http.ParseTime(h.Get("Date"))
	if err != nil {
		return
	}
	now := time.Now()
	low, high := d.Sub(now), d.Add(time.Second).Sub(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.have:
		c.offset, c.have = low, true
	case c.offset < low:
		c.offset = low
	case c.offset >= high:
		c.offset = high - time.Millisecond
	}
}

// Now returns the server's time as estimated so far, and whether any
// response had a Date header; without one, it returns the local time.
func (c *Clock) Now() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset).UTC(), c.have
}
