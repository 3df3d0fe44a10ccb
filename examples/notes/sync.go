package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/examples/internal/notesapp"
)

// progressBar shows a sync's progress on a terminal as one line redrawn
// in place, and elsewhere as plain lines ("download 3/12 files"), the
// first and the last of each step.
type progressBar struct {
	mu     sync.Mutex
	w      io.Writer
	tty    bool
	server bool               // syncing through a sync server: its download pulls changes, not files
	drawn  bool               // a bar is on the terminal's last line
	shown  drivesync.Progress // the latest update
	held   string             // the step's latest plain line, printed when it ends
	last   string             // the last plain line printed, not to repeat it
}

// newProgressBar returns a bar writing to w; server says the sync goes
// through a sync server.
func newProgressBar(w io.Writer, server bool) *progressBar {
	f, ok := w.(*os.File)
	return &progressBar{w: w, tty: ok && term.IsTerminal(int(f.Fd())), server: server}
}

// show is a Config.Progress.
func (b *progressBar) show(p drivesync.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.Step == "list" {
		return
	}
	prev := b.shown
	b.shown = p
	if !b.tty {
		// Which update is a step's last shows only when the next step
		// starts, or the sync ends (done). A step may start again from
		// 0 (a snapshot's download, then the files').
		line := p.Step + " " + b.counts(p)
		moved := func(p drivesync.Progress) bool { return p.Done > 0 || p.Bytes > 0 || p.Records > 0 }
		if p.Step == prev.Step && (moved(p) || !moved(prev)) {
			b.held = line
			return
		}
		b.flush()
		b.print(line)
		return
	}
	frac := 0.0
	switch {
	case p.TotalBytes > 0:
		frac = float64(p.Bytes) / float64(p.TotalBytes)
	case p.TotalRecords > 0:
		frac = float64(p.Records) / float64(p.TotalRecords)
	case p.Total > 0:
		frac = float64(p.Done) / float64(p.Total)
	}
	frac = min(max(frac, 0), 1)
	const width = 30
	n := int(frac * width)
	detail := b.counts(p)
	if p.TotalBytes > 0 {
		detail += fmt.Sprintf(", %s of %s", size(p.Bytes), size(p.TotalBytes))
	}
	fmt.Fprintf(b.w, "\r\033[K%-8s [%s%s] %s", p.Step, strings.Repeat("#", n), strings.Repeat(".", width-n), detail)
	b.drawn = true
}

// counts says how far a step has come: the changes, when it knows how
// many it moves (an apply, an upload, a sync server's pull at its end),
// else the files (a download of files, of none when nothing is new),
// else the changes so far (a sync server's pull, whose total only its
// last page tells).
func (b *progressBar) counts(p drivesync.Progress) string {
	switch {
	case p.TotalRecords > 0:
		return fmt.Sprintf("%d/%d changes", p.Records, p.TotalRecords)
	case p.Total > 0:
		return fmt.Sprintf("%d/%d files", p.Done, p.Total)
	case b.server && p.Step == "download" || p.Records > 0:
		return fmt.Sprintf("%d changes", p.Records)
	}
	return fmt.Sprintf("%d files", p.Done)
}

// flush prints the held line of the step shown: its last update.
func (b *progressBar) flush() {
	if b.held != "" {
		b.print(b.held)
		b.held = ""
	}
}

func (b *progressBar) print(line string) {
	if line != b.last {
		fmt.Fprintln(b.w, line)
		b.last = line
	}
}

// done ends the bar's line, or prints the last step's last plain line,
// so that what follows starts on its own.
func (b *progressBar) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.drawn {
		fmt.Fprint(b.w, "\r\033[K")
		b.drawn = false
	}
	b.flush()
	b.shown, b.last = drivesync.Progress{}, ""
}

