package drivesync

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"
)

// Catching up from snapshots, the part of the fetch phase that reads them:
// a device with no state starts from the newest snapshot (bootstrap); a
// device loads a snapshot that holds what compaction deleted before the
// device had it; and a file the device rejected, or found deleted, reaches
// it through a snapshot whose writer had it. How snapshots are written and
// what compaction deletes is in snapshot.go; why the checks below are
// exact is explained there.

// chooseSnapshots checks every snapshot this device has not seen before,
// newest first, and loads those that hold what it lacks. A device with no
// state, or one joining a store, loads the newest readable one; any device
// loads a snapshot that holds a file, or knows an older snapshot, that it
// has not applied and will not download in this sync (one it rejected
// counts as not applied). Compaction deletes only files that a snapshot
// still on the remote holds, and snapshots that such a snapshot's writer
// had checked (see compact), so a device that finds nothing missing in the
// new snapshots it lists has lost nothing to compaction, however long it
// was away and whatever the devices' clocks say.
//
// A snapshot is recorded as checked or loaded only once it was read, and
// as checked only if this device holds what it names once the downloads
// are done (see settleChecked); one that cannot be read is rejected and
// read again later, like any rejected file.
func (f *fetcher) chooseSnapshots(ctx context.Context, snaps []RemoteFile) error {
	slices.SortFunc(snaps, func(a, b RemoteFile) int { return strings.Compare(b.Name, a.Name) }) // newest first
	f.snaps = snaps
	force := f.l.bootstrap || f.out.joining
	for _, snap := range snaps {
		if k, known := f.out.ledger[snap.Name]; known && !f.byName[snap.Name] && (k.held() || f.stillRejected(k, snap)) {
			continue
		}
		if f.out.covers[snap.Name] {
			f.out.checked = append(f.out.checked, snap) // a snapshot loaded here knows it: it holds what snap holds
			continue
		}
		if force && len(f.loaded) == 0 {
			if err := f.loadSnapshot(ctx, snap); err != nil {
				return err
			}
			continue
		}
		h, err := f.header(ctx, snap.Name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			f.snapshotGone(snap.Name)
			continue
		case errors.As(err, new(rejection)):
			f.reject(&downloaded{name: snap.Name, size: snap.Size}, err.(rejection).err)
			continue
		case err != nil:
			return err
		}
		name, ok := f.lacks(h)
		if !ok {
			f.out.checked = append(f.out.checked, snap)
			continue
		}
		f.e.log.Info("drivesync: a snapshot holds a file this device has not applied and cannot download; loading the snapshot", "snapshot", snap.Name, "file", name)
		if err := f.loadSnapshot(ctx, snap); err != nil {
			return err
		}
	}
	return nil
}

// snapshotGone handles a snapshot deleted before this sync could read it:
// compaction removes only snapshots that a newer one knows, so the newer
// one, listed now or soon, holds what it held.
func (f *fetcher) snapshotGone(name string) {
	if f.byName[name] {
		f.out.forget = append(f.out.forget, name)
	}
}

// lacks returns a file or snapshot that h names and that this device does
// not hold: not applied (or, for a snapshot, checked), not held by a
// snapshot loaded in this sync, and not about to be read in this sync. A
// file it rejected earlier and does not read again now is lacking: h's
// writer could read it, so h brings its content.
func (f *fetcher) lacks(h stateHeader) (string, bool) {
	fetching := map[string]bool{}
	for _, d := range f.download {
		fetching[d.name] = true
	}
	for _, names := range [][]string{h.included, h.knows} {
		for _, name := range names {
			k, known := f.out.ledger[name]
			switch {
			case f.out.covers[name], known && k.held(), fetching[name]:
				continue
			case f.out.listed[name] && !known:
				continue // a snapshot checked later in this sync
			case f.out.listed[name] && !f.stillRejected(k, RemoteFile{Name: name, Size: k.size}):
				continue // a rejected snapshot read again in this sync
			}
			return name, true
		}
	}
	return "", false
}

