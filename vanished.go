package drivesync

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// Files that vanish. Sync tools lose files and users clean folders: a
// patch file can disappear from a shared folder before every device has
// read it, and nothing in a listing shows that it ever was there. So each
// device numbers the patch and merge files it publishes, 1, 2, 3, ... (a
// file's "seq"), and every device keeps the numbers whose content its
// synced state holds (sync_held), by device, as runs. A snapshot says in
// its header which numbers it holds ("holds").
//
// That makes a loss visible from both sides:
//
//   - A device that holds a number that no file on the remote carries and
//     no snapshot there holds knows the file vanished: compaction deletes
//     only files a snapshot on the remote holds (see snapshot.go). It
//     writes a snapshot, which holds the number, and reports the loss in
//     Report.Vanished. A device checks every number it holds when its
//     listing shows the whole remote (a shared folder always does; other
//     remotes once a day), and at every sync the files it holds that its
//     listing must show (those named after where it listed from).
//   - A device that lacks a number loads a snapshot that holds it (see
//     settleChecked), and until one comes, a number between two it holds
//     of the same device is reported as missing (Report.Missing,
//     Status.Missing): the file may still be on its way through a sync
//     tool, or lost.
//
// The writer's own files count like any other: it holds them. A number
// must never name two files, or one of them vanishing would go unnoticed
// while the other is listed: a database counts its files on, whatever its
// device id and store, and past every number of its id that its state
// holds (see lastFileSeq). So a device's numbers in a store may start
// anywhere, and only a number between two a device holds is missing. A
// merge file of another store (two devices that started stores at once
// and joined each other's) holds nothing for this one: its number is held
// when it is read. Files of engines that did not number them carry no
// seq, and snapshots of those engines hold no numbers.

// FileSpan names files of one device by the numbers that device gives the
// files it publishes (1, 2, 3, ...): First to Last.
type FileSpan struct {
	Device      string
	First, Last int64
}

// seqRun is a run of file numbers, first to last.
type seqRun struct{ first, last int64 }

// heldSet is a set of file numbers: for each device, sorted runs that
// neither overlap nor touch.
type heldSet map[string][]seqRun

// add adds the numbers first to last of device.
func (h heldSet) add(device string, first, last int64) {
	if first < 1 || last < first {
		return
	}
	runs := h[device]
	i, _ := slices.BinarySearchFunc(runs, first, func(r seqRun, n int64) int {
		switch {
		case r.last+1 < n:
			return -1
		case r.first > n:
			return 1
		}
		return 0
	})
	// runs[i] is the first run that ends at or after first-1.
	j := i
	for j < len(runs) && runs[j].first <= last+1 {
		first, last = min(first, runs[j].first), max(last, runs[j].last)
		j++
	}
	h[device] = slices.Replace(runs, i, j, seqRun{first, last})
}

// with adds number n of device (none if n is 0) and returns h.
func (h heldSet) with(device string, n int64) heldSet {
	h.add(device, n, n)
	return h
}

// clone returns a copy of h.
func (h heldSet) clone() heldSet {
	c := make(heldSet, len(h))
	for device, runs := range h {
		c[device] = slices.Clone(runs)
	}
	return c
}

// addAll adds every number of o.
func (h heldSet) addAll(o heldSet) {
	for device, runs := range o {
		for _, r := range runs {
			h.add(device, r.first, r.last)
		}
	}
}

// has reports whether h holds number n of device.
func (h heldSet) has(device string, n int64) bool {
	runs := h[device]
	i, found := slices.BinarySearchFunc(runs, n, func(r seqRun, n int64) int {
		switch {
		case r.last < n:
			return -1
		case r.first > n:
			return 1
		}
		return 0
	})
	return found && i < len(runs)
}

// minus returns the numbers of h that o does not hold.
func (h heldSet) minus(o heldSet) heldSet {
	out := heldSet{}
	for device, runs := range h {
		other := o[device]
		for _, r := range runs {
			first := r.first
			for _, x := range other {
				if x.last < first || x.first > r.last {
					continue
				}
				if x.first > first {
					out.add(device, first, x.first-1)
				}
				first = x.last + 1
			}
			if first <= r.last {
				out.add(device, first, r.last)
			}
		}
	}
	return out
}

// spans returns h's runs, by device.
func (h heldSet) spans() []FileSpan {
	var out []FileSpan
	for _, device := range slices.Sorted(maps.Keys(h)) {
		for _, r := range h[device] {
			out = append(out, FileSpan{device, r.first, r.last})
		}
	}
	return out
}

