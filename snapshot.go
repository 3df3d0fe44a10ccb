package drivesync

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// Snapshots, compaction, bootstrap and the remote's identity (seed 000,
// "Google Drive 側のスナップショット作成と同期内容ログの肥大化対策" and
// "初期同期").
//
// A snapshot is every record of sync_states, deleted ones included, each
// with its clock: a device that starts from it merges later patch files
// exactly as if it had applied the files the snapshot replaces. It is
// named with the remote's time when it was written and carries in its
// header the time its writer listed the remote ("covers"), the cutoff
// below which compaction may delete the files it holds, the names of the
// patch and merge files it holds ("included") and the names of the older
// snapshots its writer had checked ("knows").
//
// The first device to sync in a month (by the remote's clock) writes one.
// Compaction runs once that snapshot is older than ListOverlap, so that
// every device can list it before any file it replaces disappears. It
// deletes only what the newest such snapshot (the authority) holds: the
// files it includes named before its cutoff, and the snapshots it knows.
// Deletes that fail are retried at the next compaction.
//
// A device reads the header of every snapshot it has not seen. If one
// holds a file or knows a snapshot that the device neither applied nor
// lists now, compaction deleted something the device never had, and it
// loads that snapshot first, merging it into its state. Since everything
// deleted is named by a snapshot still on the remote, or by one that a
// snapshot still on the remote knows (whose writer had checked it, and so
// holds what it held), the check is exact: names, not times, decide it,
// whatever the devices' clocks say and however long a device was away. A
// device with no state at all starts from the newest snapshot.
//
// A merge file has the snapshot format but every device applies it, like a
// patch file: it is how a device that joins another store (JoinRemote)
// publishes what it had, with the original stamps.
//
// The marker (drivesync.json at the remote's root) names the store. Each
// device records the id it syncs with, so that a remote that was emptied,
// or swapped for another account or folder, stops Sync with
// ErrRemoteChanged instead of looking like a store where every record was
// deleted.

// stateFormat is the snapshot and merge file format this engine writes; it
// reads every format up to it.
const stateFormat = 1

// retained returns the oldest name time a snapshot at "at" keeps patch
// files for: Config.Retention before it, by default two months (seed
// 000).
func (e *Engine) retained(at time.Time) time.Time {
	if e.cfg.Retention > 0 {
		return at.Add(-e.cfg.Retention)
	}
	return at.AddDate(0, -2, 0)
}

// stateHeader is the header of a snapshot or merge file.
type stateHeader struct {
	device   string
	store    string
	covers   time.Time // the writer's listing time: older files are in it
	cutoff   time.Time // snapshots: compaction may delete patch files named before it
	included []string  // snapshots: the patch and merge files the state holds
	knows    []string  // snapshots: the older snapshots its writer had checked (see chooseSnapshot)
	// verified: the writer read the file back under the store's limits
	// before uploading it, so every device can read it (see verifyState).
	verified bool
}

func appendNames(b []byte, names []string) []byte {
	b = append(b, '[')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, name)
	}
	return append(b, ']')
}

// writeStateFile streams every record of sync_states into w, gzipped.
// Memory stays flat: rows go out as they are read.
func writeStateFile(ctx context.Context, q querier, w io.Writer, h stateHeader) (records int, err error) {
	gz, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return 0, err
	}
	bw := bufio.NewWriterSize(gz, 64<<10)
	b := fmt.Appendf(nil, `{"format":%d,"device":`, stateFormat)
	b = jsonv.AppendString(b, h.device)
	b = append(b, `,"store":`...)
	b = jsonv.AppendString(b, h.store)
	b = append(b, `,"covers":`...)
	b = jsonv.AppendString(b, h.covers.UTC().Format(time.RFC3339Nano))
	if !h.cutoff.IsZero() {
		b = append(b, `,"cutoff":`...)
		b = jsonv.AppendString(b, h.cutoff.UTC().Format(time.RFC3339Nano))
		b = appendNames(append(b, `,"included":`...), h.included)
		b = appendNames(append(b, `,"knows":`...), h.knows)
		b = append(b, `,"verified":true`...) // writeState uploads it only then
	}
	b = append(b, `,"records":[`...)
	if _, err := bw.Write(b); err != nil {
		return 0, err
	}
	rows, err := q.QueryContext(ctx, `SELECT table_name, record_id, record_data, clock, is_deleted FROM sync_states ORDER BY table_name, record_id`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var table, record, data, clock []byte
	var deleted bool
	for rows.Next() {
		if err := rows.Scan(&table, &record, &data, &clock, &deleted); err != nil {
			return records, err
		}
		b = b[:0]
		if records > 0 {
			b = append(b, ',')
		}
		b = append(b, "\n{\"table_name\":"...)
		b = jsonv.AppendString(b, string(table))
		b = append(b, `,"record_id":`...)
		b = jsonv.AppendString(b, string(record))
		b = append(b, `,"state":`...)
		b = append(b, data...)
		b = append(b, `,"clock":`...)
		b = append(b, clock...)
		b = fmt.Appendf(b, `,"is_deleted":%t}`, deleted)
		if _, err := bw.Write(b); err != nil {
			return records, err
		}
		records++
	}
	if err := rows.Err(); err != nil {
		return records, err
	}
	if _, err := bw.WriteString("\n]}\n"); err != nil {
		return records, err
	}
	if err := bw.Flush(); err != nil {
		return records, err
	}
	return records, gz.Close()
}

// maxHeldName bounds a file name in a snapshot header: the longest name
// the engine writes is about 120 bytes.
const maxHeldName = 256

// stateEntry is one record of a state file.
type stateEntry struct {
	Table   string          `json:"table_name"`
	Record  string          `json:"record_id"`
	State   json.RawMessage `json:"state"`
	Clock   json.RawMessage `json:"clock"`
	Deleted bool            `json:"is_deleted"`
}

