package drivesync

import (
	"io"
	"sync/atomic"
	"time"
)

// Progress reports how far a sync has come, for a progress bar. It comes
// at the start and the end of each step, and between them as files,
// bytes and records move, at most about 20 times a second.
//
// Each count has its total beside it, told by the step's first update:
// a bar can fill against whichever the step moves (bytes when TotalBytes
// is set, else records when TotalRecords is, else files). A total of 0
// is one the step does not know yet (or nothing to move); it is never
// negative. The step's last update has every count at its total, an
// unknown total then being what the step moved.
//
// A snapshot that a sync loads (a new device starts from one) is a
// download of its own, one file, before the download of the files after
// it, which starts again from 0: only the snapshot tells which files
// the sync still needs.
type Progress struct {
	Step string // "list", "download", "upload" or "apply"
	// Done counts the files done in this step, of Total. The apply step
	// counts this device's own changes as one more; through a Server,
	// which moves no files, the download's are 0 and the upload counts
	// its pushes.
	Done  int
	Total int
	// Bytes counts the bytes downloaded or uploaded so far in this step,
	// TotalBytes those the step will move (0 when unknown: a remote that
	// lists no sizes, a server's pages). A download counts the files'
	// bytes as the remote lists them, an upload as this device wrote
	// them, before an encrypted store seals them. A file rejected unread
	// or read in part counts whole once the sync is past it; a file a
	// Remote sends again is counted again from its start.
	Bytes, TotalBytes int64
	// Records counts the changes applied so far ("apply": this device's
	// own, then those received), sent ("upload") or pulled from a Server
	// ("download"); TotalRecords is the changes the step moves. A pull
	// knows its total only when its last page came: 0 until the step's
	// last update.
	Records      int
	TotalRecords int
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

// progressStart begins step, which moves files files, bytes bytes and
// records records (0: unknown, or none). Its update always goes.
func (e *Engine) progressStart(step string, files int, bytes int64, records int) {
	e.meter.p = Progress{Step: step, Total: files, TotalBytes: bytes, TotalRecords: records}
	e.emitProgress(true)
}

// progressFile moves the step to its done-th file.
func (e *Engine) progressFile(done int) {
	if e.meter.p.Done == done {
		return // nothing new
	}
	e.meter.p.Done = done
	e.emitProgress(false)
}

// progressBytes adds n bytes moved in the current step.
func (e *Engine) progressBytes(n int64) {
	e.meter.p.Bytes += n
	e.emitProgress(false)
}

// progressRest counts as moved what the step has not counted of a file
// of size bytes (-1: unknown) whose reading started when the step had
// moved from: a file rejected before or while it was read is behind the
// sync all the same.
func (e *Engine) progressRest(from, size int64) {
	if rest := from + size - e.meter.p.Bytes; size > 0 && rest > 0 {
		e.progressBytes(rest)
	}
}

// progressRecords adds n changes moved in the current step. Counted one
// at a time, an update goes every 64: reading the clock for each is
// waste.
func (e *Engine) progressRecords(n int) {
	before := e.meter.p.Records
	e.meter.p.Records += n
	if n > 1 || before/64 != e.meter.p.Records/64 {
		e.emitProgress(false)
	}
}

// progressEnd ends the step, with every file done and the totals it did
// not know at its start set to what it moved. Its update always goes.
func (e *Engine) progressEnd() {
	p := &e.meter.p
	p.Done = p.Total
	if p.TotalBytes == 0 {
		p.TotalBytes = p.Bytes
	}
	if p.TotalRecords == 0 {
		p.TotalRecords = p.Records
	}
	e.emitProgress(true)
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