// gaps returns the numbers between the smallest and the largest of each
// device that h does not hold: files this device has not received although
// it has received earlier and later files of the same device. (A device's
// numbers in a store need not start at 1, see lastFileSeq.)
func (h heldSet) gaps() []FileSpan {
	var out []FileSpan
	for _, device := range slices.Sorted(maps.Keys(h)) {
		runs := h[device]
		for i := 1; i < len(runs); i++ {
			out = append(out, FileSpan{device, runs[i-1].last + 1, runs[i].first - 1})
		}
	}
	return out
}

// highest returns the largest number h holds of device (0: none).
func (h heldSet) highest(device string) int64 {
	runs := h[device]
	if len(runs) == 0 {
		return 0
	}
	return runs[len(runs)-1].last
}

// runs counts h's runs.
func (h heldSet) runs() int {
	n := 0
	for _, runs := range h {
		n += len(runs)
	}
	return n
}

// appendJSON appends h as a snapshot header holds it:
// {"<device>":[[first,last],...],...}, devices sorted.
func (h heldSet) appendJSON(b []byte) []byte {
	b = append(b, '{')
	for i, device := range slices.Sorted(maps.Keys(h)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, device)
		b = append(b, ':', '[')
		for j, r := range h[device] {
			if j > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, "[%d,%d]", r.first, r.last)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// parseHeld reads a heldSet as appendJSON writes it, refusing one of more
// than maxRuns runs, a device id no engine writes, and numbers out of
// range. Runs may come in any order.
func parseHeld(data []byte, maxRuns int64) (heldSet, error) {
	v, err := jsonv.ParseObject(data, jsonv.Options{})
	if err != nil {
		return nil, err
	}
	h := heldSet{}
	var n int64
	for _, m := range v.Members {
		if err := merge.CheckDeviceID(m.Key); err != nil {
			return nil, err
		}
		runs, err := jsonv.ParseArray(m.Value.Leaf, jsonv.Options{})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Key, err)
		}
		for _, r := range runs {
			if n++; n > maxRuns {
				return nil, fmt.Errorf("%w: more than %d runs", errTooLarge, maxRuns)
			}
			ends, err := jsonv.ParseArray(r.Leaf, jsonv.Options{})
			if err != nil || len(ends) != 2 {
				return nil, fmt.Errorf("%s: a run must be [first,last]", m.Key)
			}
			first, err1 := strconv.ParseInt(string(ends[0].Leaf), 10, 64)
			last, err2 := strconv.ParseInt(string(ends[1].Leaf), 10, 64)
			if err1 != nil || err2 != nil || first < 1 || last < first || last > maxFileSeq {
				return nil, fmt.Errorf("%s: run %s is not two file numbers, first to last", m.Key, r.Leaf)
			}
			h.add(m.Key, first, last)
		}
	}
	return h, nil
}

// heldText is h as sync_files.holds stores it: JSON, or NULL for nil.
func heldText(h heldSet) any {
	if h == nil {
		return nil
	}
	return string(h.appendJSON(nil))
}