// decodeStateFile reads a snapshot or merge file from r (gzip), checks its
// header (the device its name claims, a format this engine reads) and
// hands every validated record to emit; with emit nil it stops after the
// header. As for patch files, callers spool the records and discard the
// spool on error: a bad file is never half-applied.
func decodeStateFile(r io.Reader, wantDevice string, l Limits, emit func(fileChange) error) (stateHeader, error) {
	var h stateHeader
	gz, err := gzip.NewReader(r)
	if err != nil {
		return h, fmt.Errorf("not gzip: %w", err)
	}
	defer gz.Close()
	maxRecord := l.MaxRecordSize
	values := &valueLimiter{r: &limitedReader{r: gz, n: l.MaxSnapshotSize, what: "uncompressed content"}, limit: math.MaxInt64}
	dec := json.NewDecoder(values)
	dec.UseNumber()
	valueBound := 4*maxRecord + 64<<10 // content and clock
	bound := func() { values.limit = dec.InputOffset() + valueBound }
	if err := expectDelim(dec, '{'); err != nil {
		return h, err
	}
	var format int64
	seen := map[string]bool{}
	devices := map[string]bool{} // device ids already checked
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return h, err
		}
		key, _ := tok.(string)
		if seen[key] {
			return h, fmt.Errorf("member %q appears twice", key)
		}
		seen[key] = true
		bound()
		switch key {
		case "format":
			var n json.Number
			if err := dec.Decode(&n); err != nil {
				return h, fmt.Errorf("format: %w", err)
			}
			if format, err = n.Int64(); err != nil || format < 1 {
				return h, fmt.Errorf("format %q is not a positive integer", n)
			}
			if format > stateFormat {
				return h, fmt.Errorf("%w: format %d; this app reads up to %d", ErrUnsupportedFormat, format, stateFormat)
			}
		case "device":
			if err := dec.Decode(&h.device); err != nil {
				return h, fmt.Errorf("device: %w", err)
			}
			if h.device != wantDevice {
				return h, fmt.Errorf("file says device %q but its name says %q", h.device, wantDevice)
			}
		case "store":
			if err := dec.Decode(&h.store); err != nil {
				return h, fmt.Errorf("store: %w", err)
			}
		case "verified":
			if err := dec.Decode(&h.verified); err != nil {
				return h, fmt.Errorf("verified: %w", err)
			}
		case "covers", "cutoff":
			var text string
			if err := dec.Decode(&text); err != nil {
				return h, fmt.Errorf("%s: %w", key, err)
			}
			at, err := time.Parse(time.RFC3339Nano, text)
			if err != nil {
				return h, fmt.Errorf("%s: %w", key, err)
			}
			if key == "covers" {
				h.covers = at
			} else {
				h.cutoff = at
			}
		case "included", "knows":
			// Lists of file names have their own bound, not a record's:
			// a busy store holds many files.
			values.limit = dec.InputOffset() + l.MaxHeldFiles*(maxHeldName+4) + 64<<10
			var names []string
			if err := dec.Decode(&names); err != nil {
				return h, fmt.Errorf("%s: %w", key, err)
			}
			if int64(len(names)) > l.MaxHeldFiles {
				return h, fmt.Errorf("%w: %s lists %d files, over the store's MaxHeldFiles (%d)", errTooLarge, key, len(names), l.MaxHeldFiles)
			}
			for _, name := range names {
				kind, _, _, ok := parseFileName(name)
				if !ok || len(name) > maxHeldName || (kind == kindSnapshot) != (key == "knows") {
					return h, fmt.Errorf("%s: %q is not a name of the right kind", key, name)
				}
			}
			if key == "knows" {
				h.knows = names
			} else {
				h.included = names
			}
		case "records":
			if format == 0 || h.device == "" || h.store == "" || h.covers.IsZero() {
				return h, errors.New(`"format", "device", "store" and "covers" must come before "records"`)
			}
			if emit == nil {
				return h, nil
			}
			if err := expectDelim(dec, '['); err != nil {
				return h, fmt.Errorf("records: %w", err)
			}
			for i := 0; dec.More(); i++ {
				var e stateEntry
				bound()
				if err := dec.Decode(&e); err != nil {
					return h, fmt.Errorf("record %d: %w", i, err)
				}
				c, err := validateStateEntry(e, maxRecord, devices)
				if err != nil {
					return h, fmt.Errorf("record %d: %w", i, err)
				}
				if err := emit(c); err != nil {
					return h, err
				}
			}
			if err := expectDelim(dec, ']'); err != nil {
				return h, err
			}
		default:
			var skip json.RawMessage // members of later formats
			if err := dec.Decode(&skip); err != nil {
				return h, err
			}
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return h, err
	}
	if !seen["records"] {
		return h, errors.New(`no "records"`)
	}
	switch _, err := dec.Token(); {
	case err == io.EOF:
		return h, nil
	case err != nil:
		return h, err
	}
	return h, errors.New("data after the end of the file")
}

// validateStateEntry checks one record of a state file and returns it in
// the canonical form sync_states stores. Its clock must be one the merge
// rules can produce, or devices that merge it could disagree.
func validateStateEntry(e stateEntry, maxRecord int64, devices map[string]bool) (fileChange, error) {
	if err := checkTableName(e.Table); err != nil {
		return fileChange{}, err
	}
	if e.Record == "" || len(e.Record) > maxRecordIDLen {
		return fileChange{}, fmt.Errorf("record id of %d bytes (want 1-%d)", len(e.Record), maxRecordIDLen)
	}
	if int64(len(e.State)) > maxRecord || int64(len(e.Clock)) > 2*maxRecord {
		return fileChange{}, fmt.Errorf("%w: record %s/%s is over the %d-byte record limit", errTooLarge, e.Table, e.Record, maxRecord)
	}
	content := jsonv.Value{Members: []jsonv.Member{}}
	if !e.Deleted {
		var err error
		if content, err = jsonv.ParseObject(e.State, jsonv.Options{}); err != nil {
			return fileChange{}, fmt.Errorf("state of %s/%s: %w", e.Table, e.Record, err)
		}
	}
	n, err := decodeState(content, e.Clock, e.Deleted)
	if err == nil {
		err = checkClock(n, stamp{version: maxVersion + 1}, devices)
	}
	if err != nil {
		return fileChange{}, fmt.Errorf("clock of %s/%s: %w", e.Table, e.Record, err)
	}
	data, clock := encodeState(n)
	return fileChange{table: e.Table, record: e.Record, patch: []byte(data), clock: []byte(clock),
		deleted: !n.exists(), version: n.stamp.version, device: n.stamp.device}, nil
}