// header returns the header of a listed snapshot, reading it once.
func (f *fetcher) header(ctx context.Context, name string) (stateHeader, error) {
	if h, ok := f.headers[name]; ok {
		return h, nil
	}
	h, err := f.readHeader(ctx, name)
	if err == nil {
		f.headers[name] = h
	}
	return h, err
}

// readableHeader returns a listed snapshot's header; ok is false when the
// snapshot cannot be read or is gone, which only the remote's failure
// makes an error.
func (f *fetcher) readableHeader(ctx context.Context, name string) (h stateHeader, ok bool, err error) {
	h, err = f.header(ctx, name)
	if errors.As(err, new(rejection)) || errors.Is(err, fs.ErrNotExist) {
		return h, false, nil
	}
	return h, err == nil, err
}

// rejection marks an error of a remote file's content (not of the remote).
type rejection struct{ err error }

func (r rejection) Error() string { return r.err.Error() }

// readHeader reads the header of a snapshot on the remote.
func (s *syncRun) readHeader(ctx context.Context, name string) (stateHeader, error) {
	_, _, device, _ := parseFileName(name)
	rc, err := s.e.openFile(ctx, name, nil)
	if unreadableFile(ctx, err) {
		return stateHeader{}, rejection{err}
	}
	if err != nil {
		return stateHeader{}, remoteErr("download", name, err)
	}
	defer rc.Close()
	src := &countingReader{r: rc}
	h, err := decodeStateFile(src, device, s.limits, nil)
	switch {
	case err == nil && h.store != s.store:
		return h, rejection{fmt.Errorf("%w: it belongs to store %s, not %s", ErrCorruptFile, h.store, s.store)}
	case err == nil:
		return h, nil
	case ctx.Err() != nil:
		return h, &Error{Op: "download", File: name, Err: ctx.Err()}
	case src.failed != nil:
		return h, remoteErr("download", name, src.failed)
	}
	return h, rejection{classifyFileErr(err)}
}

// loadSnapshot spools snapshot snap, to be applied before any patch file,
// and takes what it holds as applied: the listed files it holds are not
// downloaded. A snapshot that cannot be read, or that was deleted since
// the listing, is skipped.
func (f *fetcher) loadSnapshot(ctx context.Context, snap RemoteFile) error {
	d := &downloaded{name: snap.Name, size: snap.Size, kind: kindSnapshot, byName: f.byName[snap.Name]}
	// A download of its own: which files the snapshot spares the sync
	// shows only once it is read, so it cannot count in the files'.
	f.e.progressStart("download", 1, max(snap.Size, 0), 0)
	h, err := f.fetchStateFile(ctx, d, f.limits.MaxSnapshotSize)
	if err != nil {
		return err
	}
	f.e.progressRest(0, snap.Size)
	f.e.progressEnd()
	if d.spool == nil {
		return nil
	}
	f.loaded = append(f.loaded, d)
	for _, name := range slices.Concat(h.included, h.knows, []string{snap.Name}) {
		f.out.covers[name] = true
	}
	f.download = slices.DeleteFunc(f.download, func(x *downloaded) bool { return x.spool == nil && f.out.covers[x.name] })
	return nil
}