// loadHeld reads sync_held.
func loadHeld(ctx context.Context, q querier) (heldSet, error) {
	rows, err := q.QueryContext(ctx, `SELECT device, first, last FROM sync_held`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	h := heldSet{}
	for rows.Next() {
		var device string
		var first, last int64
		if err := rows.Scan(&device, &first, &last); err != nil {
			return nil, err
		}
		h.add(device, first, last)
	}
	return h, rows.Err()
}

// holdAlso adds the numbers of add to sync_held, inside the caller's
// transaction.
func holdAlso(ctx context.Context, q querier, add heldSet) error {
	if add.runs() == 0 {
		return nil
	}
	h, err := loadHeld(ctx, q)
	if err != nil {
		return err
	}
	for device, runs := range add {
		before := slices.Clone(h[device])
		for _, r := range runs {
			h.add(device, r.first, r.last)
		}
		if slices.Equal(before, h[device]) {
			continue
		}
		if _, err := q.ExecContext(ctx, `DELETE FROM sync_held WHERE device = ?1`, device); err != nil {
			return err
		}
		for _, r := range h[device] {
			if _, err := q.ExecContext(ctx, `INSERT INTO sync_held (device, first, last) VALUES (?1, ?2, ?3)`, device, r.first, r.last); err != nil {
				return err
			}
		}
	}
	return nil
}

// missingFiles returns the files of other devices that this database has
// not received although it holds earlier and later files of the same
// device: lost from the remote, or still on their way. A sync takes them from a
// snapshot that holds them as soon as one is on the remote.
func missingFiles(ctx context.Context, q querier) ([]FileSpan, error) {
	h, err := loadHeld(ctx, q)
	if err != nil {
		return nil, err
	}
	return h.gaps(), nil
}

// lastFileSeq returns the last number this database gave a file
// (metaFileSeq). The count is the database's, whatever its device id and
// store: a number it gave never names another file, neither in a store
// it joins again, nor on a remote where its files from before it lost
// the race to start a store stay, nor under an id the app gives back.
// Another device id or store only starts its numbers higher than 1,
// which readers allow (see gaps).
func (s *syncRun) lastFileSeq(ctx context.Context) (int64, error) {
	return s.seqMeta(ctx, metaFileSeq)
}

// setLastFileSeq records n as the last number used, in the caller's
// transaction.
func (s *syncRun) setLastFileSeq(ctx context.Context, n int64) error {
	return setMeta(ctx, s.conn, metaFileSeq, strconv.FormatInt(n, 10))
}

// seqMeta reads a number kept in sync_meta under key (0 if none).
func (s *syncRun) seqMeta(ctx context.Context, key string) (int64, error) {
	v, err := getMeta(ctx, s.conn, key)
	if err != nil || v == "" {
		return 0, err
	}
	seq, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sync_meta %s: %q", key, v)
	}
	return seq, nil
}

// mergeSeq returns the number of the merge file a JoinRemote publishes:
// the next one, kept until the file is published (see maintain), so that
// a merge file written again after a failed upload takes the same number.
// Two such files may then be on the remote; either holds what the number
// stands for, and what the later one holds beyond the earlier came from
// files numbered themselves.
func (s *syncRun) mergeSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.inTx(ctx, func() error {
		var err error
		if seq, err = s.seqMeta(ctx, metaMergeSeq); err != nil || seq > 0 {
			return err
		}
		if seq, err = s.lastFileSeq(ctx); err != nil {
			return err
		}
		held, err := loadHeld(ctx, s.conn)
		if err != nil {
			return err
		}
		seq = max(seq, held.highest(s.e.deviceID)) + 1
		if err := s.setLastFileSeq(ctx, seq); err != nil {
			return err
		}
		return setMeta(ctx, s.conn, metaMergeSeq, strconv.FormatInt(seq, 10))
	})
	return seq, err
}

// heldNow is what this sync holds once it commits, by what the fetch
// found: the numbers held before, those of the files downloaded, and
// those the snapshots loaded hold.
func (f *fetched) heldNow() heldSet {
	h := heldSet{}
	h.addAll(f.held)
	h.addAll(f.gained())
	return h
}

// gained returns the numbers the files this sync applies bring.
func (f *fetched) gained() heldSet {
	h := heldSet{}
	for _, d := range f.files {
		if d.seq > 0 {
			_, _, device, _ := parseFileName(d.name)
			h.add(device, d.seq, d.seq)
		}
		h.addAll(d.holds)
	}
	return h
}