// checkClock checks what the merge rules guarantee of every state they
// build: stamps in range, a node's stamp not below its children's, a floor
// below its node's stamp and below every child kept over it.
func checkClock(n *node, parent stamp, devices map[string]bool) error {
	for _, s := range []stamp{n.stamp, n.floor} {
		if s.isZero() {
			continue
		}
		if s.version < 1 || s.version > maxVersion {
			return fmt.Errorf("%w: version %d out of range", errBadClock, s.version)
		}
		if !devices[s.device] {
			if checkDeviceID(s.device) != nil {
				return fmt.Errorf("%w: device %q", errBadClock, s.device)
			}
			devices[s.device] = true
		}
	}
	if n.stamp.isZero() || parent.less(n.stamp) || (!n.floor.isZero() && !n.floor.less(n.stamp)) {
		return fmt.Errorf("%w: stamps out of order", errBadClock)
	}
	for _, k := range n.kids {
		if !n.floor.isZero() && !n.floor.less(k.node.stamp) {
			return fmt.Errorf("%w: a member older than its object's reset", errBadClock)
		}
		if err := checkClock(k.node, n.stamp, devices); err != nil {
			return err
		}
	}
	return nil
}

// The marker: drivesync.json at the remote's root.
const (
	markerName   = "drivesync.json"
	markerFormat = 1
	maxMarker    = 64 << 10
)

type marker struct {
	Format  int64     `json:"format"`
	Store   string    `json:"store"`
	Created time.Time `json:"created"` // the remote's time; a store's first snapshot is due the month after
	// Limits are the store's (see Limits); a marker without them has
	// the defaults.
	Limits *markerLimits `json:"limits,omitempty"`
}

type markerLimits struct {
	MaxFileSize     int64 `json:"max_file_size"`
	MaxExpandedSize int64 `json:"max_expanded_size"`
	MaxRecordSize   int64 `json:"max_record_size"`
	MaxSnapshotSize int64 `json:"max_snapshot_size"`
	MaxHeldFiles    int64 `json:"max_held_files"`
}

// limits returns the store's limits. The marker is untrusted like every
// remote file: limits outside sane bounds make it unreadable rather than
// have devices read unbounded files.
func (m marker) limits() (Limits, error) {
	if m.Limits == nil {
		return Limits{}.withDefaults(), nil
	}
	l := Limits{MaxFileSize: m.Limits.MaxFileSize, MaxExpandedSize: m.Limits.MaxExpandedSize,
		MaxRecordSize: m.Limits.MaxRecordSize, MaxSnapshotSize: m.Limits.MaxSnapshotSize, MaxHeldFiles: m.Limits.MaxHeldFiles}
	if err := l.check(); err != nil {
		return l, fmt.Errorf("%w: marker: %w", ErrCorruptFile, err)
	}
	return l, nil
}

// readMarker reads the remote's marker; found is false if there is none.
func readMarker(ctx context.Context, r Remote) (m marker, found bool, err error) {
	rc, err := r.Open(ctx, markerName)
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, remoteErr("read marker", markerName, err)
	}
	defer rc.Close()
	src := &countingReader{r: &limitedReader{r: rc, n: maxMarker, what: "marker"}}
	derr := json.NewDecoder(src).Decode(&m)
	switch {
	case src.failed != nil:
		return m, false, remoteErr("read marker", markerName, src.failed)
	case derr != nil:
		return m, true, &Error{Op: "read marker", File: markerName, Err: fmt.Errorf("%w: %w", ErrCorruptFile, derr)}
	case m.Format > markerFormat:
		return m, true, &Error{Op: "read marker", File: markerName, Err: fmt.Errorf("%w: marker format %d; this app reads up to %d", ErrUnsupportedFormat, m.Format, markerFormat)}
	case m.Format < 1 || checkDeviceID(m.Store) != nil:
		return m, true, &Error{Op: "read marker", File: markerName, Err: fmt.Errorf("%w: marker has format %d and store %q", ErrCorruptFile, m.Format, m.Store)}
	}
	if _, err := m.limits(); err != nil {
		return m, true, &Error{Op: "read marker", File: markerName, Err: err}
	}
	return m, true, nil
}

// writeMarker creates the marker of a new store with limits l.
func writeMarker(ctx context.Context, r Remote, store string, created time.Time, l Limits) error {
	b, _ := json.Marshal(marker{Format: markerFormat, Store: store, Created: created.UTC(), Limits: &markerLimits{
		MaxFileSize: l.MaxFileSize, MaxExpandedSize: l.MaxExpandedSize, MaxRecordSize: l.MaxRecordSize,
		MaxSnapshotSize: l.MaxSnapshotSize, MaxHeldFiles: l.MaxHeldFiles,
	}})
	return r.Create(ctx, markerName, strings.NewReader(string(b)+"\n"))
}