// coverMissing takes the files this sync could not apply — deleted
// before it could download them, or rejected: truncated, corrupt, too
// large or of a newer format — from a listed snapshot that holds them (its
// writer could read them), loading that snapshot. A rejected snapshot is
// taken from a listed snapshot that knows it. A deleted file that no
// listed snapshot holds stops the sync: the next one lists the remote
// again and finds the snapshot that replaced it. A rejected file that none
// holds stays rejected and is read again later.
func (f *fetcher) coverMissing(ctx context.Context) error {
	if err := f.recoverForgotten(ctx); err != nil {
		return err
	}
	var missing []string
	for _, d := range f.gone {
		missing = append(missing, d.name)
	}
	for _, r := range f.report.Rejected {
		missing = append(missing, r.Name)
	}
	for _, name := range missing {
		for _, snap := range f.snaps {
			if f.out.covers[name] {
				break
			}
			if snap.Name == name {
				continue
			}
			h, ok, err := f.readableHeader(ctx, snap.Name)
			if err != nil {
				return err
			}
			if ok && (slices.Contains(h.included, name) || slices.Contains(h.knows, name)) {
				if err := f.loadSnapshot(ctx, snap); err != nil {
					return err
				}
			}
		}
	}
	for _, d := range f.gone {
		if !f.out.covers[d.name] {
			return &Error{Op: "download", File: d.name, Err: fmt.Errorf("%w: the file was deleted while this sync ran (another device compacted the remote); sync again", ErrRemote)}
		}
	}
	f.report.Rejected = slices.DeleteFunc(f.report.Rejected, func(r FileError) bool { return f.out.covers[r.Name] })
	for name := range f.out.rejected {
		if f.out.covers[name] {
			delete(f.out.rejected, name)
		}
	}
	return nil
}

// settleChecked keeps as checked only the snapshots whose every named file
// and snapshot this device holds once the downloads are done: applied
// before, brought by a snapshot loaded now, downloaded now, or itself
// checked now. A header read before the downloads counted a file about to
// be downloaded, or a snapshot about to be checked, as held; that file may
// then have been rejected, and that snapshot rejected or deleted before
// its header was read. Recorded as checked, the snapshot would be named as
// known by this device's own snapshots, which would then claim, and let
// compaction act on, content the device never had. So such a snapshot is
// loaded now, as any snapshot holding what the device lacks is; if it
// cannot be read, it is rejected and read again later.
func (f *fetcher) settleChecked(ctx context.Context) error {
	held := map[string]bool{}
	for _, d := range f.download {
		if d.spool != nil {
			held[d.name] = true
		}
	}
	checked := map[string]bool{}
	for _, snap := range f.out.checked {
		checked[snap.Name] = true
	}
	holds := func(name string) bool {
		k, known := f.out.ledger[name]
		_, rejected := f.out.rejected[name]
		return !rejected && (f.out.covers[name] || held[name] || checked[name] || known && k.held())
	}
	lacking := func(n string) bool { return !holds(n) }
	for changed := true; changed; {
		changed = false
		// The file numbers this device holds once the downloads and the
		// snapshots loaded so far are applied (see vanished.go).
		numbers := f.out.held.clone()
		for _, d := range f.download {
			if d.spool != nil && d.seq > 0 {
				_, _, device, _ := parseFileName(d.name)
				numbers.add(device, d.seq, d.seq)
			}
		}
		for _, d := range f.loaded {
			numbers.addAll(d.holds)
		}
		var unsettled []RemoteFile
		f.out.checked = slices.DeleteFunc(f.out.checked, func(snap RemoteFile) bool {
			if f.out.covers[snap.Name] {
				return false // a loaded snapshot knows it: it holds what snap holds
			}
			h := f.headers[snap.Name]
			if !slices.ContainsFunc(h.included, lacking) && !slices.ContainsFunc(h.knows, lacking) && h.holds.minus(numbers).runs() == 0 {
				return false
			}
			delete(checked, snap.Name)
			unsettled = append(unsettled, snap)
			changed = true
			return true
		})
		for _, snap := range unsettled {
			if _, rejected := f.out.rejected[snap.Name]; rejected || f.out.covers[snap.Name] {
				continue
			}
			f.e.log.Info("drivesync: a snapshot names what this device turned out to lack; loading it", "snapshot", snap.Name)
			if err := f.loadSnapshot(ctx, snap); err != nil {
				return err
			}
		}
	}
	return nil
}