// findVanished looks for numbers this device holds that no file on the
// remote carries and no snapshot there holds (see the top of this file),
// once the downloads are done. With a listing of the whole remote it
// checks every number held; with a listing since the cursor, the files
// it holds that were named after where the listing started, which the
// listing must show. A file known by name is opened before it is taken
// for lost: a listing may lag.
func (f *fetcher) findVanished(ctx context.Context) error {
	complete := f.l.since.IsZero() || listsEverything(f.e.cfg.Remote)
	present := heldSet{}
	byNumber := map[fileNumber]string{}
	for name, k := range f.out.ledger {
		_, _, device, ok := parseFileName(name)
		if !ok {
			continue
		}
		if k.seq > 0 {
			byNumber[fileNumber{device, k.seq}] = name
			if f.out.listed[name] {
				present.add(device, k.seq, k.seq)
			}
		}
		// A listing since the cursor does not show old snapshots: those
		// known are taken as there (the daily listing of everything
		// checks them).
		if k.holds != nil && (f.out.listed[name] || !complete) {
			present.addAll(k.holds)
		}
	}
	for name, h := range f.headers {
		if f.out.listed[name] || !complete {
			present.addAll(h.holds)
		}
	}
	present.addAll(f.out.gained())
	var candidates heldSet
	if complete {
		candidates = f.out.held.minus(present)
	} else {
		candidates = heldSet{}
		for name, k := range f.out.ledger {
			_, at, device, ok := parseFileName(name)
			if ok && k.held() && k.seq > 0 && !f.out.listed[name] && !at.Before(f.l.since) {
				candidates.add(device, k.seq, k.seq)
			}
		}
		candidates = candidates.minus(present)
	}
	if candidates.runs() > 0 && complete {
		// Snapshots whose headers were read before the engine kept what
		// they hold: read once more.
		for name, k := range f.out.ledger {
			if kind, _, _, _ := parseFileName(name); kind != kindSnapshot || k.holds != nil || !f.out.listed[name] {
				continue
			}
			h, ok, err := f.readableHeader(ctx, name)
			if err != nil {
				return err
			}
			if ok {
				candidates = candidates.minus(h.holds)
			}
		}
	}
	// The numbers known by name are checked one by one; the others are
	// taken run by run, however long a run a header claimed.
	known := map[string][]int64{}
	for n := range byNumber {
		known[n.device] = append(known[n.device], n.seq)
	}
	for _, seqs := range known {
		slices.Sort(seqs)
	}
	for _, sp := range candidates.spans() {
		gone := heldSet{}
		gone.add(sp.Device, sp.First, sp.Last)
		there := heldSet{}
		seqs := known[sp.Device]
		for _, n := range seqs {
			if n < sp.First || n > sp.Last {
				continue
			}
			name := byNumber[fileNumber{sp.Device, n}]
			rc, err := f.e.cfg.Remote.Open(ctx, name) // whether it is there, not what it holds
			switch {
			case err == nil:
				rc.Close()
				there.add(sp.Device, n, n) // there after all: the listing lags
				continue
			case unreadableFile(ctx, err):
				there.add(sp.Device, n, n) // there, and refused to this device
				continue
			case !errors.Is(err, fs.ErrNotExist):
				return remoteErr("download", name, err)
			}
			f.e.log.Warn("drivesync: a file this device holds is gone from the remote, and nothing there holds it; writing a snapshot that does", "file", name)
		}
		for _, r := range gone.minus(there).spans() {
			if r.First != r.Last || !slices.Contains(seqs, r.First) { // not named above
				f.e.log.Warn("drivesync: files this device holds are gone from the remote, and nothing there holds them; writing a snapshot that does", "device", r.Device, "first", r.First, "last", r.Last)
			}
			f.out.vanished.add(r.Device, r.First, r.Last)
		}
	}
	return nil
}

// maxFileSeq bounds the file numbers a device takes from a file or a
// snapshot's header: a device numbers its own files on past the numbers
// of its id that it holds (see plan), which must never pass int64's range.
const maxFileSeq = 1 << 62

// fileNumber is one file's number.
type fileNumber struct {
	device string
	seq    int64
}

// listsEverything reports whether r's listings always show the whole
// remote, whatever since says (a shared folder's do).
func listsEverything(r Remote) bool {
	l, ok := r.(interface{ listsEverything() bool })
	return ok && l.listsEverything()
}

// fullListingEvery is how often a device whose remote lists files since a
// time lists the whole remote instead, to check that nothing it holds has
// vanished (see findVanished).
const fullListingEvery = 24 * time.Hour

// healVanished writes the snapshot that holds the files this sync found
// vanished, so that every device that lacks them takes them from it. A
// snapshot that cannot be written (too large for the store's limits) is
// tried again a day later, not at every sync.
func (s *syncRun) healVanished(ctx context.Context, l *listing, f *fetched) (bool, error) {
	if f.vanished.runs() == 0 {
		return false, nil
	}
	s.report.Vanished = f.vanished.spans()
	failed, err := getMeta(ctx, s.conn, metaHealFailed)
	if err != nil {
		return false, &Error{Op: "snapshot", Err: err}
	}
	if at, err := time.Parse(time.RFC3339Nano, failed); err == nil && l.cursor.Sub(at) < fullListingEvery {
		return false, nil
	}
	return true, nil
}

// noteHealFailed records that a snapshot healing vanished files could not
// be written.
func (s *syncRun) noteHealFailed(ctx context.Context, l *listing) error {
	return s.setMetas(ctx, metaHealFailed, l.cursor.UTC().Format(time.RFC3339Nano))
}