// bind checks that the remote holds the store this database syncs with,
// creating the marker on a remote that has none yet and that this
// database never synced with.
func (s *syncRun) bind(ctx context.Context) error {
	e := s.e
	var bound, claim, last string
	for _, kv := range []struct {
		key string
		v   *string
	}{{metaStore, &bound}, {metaStoreClaim, &claim}, {metaSnapshot, &last}} {
		var err error
		if *kv.v, err = getMeta(ctx, s.conn, kv.key); err != nil {
			return &Error{Op: "sync", Err: err}
		}
	}
	m, found, err := readMarker(ctx, e.cfg.Remote)
	if err != nil {
		return err
	}
	identity, recorded, err := s.remoteIdentity(ctx)
	if err != nil {
		return err
	}
	// Our marker made moments ago explains a different store, or none,
	// only on the storage we made it on.
	sameRemote := identity == "" || recorded == "" || identity == recorded
	var set []string
	switch {
	case found && m.Store == bound:
		// Our marker held for two overlaps: another device's marker
		// created in the same moment would show by now.
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(claim, claimSeen))
		switch {
		case claim != "" && (err != nil || !s.cursor.Before(at.Add(2*e.cfg.ListOverlap))):
			set = append(set, metaStoreClaim, "")
		case claim != "" && !strings.HasPrefix(claim, claimSeen):
			set = append(set, metaStoreClaim, claimSeen+claim) // read back: no longer "not listed yet"
		}
	case found && bound == "":
		set = append(set, metaStore, m.Store) // the first sync with this remote
	case found && m.Store != bound && !sameRemote:
		return &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote holds store %s, but this database syncs with store %s, and the remote is %s, not %s where this database synced: the app is pointed at another folder or signed in to another account. Nothing local was changed. Point the app back at the right remote, or call JoinRemote to merge this database with that store", ErrRemoteChanged, m.Store, bound, identity, recorded)}
	case found && claim != "" && racedWith(claim, m.Created, e.cfg.ListOverlap):
		// Our own marker lost a race with another device's, created in
		// the same moment (Drive allows two files of one name, and every
		// device reads the same one): join that store, uploading what
		// this device had.
		e.log.Info("drivesync: another device created the store's marker at the same time; joining its store", "store", m.Store)
		if err := s.rebind(ctx, m.Store, true); err != nil {
			return err
		}
		s.rebound = true
		last, recorded = "", "" // rebind forgot them
		// Until the listings settle, the marker every device reads may
		// still change: keep treating a change as this race.
		set = append(set, metaStoreClaim, claim)
	case found:
		return &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote holds store %s, but this database syncs with store %s: the app may be signed in to another account or pointed at another folder. Nothing local was changed. Point the app back at the right remote, or call JoinRemote to merge this database with that store", ErrRemoteChanged, m.Store, bound)}
	case bound != "" && !sameRemote:
		return &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote has no %s, and it is %s, not %s where store %s lives: the app is pointed at another folder or signed in to another account. Nothing local was changed or deleted. Point the app back at the right remote, or call StartFresh to upload this database's data there as a new store", ErrRemoteChanged, markerName, identity, recorded, bound)}
	case bound != "" && claim != "" && !strings.HasPrefix(claim, claimSeen) && racedWith(claim, s.cursor, 2*e.cfg.ListOverlap):
		// We created the marker moments ago; the remote does not list
		// it yet.
		m = marker{Store: bound}
	case bound != "":
		return &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote has no %s: it was emptied, or it is another folder or account than the one store %s lives in. Nothing local was changed or deleted. Point the app back at the right remote, or call StartFresh to upload this database's data there as a new store", ErrRemoteChanged, markerName, bound)}
	default:
		m = marker{Store: newStoreID(), Created: s.cursor}
		err = writeMarker(ctx, e.cfg.Remote, m.Store, m.Created, e.cfg.Limits)
		if errors.Is(err, fs.ErrExist) { // another device created it since we looked
			if m, found, err = readMarker(ctx, e.cfg.Remote); err == nil && !found {
				err = fmt.Errorf("%w: the marker exists but cannot be read; sync again", ErrRemote)
			}
			if err != nil {
				return remoteErr("read marker", markerName, err)
			}
			set = append(set, metaStore, m.Store)
			break
		}
		if err != nil {
			return remoteErr("write marker", markerName, err)
		}
		e.log.Info("drivesync: created the store's marker on the remote", "store", m.Store)
		set = append(set, metaStore, m.Store, metaStoreClaim, s.cursor.UTC().Format(time.RFC3339Nano))
	}
	s.store = m.Store
	if m.Limits == nil && m.Format == 0 {
		// The marker this device just wrote, or the one it wrote moments
		// ago and cannot list yet: this device's limits are the store's.
		s.limits = e.cfg.Limits
	} else if s.limits, err = m.limits(); err != nil {
		return &Error{Op: "read marker", File: markerName, Err: err}
	}
	if last == "" && !m.Created.IsZero() {
		// A store's first snapshot is due in the month after it began.
		set = append(set, metaSnapshot, m.Created.UTC().Format(time.RFC3339Nano))
	}
	if identity != recorded && identity != "" {
		// Bound, or still bound, through this remote: a folder that moved
		// is recorded where it is now.
		set = append(set, metaRemoteID, identity)
	}
	if len(set) == 0 {
		return nil
	}
	return s.setMetas(ctx, set...)
}

// remoteIdentity returns the identity of the remote (see IdentifiedRemote)
// and the one recorded when this database last bound to its store; each is
// "" when unknown.
func (s *syncRun) remoteIdentity(ctx context.Context) (identity, recorded string, err error) {
	if recorded, err = getMeta(ctx, s.conn, metaRemoteID); err != nil {
		return "", "", &Error{Op: "sync", Err: err}
	}
	r, ok := s.e.cfg.Remote.(IdentifiedRemote)
	if !ok {
		return "", recorded, nil
	}
	if identity, err = r.Identity(ctx); err != nil {
		return "", "", remoteErr("identify remote", "", err)
	}
	return identity, recorded, nil
}

// claimSeen prefixes the claim once this device has read its marker back.
const claimSeen = "seen "

// racedWith reports whether a marker created at other could have been
// created by another device without either seeing the other's.
func racedWith(claim string, other time.Time, overlap time.Duration) bool {
	at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(claim, claimSeen))
	d := other.Sub(at)
	return err == nil && d < overlap && d > -overlap
}

// setMetas sets sync_meta key/value pairs in one transaction.
func (s *syncRun) setMetas(ctx context.Context, kv ...string) error {
	return s.inTx(ctx, func() error {
		for i := 0; i < len(kv); i += 2 {
			if err := setMeta(ctx, s.conn, kv[i], kv[i+1]); err != nil {
				return err
			}
		}
		return nil
	})
}

// inTx runs fn in a write transaction of its own.
func (s *syncRun) inTx(ctx context.Context, fn func() error) error {
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if err := fn(); err != nil {
		endTx(s.conn)
		return &Error{Op: "sync", Err: err}
	}
	if _, err := s.conn.ExecContext(ctx, "COMMIT"); err != nil {
		endTx(s.conn)
		return &Error{Op: "sync", Err: err}
	}
	return nil
}

