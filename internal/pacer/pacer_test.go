package pacer

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errTransient = errors.New("transient")
var errFatal = errors.New("fatal")

func classify(err error) Retry {
	return Retry{Again: errors.Is(err, errTransient), After: 0}
}

func TestCall(t *testing.T) {
	var waits []time.Duration
	p := New(10*time.Millisecond, 40*time.Millisecond, 6)
	p.sleep = func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }

	calls := 0
	err := p.Call(context.Background(), func() error {
		calls++
		if calls < 4 {
			return errTransient
		}
		return nil
	}, classify)
	if err != nil || calls != 4 || len(waits) != 3 {
		t.Fatalf("err %v, calls %d, waits %v; want success on the 4th call after 3 waits", err, calls, waits)
	}
	for i, w := range waits {
		if limit := min(10*time.Millisecond<<i, 40*time.Millisecond); w < 0 || w > limit {
			t.Errorf("wait %d = %v, want within [0, %v]", i, w, limit)
		}
	}

	calls = 0
	if err := p.Call(context.Background(), func() error { calls++; return errFatal }, classify); !errors.Is(err, errFatal) || calls != 1 {
		t.Fatalf("fatal: err %v after %d calls, want errFatal after 1", err, calls)
	}

	calls = 0
	if err := p.Call(context.Background(), func() error { calls++; return errTransient }, classify); !errors.Is(err, errTransient) || calls != 6 {
		t.Fatalf("attempts: err %v after %d calls, want errTransient after 6", err, calls)
	}
}

func TestRetryAfterIsAFloor(t *testing.T) {
	var waits []time.Duration
	p := New(time.Millisecond, time.Millisecond, 3)
	p.sleep = func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	p.Call(context.Background(), func() error { return errTransient }, func(error) Retry { return Retry{Again: true, After: 2 * time.Second} })
	for _, w := range waits {
		if w < 2*time.Second {
			t.Fatalf("waited %v, want at least the Retry-After of 2s", w)
		}
	}
}

func TestContextBoundsWaiting(t *testing.T) {
	p := New(time.Hour, time.Hour, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Call(ctx, func() error { return errTransient }, func(error) Retry { return Retry{Again: true, After: time.Hour} })
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Fatalf("got %v after %v, want the deadline promptly", err, time.Since(start))
	}
}
