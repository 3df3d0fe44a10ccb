package drivesync

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

// TestReview32ReadAheadMatchesLoop compares readAhead with the plain loop
// it replaced, over counts around the batch bounds, every place a read
// error or an fn error can fall, and sizes that end batches by bytes.
// Each case also checks that read has returned when readAhead does.
func TestReview32ReadAheadMatchesLoop(t *testing.T) {
	counts := []int{0, 1, 2, 255, 256, 257, 511, 512, 513, 1030}
	for _, n := range counts {
		for _, big := range []bool{false, true} {
			pos := map[int]bool{-1: true, 0: true, 1: true, n - 1: true, n: true, 255: true, 256: true, 257: true, n / 2: true}
			for rErr := range pos {
				if rErr < -1 || rErr > n {
					continue
				}
				for fErr := range pos {
					if fErr < -1 || fErr >= n {
						continue
					}
					name := fmt.Sprintf("n%d big%v read%d fn%d", n, big, rErr, fErr)
					readE := errors.New("read")
					fnE := errors.New("fn")
					size := func(i int) int {
						if big && i%3 == 0 {
							return aheadBytes
						}
						return 10
					}
					// The loop: items 0..n-1, read failing before item rErr.
					var want []int
					var wantErr error
					for i := 0; ; i++ {
						if i == rErr {
							wantErr = readE
							break
						}
						if i == n {
							break
						}
						want = append(want, i)
						if i == fErr {
							wantErr = fnE
							break
						}
					}
					var got []int
					var readDone atomic.Bool
					var sent, maxAhead atomic.Int64
					err := readAhead(func(send func(int, int) bool) error {
						defer readDone.Store(true)
						for i := 0; ; i++ {
							if i == rErr {
								return readE
							}
							if i == n {
								return nil
							}
							sent.Add(1)
							if !send(i, size(i)) {
								return nil
							}
						}
					}, func(p *int) error {
						if a := sent.Load() - int64(len(got)); a > maxAhead.Load() {
							maxAhead.Store(a)
						}
						got = append(got, *p)
						if *p == fErr {
							return fnE
						}
						return nil
					})
					if !readDone.Load() {
						t.Fatalf("%s: readAhead returned before read", name)
					}
					if err != wantErr {
						t.Fatalf("%s: error %v, want %v", name, err, wantErr)
					}
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Fatalf("%s: fn had %v, want %v", name, got, want)
					}
					if maxAhead.Load() > 4*aheadItems {
						t.Fatalf("%s: read %d items ahead", name, maxAhead.Load())
					}
				}
			}
		}
	}
}

// TestReview32SpoolAddAfterStoppedReplay: a replay stopped by fn (or by a
// cut read) leaves the spool's file at its end, so that a change added
// after it follows the others and a whole replay sees every one once.
func TestReview32SpoolAddAfterStoppedReplay(t *testing.T) {
	sp, err := newSpool(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	const n = 600
	for i := range n {
		if err := sp.add(readAheadChange(i)); err != nil {
			t.Fatal(err)
		}
	}
	stop := errors.New("stop")
	total := n
	for _, at := range []int{0, 1, 255, 256, 257, n - 1} {
		k := 0
		if err := sp.each(func(c fileChange) error {
			if k == at {
				return stop
			}
			k++
			return nil
		}); err != stop {
			t.Fatal(err)
		}
		if err := sp.add(readAheadChange(total)); err != nil {
			t.Fatal(err)
		}
		total++
		k = 0
		if err := sp.each(func(c fileChange) error {
			if c.record != readAheadChange(k).record {
				t.Fatalf("change %d is %s", k, c.record)
			}
			k++
			return nil
		}); err != nil || k != total {
			t.Fatalf("after stop at %d: %d of %d, err %v", at, k, total, err)
		}
	}
}