// chooseSnapshot checks every snapshot this device has not seen before,
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
// A snapshot is recorded as checked (s.checked) or loaded only once it
// was read; one that cannot be read is rejected and read again later,
// like any rejected file.
func (s *syncRun) chooseSnapshot(ctx context.Context, snaps []RemoteFile) error {
	slices.SortFunc(snaps, func(a, b RemoteFile) int { return strings.Compare(b.Name, a.Name) }) // newest first
	s.snaps = snaps
	force := s.bootstrap || s.joining
	for _, f := range snaps {
		if k, known := s.known[f.Name]; known && !s.byName[f.Name] && (k.held() || s.stillRejected(k, f)) {
			continue
		}
		if s.covers[f.Name] {
			s.checked = append(s.checked, f) // a snapshot loaded here knows it: it holds what f holds
			continue
		}
		if force && len(s.loaded) == 0 {
			if err := s.loadSnapshot(ctx, f); err != nil {
				return err
			}
			continue
		}
		h, err := s.header(ctx, f.Name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			s.snapshotGone(f)
			continue
		case errors.As(err, new(rejection)):
			s.reject(&downloaded{name: f.Name, size: f.Size}, err.(rejection).err)
			continue
		case err != nil:
			return err
		}
		name, ok := s.lacks(h)
		if !ok {
			s.checked = append(s.checked, f)
			continue
		}
		s.e.log.Info("drivesync: a snapshot holds a file this device has not applied and cannot download; loading the snapshot", "snapshot", f.Name, "file", name)
		if err := s.loadSnapshot(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// snapshotGone handles a snapshot deleted before this sync could read it:
// compaction removes only snapshots that a newer one knows, so the newer
// one, listed now or soon, holds what it held.
func (s *syncRun) snapshotGone(f RemoteFile) {
	if s.byName[f.Name] {
		s.forget = append(s.forget, f.Name)
	}
}

// lacks returns a file or snapshot that h names and that this device does
// not hold: not applied (or, for a snapshot, checked), not held by a
// snapshot loaded in this sync, and not about to be read in this sync. A
// file it rejected earlier and does not read again now is lacking: h's
// writer could read it, so h brings its content.
func (s *syncRun) lacks(h stateHeader) (string, bool) {
	fetching := map[string]bool{}
	for _, d := range s.download {
		fetching[d.name] = true
	}
	for _, names := range [][]string{h.included, h.knows} {
		for _, name := range names {
			k, known := s.known[name]
			switch {
			case s.covers[name], known && k.held(), fetching[name]:
				continue
			case s.listed[name] && !known:
				continue // a snapshot checked later in this sync
			case s.listed[name] && !s.stillRejected(k, RemoteFile{Name: name, Size: k.size}):
				continue // a rejected snapshot read again in this sync
			}
			return name, true
		}
	}
	return "", false
}

// header returns the header of a listed snapshot, reading it once.
func (s *syncRun) header(ctx context.Context, name string) (stateHeader, error) {
	if h, ok := s.headers[name]; ok {
		return h, nil
	}
	h, err := s.readHeader(ctx, name)
	if err == nil {
		s.headers[name] = h
	}
	return h, err
}

// rejection marks an error of a remote file's content (not of the remote).
type rejection struct{ err error }

func (r rejection) Error() string { return r.err.Error() }

func (s *syncRun) readHeader(ctx context.Context, name string) (stateHeader, error) {
	_, _, device, _ := parseFileName(name)
	rc, err := s.e.cfg.Remote.Open(ctx, name)
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

func classifyFileErr(err error) error {
	switch {
	case errors.Is(err, ErrUnsupportedFormat):
		return err
	case errors.Is(err, errTooLarge):
		return fmt.Errorf("%w: %w", ErrFileTooLarge, err)
	}
	return fmt.Errorf("%w: %w", ErrCorruptFile, err)
}

// loadSnapshot spools snapshot f, to be applied before any patch file,
// and takes what it holds as applied: the listed files it holds are not
// downloaded. A snapshot that cannot be read, or that was deleted since
// the listing, is skipped.
func (s *syncRun) loadSnapshot(ctx context.Context, f RemoteFile) error {
	d := &downloaded{name: f.Name, size: f.Size, kind: kindSnapshot, byName: s.byName[f.Name]}
	h, err := s.fetchStateFile(ctx, d, s.limits.MaxSnapshotSize)
	if err != nil || d.spool == nil {
		return err
	}
	s.loaded = append(s.loaded, d)
	for _, name := range slices.Concat(h.included, h.knows, []string{f.Name}) {
		s.covers[name] = true
	}
	s.download = slices.DeleteFunc(s.download, func(x *downloaded) bool { return x.spool == nil && s.covers[x.name] })
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
func (s *syncRun) coverMissing(ctx context.Context) error {
	if err := s.recoverForgotten(ctx); err != nil {
		return err
	}
	var missing []string
	for _, d := range s.gone {
		missing = append(missing, d.name)
	}
	for _, r := range s.report.Rejected {
		missing = append(missing, r.Name)
	}
	for _, name := range missing {
		for _, f := range s.snaps {
			if s.covers[name] {
				break
			}
			if f.Name == name {
				continue
			}
			h, ok, err := s.readableHeader(ctx, f.Name)
			if err != nil {
				return err
			}
			if ok && (slices.Contains(h.included, name) || slices.Contains(h.knows, name)) {
				if err := s.loadSnapshot(ctx, f); err != nil {
					return err
				}
			}
		}
	}
	for _, d := range s.gone {
		if !s.covers[d.name] {
			return &Error{Op: "download", File: d.name, Err: fmt.Errorf("%w: the file was deleted while this sync ran (another device compacted the remote); sync again", ErrRemote)}
		}
	}
	s.report.Rejected = slices.DeleteFunc(s.report.Rejected, func(r FileError) bool { return s.covers[r.Name] })
	return nil
}

// readableHeader returns a listed snapshot's header; ok is false when the
// snapshot cannot be read or is gone, which only the remote's failure
// makes an error.
func (s *syncRun) readableHeader(ctx context.Context, name string) (h stateHeader, ok bool, err error) {
	h, err = s.header(ctx, name)
	if errors.As(err, new(rejection)) || errors.Is(err, fs.ErrNotExist) {
		return h, false, nil
	}
	return h, err == nil, err
}

// recoverForgotten loads what a rejected file held when reading it again
// found it gone: compaction deleted it, on the authority of a snapshot
// that includes it, and deletes that snapshot in turn only once a newer
// one knows it, whose writer held what it held. So a snapshot on the
// remote that includes the file, or that knows snapshots the remote no
// longer has (the head of such a chain), holds the file's content. This
// is rare and costs a full listing and a header per snapshot.
func (s *syncRun) recoverForgotten(ctx context.Context) error {
	if len(s.forget) == 0 {
		return nil
	}
	files, err := s.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return remoteErr("list", "", err)
	}
	present := map[string]bool{}
	var snaps []RemoteFile
	for _, f := range files {
		present[f.Name] = true
		if k, _, _, ok := parseFileName(f.Name); ok && k == kindSnapshot {
			snaps = append(snaps, f)
		}
	}
	slices.SortFunc(snaps, func(a, b RemoteFile) int { return strings.Compare(b.Name, a.Name) })
	for _, f := range snaps {
		if s.covers[f.Name] {
			continue
		}
		h, ok, err := s.readableHeader(ctx, f.Name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		holds := slices.ContainsFunc(s.forget, func(name string) bool {
			return !s.covers[name] && slices.Contains(slices.Concat(h.included, h.knows), name)
		})
		heads := slices.ContainsFunc(h.knows, func(name string) bool { return !present[name] && !s.covers[name] })
		if holds || heads {
			s.e.log.Info("drivesync: a file this device rejected is gone from the remote; loading a snapshot that holds it", "snapshot", f.Name)
			if err := s.loadSnapshot(ctx, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetchStateFile downloads a snapshot or merge file into d.spool; a file
// that cannot be read is rejected (d.spool stays nil).
func (s *syncRun) fetchStateFile(ctx context.Context, d *downloaded, limit int64) (stateHeader, error) {
	e := s.e
	_, _, device, _ := parseFileName(d.name)
	if d.size > limit {
		s.reject(d, fmt.Errorf("%w: %d bytes, over the %d-byte limit", ErrFileTooLarge, d.size, limit))
		return stateHeader{}, nil
	}
	rc, err := e.cfg.Remote.Open(ctx, d.name)
	if errors.Is(err, fs.ErrNotExist) {
		if d.kind == kindMerge {
			s.vanished(d)
		} else {
			s.snapshotGone(RemoteFile{Name: d.name})
		}
		return stateHeader{}, nil
	}
	if unreadableFile(ctx, err) {
		s.reject(d, err)
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
	h, err := decodeStateFile(src, device, s.limits, func(c fileChange) error {
		maxV = max(maxV, c.version)
		spoolErr = sp.add(c)
		return spoolErr
	})
	if err == nil && h.store != s.store {
		err = rejection{fmt.Errorf("it belongs to store %s, not %s", h.store, s.store)}
	}
	if err == nil {
		_, at, _, _ := parseFileName(d.name)
		err = s.checkVersions(at, maxV)
	}
	if err != nil {
		sp.close()
		return h, s.readFailed(ctx, d, src, spoolErr, err)
	}
	d.spool = sp
	s.maxSeen = max(s.maxSeen, maxV)
	return h, nil
}

// pruneLedger keeps sync_files bounded by what the remote holds: once a
// month (by the remote's clock) it lists the whole remote and forgets the
// applied files and checked snapshots that are gone. Listings since the
// cursor never show a file's deletion, and a device that never writes a
// snapshot (whose writer prunes the same way) would otherwise remember
// every file it ever applied. A file forgotten too early (a listing that
// lags) is downloaded and applied again, which changes nothing. Rejected
// files are kept: they leave through being read again (see
// recoverForgotten).
func (s *syncRun) pruneLedger(ctx context.Context) error {
	month := s.cursor.UTC().Format("2006-01")
	done, err := getMeta(ctx, s.conn, metaPruned)
	if err != nil || done == month {
		return err
	}
	files, err := s.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return remoteErr("list", "", err)
	}
	present := map[string]bool{}
	for _, f := range files {
		present[f.Name] = true
	}
	var gone []string
	for name, k := range s.known {
		if k.held() && !present[name] {
			gone = append(gone, name)
		}
	}
	return s.inTx(ctx, func() error {
		for _, name := range gone {
			if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1 AND status IN ('applied', 'checked')`, name); err != nil {
				return err
			}
		}
		return setMeta(ctx, s.conn, metaPruned, month)
	})
}

// maintain runs after a successful sync: the month's first snapshot, the
// compaction a snapshot of this device made due, and the merge file a
// JoinRemote asked for. force (Engine.Snapshot) writes a snapshot and
// compacts now.
func (s *syncRun) maintain(ctx context.Context, force bool) error {
	e := s.e
	if err := s.pruneLedger(ctx); err != nil {
		return err
	}
	if s.joining {
		if _, err := s.writeState(ctx, kindMerge); err != nil {
			return err
		}
		if err := s.setMetas(ctx, metaJoin, ""); err != nil {
			return err
		}
	}
	last, err := getMeta(ctx, s.conn, metaSnapshot)
	if err != nil {
		return &Error{Op: "snapshot", Err: err}
	}
	lastAt, _ := time.Parse(time.RFC3339Nano, last)
	y1, m1, _ := lastAt.UTC().Date()
	y2, m2, _ := s.cursor.UTC().Date()
	if force || ((y1 != y2 || m1 != m2) && !s.emptyState(ctx)) {
		name, err := s.writeState(ctx, kindSnapshot)
		if errors.Is(err, errUnreadableState) && !force {
			// Nothing is lost: the patch files stay, uncompacted. Try
			// again next month rather than at every sync.
			e.log.Error("drivesync: the monthly snapshot was not written; the remote keeps every patch file until one can be", "err", err)
			return s.setMetas(ctx, metaSnapshot, s.cursor.UTC().Format(time.RFC3339Nano))
		}
		if err != nil {
			return err
		}
		s.report.Snapshot = name
		_, at, _, _ := parseFileName(name)
		if err := s.setMetas(ctx, metaSnapshot, at.Format(time.RFC3339Nano), metaCompact, name); err != nil {
			return err
		}
	}
	due, err := getMeta(ctx, s.conn, metaCompact)
	if err != nil {
		return &Error{Op: "compact", Err: err}
	}
	_, dueAt, _, _ := parseFileName(due)
	if due != "" && !s.cursor.Before(dueAt.Add(e.cfg.ListOverlap)) || force {
		used, err := s.compact(ctx)
		if err != nil {
			return err
		}
		if used != "" && used >= due {
			return s.setMetas(ctx, metaCompact, "")
		}
	}
	return nil
}

func (s *syncRun) emptyState(ctx context.Context) bool {
	var empty bool
	err := s.conn.QueryRowContext(ctx, `SELECT NOT EXISTS (SELECT 1 FROM sync_states)`).Scan(&empty)
	return err == nil && empty
}

// writeState uploads sync_states as a snapshot or merge file.
func (s *syncRun) writeState(ctx context.Context, kind fileKind) (string, error) {
	e := s.e
	op := "snapshot"
	if kind == kindMerge {
		op = "merge"
	}
	h := stateHeader{device: e.deviceID, store: s.store, covers: s.cursor}
	if kind == kindSnapshot {
		h.cutoff = e.retained(s.cursor)
		if b := s.cursor.Add(-2 * e.cfg.ListOverlap); b.Before(h.cutoff) {
			h.cutoff = b // files a little older may still be arriving
		}
		var err error
		if h.included, h.knows, err = s.heldFiles(ctx); err != nil {
			return "", err
		}
	}
	f, err := os.CreateTemp(e.cfg.TempDir, "drivesync-"+op+"-*")
	if err != nil {
		return "", &Error{Op: op, Err: err}
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := s.conn.ExecContext(ctx, "BEGIN DEFERRED"); err != nil {
		endTx(s.conn)
		return "", &Error{Op: op, Err: err}
	}
	n, err := writeStateFile(ctx, s.conn, f, h)
	endTx(s.conn) // a read transaction: ends the snapshot of the database
	if err != nil {
		return "", &Error{Op: op, Err: err}
	}
	if err := s.verifyState(f); err != nil {
		return "", &Error{Op: op, Err: fmt.Errorf("%w: %w (not uploaded: other devices could not read it)", errUnreadableState, err)}
	}
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr(op, "", err)
	}
	if now.Before(s.cursor) {
		now = s.cursor
	}
	for attempt := 0; ; attempt++ {
		name := remoteFileName(kind, now, e.deviceID)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", &Error{Op: op, Err: err}
		}
		if err := s.inTx(ctx, func() error { return noteUpload(ctx, s.conn, name) }); err != nil {
			return "", err
		}
		err := e.cfg.Remote.Create(ctx, name, f)
		if err == nil {
			e.log.Info("drivesync: wrote a "+op+" file", "file", name, "records", n)
			// Its own state: nothing to apply, and a snapshot it checked.
			var size int64
			if fi, err := f.Stat(); err == nil {
				size = fi.Size()
			}
			return name, s.inTx(ctx, func() error {
				return s.exec(ctx, `INSERT OR REPLACE INTO sync_files (name, status, size) VALUES (?1, 'applied', ?2)`, name, size)
			})
		}
		if !errors.Is(err, fs.ErrExist) || attempt == 3 {
			return "", remoteErr(op, name, err)
		}
		now = now.Add(time.Millisecond)
	}
}

// errUnreadableState marks a snapshot or merge file this device wrote that
// fails the checks every reader applies under the store's limits.
var errUnreadableState = errors.New("this device's state does not fit the store's limits")

// verifyState reads back a state file this device wrote, exactly as every
// device that downloads it will: a file that would be rejected must never
// be uploaded, and above all never become the authority that compaction
// deletes the files it replaces on.
func (s *syncRun) verifyState(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > s.limits.MaxSnapshotSize {
		return fmt.Errorf("%w: %d bytes, over the store's MaxSnapshotSize (%d)", ErrFileTooLarge, fi.Size(), s.limits.MaxSnapshotSize)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	_, err = decodeStateFile(bufio.NewReader(f), s.e.deviceID, s.limits, func(fileChange) error { return nil })
	if err != nil {
		return classifyFileErr(err)
	}
	return nil
}

// heldFiles returns the patch and merge files on the remote that this
// device applied, and the snapshots on it that this device checked (see
// chooseSnapshot); it forgets applied files the remote no longer has.
func (s *syncRun) heldFiles(ctx context.Context) (held, knows []string, err error) {
	files, err := s.e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return nil, nil, remoteErr("snapshot", "", err)
	}
	present := map[string]bool{}
	for _, f := range files {
		present[f.Name] = true
	}
	rows, err := s.conn.QueryContext(ctx, `SELECT name, status FROM sync_files WHERE status IN ('applied', 'checked') ORDER BY name`)
	if err != nil {
		return nil, nil, &Error{Op: "snapshot", Err: err}
	}
	var gone []string
	for rows.Next() {
		var name, status string
		if err := rows.Scan(&name, &status); err != nil {
			rows.Close()
			return nil, nil, &Error{Op: "snapshot", Err: err}
		}
		// Oldest first, and no more than the store lets a header list:
		// a file left out is neither compacted nor skipped by a new
		// device, which costs bytes but loses nothing.
		switch k, _, _, _ := parseFileName(name); {
		case !present[name]:
			gone = append(gone, name)
		case k == kindSnapshot:
			if int64(len(knows)) < s.limits.MaxHeldFiles {
				knows = append(knows, name)
			}
		case status == fileApplied && int64(len(held)) < s.limits.MaxHeldFiles:
			held = append(held, name)
		}
	}
	rows.Close()
	err = s.inTx(ctx, func() error {
		for _, name := range gone {
			if err := s.exec(ctx, `DELETE FROM sync_files WHERE name = ?1`, name); err != nil {
				return err
			}
		}
		return nil
	})
	return held, knows, err
}

// compact deletes what the newest snapshot older than ListOverlap
// replaces, and returns its name ("" if there is none yet). A failed
// delete is logged and left for the next compaction.
func (s *syncRun) compact(ctx context.Context) (string, error) {
	e := s.e
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return "", remoteErr("compact", "", err)
	}
	files, err := e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return "", remoteErr("compact", "", err)
	}
	// The authority must be readable by every device: a snapshot this
	// device read whole (or wrote), or one whose writer read it back under
	// the store's limits before uploading it (its header says so). A
	// header alone proves nothing of the records behind it, and deleting
	// the files a snapshot replaces on the word of one no device can read
	// would lose them.
	applied := map[string]bool{}
	rows, err := s.conn.QueryContext(ctx, `SELECT name FROM sync_files WHERE status = 'applied' AND name LIKE '%/snapshot\_%' ESCAPE '\'`)
	if err != nil {
		return "", &Error{Op: "compact", Err: err}
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return "", &Error{Op: "compact", Err: err}
		}
		applied[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return "", &Error{Op: "compact", Err: err}
	}
	var candidates []string
	for _, f := range files {
		kind, at, _, ok := parseFileName(f.Name)
		if ok && kind == kindSnapshot && !at.After(now.Add(-e.cfg.ListOverlap)) {
			candidates = append(candidates, f.Name)
		}
	}
	slices.Sort(candidates)
	var authority string
	var h stateHeader
	for i := len(candidates) - 1; i >= 0 && authority == ""; i-- {
		name := candidates[i]
		hh, err := s.readHeader(ctx, name)
		switch {
		case errors.As(err, new(rejection)) || errors.Is(err, fs.ErrNotExist):
			e.log.Warn("drivesync: a snapshot cannot be read; not compacting on its authority", "file", name, "err", err)
		case err != nil:
			return "", err
		case applied[name] || hh.verified:
			authority, h = name, hh
		}
	}
	if authority == "" {
		return "", nil
	}
	// Only what the authority holds: the files it names, and the older
	// snapshots its writer had checked (a snapshot written by a device
	// that had not yet seen an older one does not replace it).
	held, knows := map[string]bool{}, map[string]bool{}
	for _, name := range h.included {
		held[name] = true
	}
	for _, name := range h.knows {
		knows[name] = true
	}
	for _, f := range files {
		kind, at, _, ok := parseFileName(f.Name)
		if !ok {
			continue
		}
		old := (kind == kindSnapshot && knows[f.Name]) || (held[f.Name] && at.Before(h.cutoff))
		if !old {
			continue
		}
		if err := e.cfg.Remote.Delete(ctx, f.Name); err != nil {
			if ctx.Err() != nil {
				return "", &Error{Op: "compact", Err: ctx.Err()}
			}
			e.log.Warn("drivesync: could not delete an old file; the next compaction retries", "file", f.Name, "err", err)
			continue
		}
		s.report.Deleted++
	}
	e.log.Info("drivesync: compacted", "snapshot", authority, "deleted", s.report.Deleted)
	return authority, nil
}

// Snapshot syncs, then writes a snapshot of this database's synced state
// and compacts the remote now: it deletes the patch files and snapshots
// that the newest snapshot older than Config.ListOverlap replaces (the one
// just written replaces files once every device can see it: at the first
// sync after that). A sync writes a snapshot by itself once a month;
// Snapshot is for an app's maintenance button, and for tests.
func (e *Engine) Snapshot(ctx context.Context) (Report, error) {
	return e.run(ctx, func(s *syncRun) error {
		if err := s.run(ctx); err != nil {
			return err
		}
		return s.maintain(ctx, true)
	})
}

// JoinRemote binds this database to the store the remote holds now, after
// Sync failed with ErrRemoteChanged because the remote carries another
// store. The next Sync starts from that store's newest snapshot and files,
// merges them with this database (last writer wins, per field) and uploads
// this database's records there, so that the other devices of that store
// get them. Nothing is deleted on either side.
func (e *Engine) JoinRemote(ctx context.Context) error {
	_, err := e.run(ctx, func(s *syncRun) error {
		m, found, err := readMarker(ctx, e.cfg.Remote)
		if err != nil {
			return err
		}
		if !found {
			return &Error{Op: "join", File: markerName, Err: errors.New("the remote holds no store to join (it has no marker): call StartFresh to make this database's data a new store there")}
		}
		return s.rebind(ctx, m.Store, true)
	})
	return err
}

// StartFresh makes this database's data a new store on the remote, after
// Sync failed with ErrRemoteChanged because the remote was emptied: it
// writes a new marker, syncs, and uploads a snapshot of every record.
// Other devices of the old store then get ErrRemoteChanged and can
// JoinRemote. StartFresh refuses a remote that holds a store already.
func (e *Engine) StartFresh(ctx context.Context) (Report, error) {
	return e.run(ctx, func(s *syncRun) error {
		m, found, err := readMarker(ctx, e.cfg.Remote)
		if err != nil {
			return err
		}
		if found {
			return &Error{Op: "start fresh", File: markerName, Err: fmt.Errorf("the remote holds store %s: call JoinRemote to merge with it, or point the app at an empty folder", m.Store)}
		}
		now, err := e.cfg.Remote.Now(ctx)
		if err != nil {
			return remoteErr("start fresh", "", err)
		}
		store := newStoreID()
		if err := writeMarker(ctx, e.cfg.Remote, store, now, e.cfg.Limits); err != nil {
			return remoteErr("start fresh", markerName, err)
		}
		if err := s.rebind(ctx, store, false); err != nil {
			return err
		}
		if err := s.run(ctx); err != nil {
			return err
		}
		return s.maintain(ctx, true)
	})
}

// rebind records store as this database's and forgets what it knew of
// the old remote, so that the next sync reads the new one from the start.
func (s *syncRun) rebind(ctx context.Context, store string, join bool) error {
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "rebind", Err: err}
	}
	err := func() error {
		if _, err := s.conn.ExecContext(ctx, `DELETE FROM sync_files`); err != nil {
			return err
		}
		j := ""
		if join {
			j = "1"
		}
		for _, kv := range [][2]string{{metaStore, store}, {metaStoreClaim, ""}, {metaCursor, ""}, {metaSnapshot, ""}, {metaCompact, ""}, {metaJoin, j}, {metaRemoteID, ""}} {
			if err := setMeta(ctx, s.conn, kv[0], kv[1]); err != nil {
				return err
			}
		}
		_, err := s.conn.ExecContext(ctx, "COMMIT")
		return err
	}()
	if err != nil {
		endTx(s.conn)
		return &Error{Op: "rebind", Err: err}
	}
	s.e.log.Info("drivesync: bound to a store", "store", store, "join", join)
	return nil
}

func newStoreID() string { return uuid.NewString() }