func size(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// printStatus prints what Engine.Status says, and how many conflicts
// notes conflicts lists.
func printStatus(ctx context.Context, w io.Writer, a *notesapp.App) error {
	st, err := a.Engine.Status(ctx)
	if err != nil {
		return err
	}
	conflicts, err := a.Conflicts(ctx)
	if err != nil {
		return err
	}
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.Local().Format("2006-01-02 15:04:05") + fmt.Sprintf(" (%s ago)", time.Since(t).Round(time.Second))
	}
	fmt.Fprintf(w, "device      %s\n", st.DeviceID)
	fmt.Fprintf(w, "pending     %s\n", notesapp.Plural(st.Pending, "note"))
	if st.OutboxWaiting {
		fmt.Fprintln(w, "outbox      an upload waits: the next sync sends it first")
	}
	fmt.Fprintf(w, "last sync   %s\n", ago(st.LastSync))
	if st.LastError != "" {
		fmt.Fprintf(w, "  failed:   %s\n", st.LastError)
		fmt.Fprintf(w, "last good   %s\n", ago(st.LastSuccess))
	}
	store := st.Store
	if store == "" {
		store = "none yet (the first sync creates or joins one)"
	}
	fmt.Fprintf(w, "store       %s\n", store)
	if st.Remote != "" {
		fmt.Fprintf(w, "remote      %s\n", st.Remote)
	}
	if st.Encrypted {
		fmt.Fprintln(w, "encrypted   yes")
	}
	if st.RemoteBytes >= 0 {
		fmt.Fprintf(w, "remote size %s (as of %s)\n", size(st.RemoteBytes), ago(st.RemoteBytesAt))
	}
	if st.ClockKnown {
		fmt.Fprintf(w, "clock       %v from the remote's\n", st.ClockOffset.Round(time.Millisecond))
	}
	if st.ClockWarning != "" {
		fmt.Fprintf(w, "warning     %s\n", st.ClockWarning)
	}
	if len(conflicts) > 0 {
		fmt.Fprintf(w, "conflicts   %d (run notes conflicts)\n", len(conflicts))
	}
	return nil
}

// printConflicts lists the conflict log.
func printConflicts(ctx context.Context, w io.Writer, a *notesapp.App) error {
	cs, err := a.Conflicts(ctx)
	if err != nil {
		return err
	}
	if len(cs) == 0 {
		fmt.Fprintln(w, "no conflicts")
		return nil
	}
	for _, c := range cs {
		fmt.Fprintf(w, "%d  note %s  %s: yours %s, theirs %s (from %s, %s)\n", c.ID, c.Record, strings.Join(c.Path, "."), c.Loser, c.Winner, c.WinnerDevice, c.At.Local().Format("2006-01-02 15:04"))
	}
	fmt.Fprintln(w, `keep yours with "notes resolve ID mine", theirs with "notes resolve ID theirs"`)
	return nil
}

// resolve resolves conflict id with "mine" or "theirs".
func resolve(ctx context.Context, w io.Writer, a *notesapp.App, id, keep string) error {
	var n int64
	if _, err := fmt.Sscan(id, &n); err != nil {
		return fmt.Errorf("conflict id %q is not a number (run notes conflicts)", id)
	}
	how := map[string]drivesync.Resolution{"mine": drivesync.KeepLoser, "theirs": drivesync.KeepWinner}
	r, ok := how[keep]
	if !ok {
		return fmt.Errorf("resolve %s %s: say mine or theirs", id, keep)
	}
	if err := a.Resolve(ctx, n, r); err != nil {
		return err
	}
	if r == drivesync.KeepLoser {
		fmt.Fprintln(w, "your value is back; the next sync sends it")
	} else {
		fmt.Fprintln(w, "dismissed")
	}
	return nil
}

// watch syncs by itself until ctx is done (Ctrl-C), printing each sync's
// result; Enter on standard input syncs at once.
func watch(ctx context.Context, w io.Writer, e *drivesync.Engine, bar *progressBar, opts options) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan struct{})
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			select {
			case lines <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case <-lines:
				e.SyncNow()
			case <-ctx.Done():
				return
			}
		}
	}()
	fmt.Fprintln(w, "syncing by itself; press Enter to sync now, Ctrl-C to stop")
	return e.AutoSync(ctx, drivesync.AutoSyncOptions{
		Interval: time.Minute,
		OnSync: func(r drivesync.Report, err error) {
			bar.done()
			stamp := time.Now().Format("15:04:05")
			if err != nil {
				fmt.Fprintf(w, "%s  sync failed: %v\n", stamp, advise(ctx, e, opts, err))
				return
			}
			fmt.Fprintf(w, "%s  %s\n", stamp, notesapp.Summary(r))
		},
	})
}