// recoverForgotten loads what a rejected file held when reading it again
// found it gone: compaction deleted it, on the authority of a snapshot
// that includes it, and deletes that snapshot in turn only once a newer
// one knows it, whose writer held what it held. So a snapshot on the
// remote that includes the file, or that knows snapshots the remote no
// longer has (the head of such a chain), holds the file's content. This
// is rare and costs a full listing and a header per snapshot.
func (f *fetcher) recoverForgotten(ctx context.Context) error {
	if len(f.out.forget) == 0 {
		return nil
	}
	files, err := f.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return remoteErr("list", "", err)
	}
	present := map[string]bool{}
	var snaps []RemoteFile
	for _, file := range files {
		present[file.Name] = true
		if k, _, _, ok := parseFileName(file.Name); ok && k == kindSnapshot {
			snaps = append(snaps, file)
		}
	}
	slices.SortFunc(snaps, func(a, b RemoteFile) int { return strings.Compare(b.Name, a.Name) })
	for _, snap := range snaps {
		if f.out.covers[snap.Name] {
			continue
		}
		h, ok, err := f.readableHeader(ctx, snap.Name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		holds := slices.ContainsFunc(f.out.forget, func(name string) bool {
			return !f.out.covers[name] && slices.Contains(slices.Concat(h.included, h.knows), name)
		})
		heads := slices.ContainsFunc(h.knows, func(name string) bool { return !present[name] && !f.out.covers[name] })
		if holds || heads {
			f.e.log.Info("drivesync: a file this device rejected is gone from the remote; loading a snapshot that holds it", "snapshot", snap.Name)
			if err := f.loadSnapshot(ctx, snap); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetchStateFile downloads a snapshot or merge file into d.spool; a file
// that cannot be read is rejected (d.spool stays nil).
func (f *fetcher) fetchStateFile(ctx context.Context, d *downloaded, limit int64) (stateHeader, error) {
	e := f.e
	_, _, device, _ := parseFileName(d.name)
	if e.listedOver(d, limit) {
		f.reject(d, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrFileTooLarge, d.size, limit))
		return stateHeader{}, nil
	}
	progress := &progressReader{e: e}
	rc, err := e.openFile(ctx, d.name, progress)
	if errors.Is(err, fs.ErrNotExist) {
		if d.kind == kindMerge {
			f.vanished(d)
		} else {
			f.snapshotGone(d.name)
		}
		return stateHeader{}, nil
	}
	if unreadableFile(ctx, err) {
		f.reject(d, err)
		return stateHeader{}, nil
	}
	if err != nil {
		return stateHeader{}, remoteErr("download", d.name, err)
	}
	defer rc.Close()
	sp, err := newSpool(e.cfg.TempDir)
	if err != nil {
		return stateHeader{}, &Error{Op: "download", File: d.name, Err: err}
	}
	var maxV int64
	var spoolErr error
	src := &countingReader{r: &limitedReader{r: rc, n: limit, what: "compressed file"}}
	h, err := decodeStateFile(src, device, f.limits, func(c fileChange) error {
		progress.report()
		maxV = max(maxV, c.version)
		spoolErr = sp.add(c)
		return spoolErr
	})
	progress.report()
	if err == nil && h.store != f.store && d.kind == kindMerge && h.seq > 0 {
		// The merge file of a device that joined another store, then
		// this one (two devices started stores at once): nothing in it
		// is this store's, and its writer sends its records again here.
		// Taken as applied, its number is held (see vanished.go).
		sp.close()
		if sp, err = newSpool(e.cfg.TempDir); err != nil {
			return h, &Error{Op: "download", File: d.name, Err: err}
		}
		f.e.log.Info("drivesync: a merge file of another store holds nothing for this one", "file", d.name, "store", h.store)
		f.keep(d, sp, 0)
		d.seq = h.seq
		return h, nil
	}
	if err == nil && h.store != f.store {
		err = rejection{fmt.Errorf("it belongs to store %s, not %s", h.store, f.store)}
	}
	if err == nil {
		_, at, _, _ := parseFileName(d.name)
		err = f.checkVersions(at, maxV)
	}
	if err != nil {
		sp.close()
		return h, f.readFailed(ctx, d, src, spoolErr, err)
	}
	f.keep(d, sp, maxV)
	d.seq = h.seq
	if d.kind == kindSnapshot {
		if d.holds = h.holds; d.holds == nil {
			d.holds = heldSet{} // an older engine's: it says nothing
		}
	}
	return h, nil
}
