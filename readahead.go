package drivesync

// Reading ahead. A sync's loops that read (a downloaded file's changes, a
// spool's, the pending records) and the work done with what they read
// (checking, spooling, diffing, writing to SQLite) take about as long
// each, and a second core can do one while the first does the other.

// readAhead calls fn, on the caller's goroutine, with every item read
// sends, in order, while read runs ahead on a goroutine of its own, by at
// most four batches (two waiting, one being filled, one fn is taking). A
// batch holds at most aheadItems items and about aheadBytes bytes, as
// send's size reckons them: what is read ahead stays small, whatever the
// items' size. read's error ends the loop once fn has had the items sent
// before it, and is returned. fn's first error ends it too: read's next
// send returns false, and read must return at once. Either way read has
// returned when readAhead does, so whatever it read from is the caller's
// again.
func readAhead[T any](read func(send func(item T, size int) bool) error, fn func(*T) error) error {
	type batch struct {
		items []T
		err   error // read's, ending the loop
	}
	batches := make(chan batch, 2)
	stop := make(chan struct{})
	go func() {
		defer close(batches)
		var b batch
		n := 0
		stopped := func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}
		flush := func() bool {
			select {
			case batches <- b:
				b, n = batch{}, 0
				return !stopped() // fn may have failed while this waited
			case <-stop:
				return false
			}
		}
		send := func(item T, size int) bool {
			if stopped() {
				return false
			}
			b.items = append(b.items, item)
			if n += size; len(b.items) < aheadItems && n < aheadBytes {
				return true
			}
			return flush()
		}
		if b.err = read(send); len(b.items) > 0 || b.err != nil {
			flush()
		}
	}()
	for b := range batches {
		for i := range b.items {
			if err := fn(&b.items[i]); err != nil {
				close(stop)
				for range batches { // until read has returned
				}
				return err
			}
		}
		if b.err != nil {
			return b.err // read returned before sending it
		}
	}
	return nil
}

// aheadItems and aheadBytes bound a batch of readAhead.
const (
	aheadItems = 256
	aheadBytes = 256 << 10
)
