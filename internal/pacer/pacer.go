// Package pacer retries calls to a rate-limited service with exponential
// backoff and jitter, honouring the delay the service asks for, until the
// context is done. Deciding which errors are worth a retry is the caller's
// job (see drive.go's classify); waiting is this package's.
package pacer

import (
	"context"
	"math/rand/v2"
	"time"
)

// Pacer retries calls. The zero value is not usable; use New.
type Pacer struct {
	MinSleep, MaxSleep time.Duration
	MaxAttempts        int
	sleep              func(ctx context.Context, d time.Duration) error // replaced in tests
}

// New returns a Pacer that waits MinSleep after the first failure,
// doubling up to MaxSleep, for at most attempts calls.
func New(minSleep, maxSleep time.Duration, attempts int) *Pacer {
	return &Pacer{MinSleep: minSleep, MaxSleep: maxSleep, MaxAttempts: attempts, sleep: sleepCtx}
}

// Retry tells Call how a failed attempt went.
type Retry struct {
	Again bool          // the failure is transient: try again
	After time.Duration // the service asked to wait this long (Retry-After); 0 if it did not
}

// Call runs fn until it succeeds, fails for good, the attempts are used
// up, or ctx is done. classify is asked about every error fn returns.
// The last error is returned; a context error wins once ctx is done.
func (p *Pacer) Call(ctx context.Context, fn func() error, classify func(error) Retry) error {
	backoff := p.MinSleep
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r := classify(err)
		if !r.Again || attempt >= p.MaxAttempts {
			return err
		}
		// Full jitter keeps devices that failed together from retrying
		// together; a Retry-After from the service is a floor.
		wait := time.Duration(rand.Int64N(int64(backoff) + 1))
		wait = max(wait, r.After)
		if err := p.sleep(ctx, wait); err != nil {
			return err
		}
		backoff = min(backoff*2, p.MaxSleep)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
