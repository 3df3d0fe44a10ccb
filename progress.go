package drivesync

import (
	"io"
	"sync/atomic"
	"time"
)

// Progress reports how far a sync has come, for a progress bar. It comes
// at the start and the end of each step, and between them as files,
// bytes and records move, at most about 20 times a second.
type Progress struct {
	Step  string // "list", "download", "upload" or "apply"
	Done  int    // files done in this step
	Total int    // files in this step
	// Bytes counts the bytes downloaded or uploaded so far in this step,
	// TotalBytes those the step will move (0 when unknown: a remote that
	// lists no sizes, a server's pages).
	Bytes, TotalBytes int64
	// Records counts the changes applied so far ("apply").
	Records int
}

// Progress updates are paced by a token bucket: a burst of progressBurst,
// then progressRate a second. A step's first and last updates always go.
const (
	progressRate  = 20
	progressBurst = 5
)

// meter paces one sync's progress updates.
type meter struct {
	p      Progress
	tokens float64
	at     time.Time // when tokens was last topped up
}

// progress moves the sync to a step's done-th file of total.
func (e *Engine) progress(step string, done, total int) {
	m := &e.meter
	switch {
	case m.p.Step != step:
		m.p = Progress{Step: step}
	case m.p.Done == done && m.p.Total == total:
		return // nothing new
	}
	m.p.Done, m.p.Total = done, total
	e.emitProgress(done == 0 || done == total)
}

// progressBytes adds n bytes moved in the current step.
func (e *Engine) progressBytes(n int64) {
	e.meter.p.Bytes += n
	e.emitProgress(false)
}

// progressTotalBytes sets the bytes the current step will move.
func (e *Engine) progressTotalBytes(n int64) { e.meter.p.TotalBytes = n }

// progressRecords adds n applied changes.
func (e *Engine) progressRecords(n int) {
	e.meter.p.Records += n
	if e.meter.p.Records%64 == 0 { // reading the clock for each is waste
		e.emitProgress(false)
	}
}

// meterHook, set only by this package's tests, sees every progress
// update before the rate limit drops most of them.
var meterHook func(e *Engine)

func (e *Engine) emitProgress(force bool) {
	if e.cfg.Progress == nil {
		return
	}
	if meterHook != nil {
		meterHook(e)
	}
	m := &e.meter
	now := time.Now()
	if m.at.IsZero() {
		m.tokens = progressBurst
	} else {
		m.tokens = min(progressBurst, m.tokens+now.Sub(m.at).Seconds()*progressRate)
	}
	m.at = now
	if m.tokens < 1 && !force {
		return
	}
	m.tokens = max(m.tokens-1, 0)
	e.cfg.Progress(m.p)
}

// progressReader counts the bytes read through it as the current step's.
// A decoder reads ahead on a goroutine of its own (see
// jsonStream.elements), and Progress runs on the syncing goroutine: the
// bytes wait in unread until the syncing goroutine calls report.
type progressReader struct {
	r      io.Reader
	e      *Engine
	unread atomic.Int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.unread.Add(int64(n))
	return n, err
}

// report counts the bytes read since the last report. Only the syncing
// goroutine calls it.
func (p *progressReader) report() {
	if n := p.unread.Swap(0); n > 0 {
		p.e.progressBytes(n)
	}
}
