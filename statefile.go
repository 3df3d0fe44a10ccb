package drivesync

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"time"

	"github.com/drivesync/drivesync/internal/merge"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// A state file (a snapshot or a merge file) holds records' whole states
// with their clocks; this room is its format: writing, reading and
// checking it.

// stateFormat is the snapshot and merge file format this engine writes; it
// reads every format up to it. Format 2 keeps a deleted record's fields
// under its tombstone, with the delete's stamp in the clock's "x".
const stateFormat = 2

// stateHeader is the header of a snapshot or merge file.
type stateHeader struct {
	device   string
	store    string
	covers   time.Time // the writer's listing time: older files are in it
	cutoff   time.Time // snapshots: compaction may delete patch files named before it
	included []string  // snapshots: the patch and merge files the state holds
	knows    []string  // snapshots: the older snapshots its writer had checked (see chooseSnapshot)
	// holds (snapshots): the numbers of the files whose content the state
	// holds; nil when the writer did not say (see vanished.go). seq (merge
	// files): the file's number among its device's.
	holds heldSet
	seq   int64
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
// Memory stays flat: rows go out as they are read. A record over the
// store's record limit goes out in parts (see stateParts).
//
// unfit, if set, takes each record that cannot go out even in parts (a
// single value over maxRecord) instead of failing the file, which holds
// the record without those values (see pruneNode): a merge file, whose
// writer then stores the same (see pruneUnfit).
func writeStateFile(ctx context.Context, q querier, w io.Writer, h stateHeader, maxRecord int64, unfit func(recordKey)) (records int, err error) {
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
	if h.holds != nil {
		b = h.holds.appendJSON(append(b, `,"holds":`...))
	}
	if h.seq > 0 {
		b = fmt.Appendf(b, `,"seq":%d`, h.seq)
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
	entries := 0
	write := func(data, clock []byte) error {
		b = b[:0]
		if entries > 0 {
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
		entries++
		_, err := bw.Write(b)
		return err
	}
	for rows.Next() {
		if err := rows.Scan(&table, &record, &data, &clock, &deleted); err != nil {
			return records, err
		}
		records++
		if int64(len(data)) <= maxRecord && int64(len(clock)) <= 2*maxRecord {
			if err := write(data, clock); err != nil {
				return records, err
			}
			continue
		}
		parts, err := merge.StateParts(data, clock, deleted, maxRecord, false)
		if errors.Is(err, errTooLarge) && unfit != nil {
			unfit(recordKey{string(table), string(record)})
			parts, err = merge.StateParts(data, clock, deleted, maxRecord, true)
		}
		if err != nil {
			return records, fmt.Errorf("record %s/%s: %w", table, record, err)
		}
		for _, p := range parts {
			d, c := merge.EncodeState(p)
			if err := write([]byte(d), []byte(c)); err != nil {
				return records, err
			}
		}
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
	// canonical: State is spelled canonically, as the plain scan found
	// (see entrydecode.go); not a member of the file.
	canonical bool
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
	s := newJSONStream(&limitedReader{r: gz, n: l.MaxSnapshotSize, what: "uncompressed content"})
	valueBound := addCapped(boundFor(maxRecord), addCapped(maxRecord, maxRecord)) // content and clock
	if err := s.token('{'); err != nil {
		return h, err
	}
	var format int64
	seen := map[string]bool{}
	devices := map[string]bool{} // device ids already checked
	for n := 0; ; n++ {
		key, ok, err := s.member(n)
		if err != nil {
			return h, err
		}
		if !ok {
			break
		}
		if seen[key] {
			return h, fmt.Errorf("member %q appears twice", key)
		}
		seen[key] = true
		s.setLimit(valueBound)
		switch key {
		case "format":
			var n json.Number
			if err := s.decode(&n); err != nil {
				return h, fmt.Errorf("format: %w", err)
			}
			if format, err = n.Int64(); err != nil || format < 1 {
				return h, fmt.Errorf("format %q is not a positive integer", n)
			}
			if format > stateFormat {
				return h, fmt.Errorf("%w: format %d; this app reads up to %d", ErrUnsupportedFormat, format, stateFormat)
			}
		case "device":
			if err := s.decode(&h.device); err != nil {
				return h, fmt.Errorf("device: %w", err)
			}
			if h.device != wantDevice {
				return h, fmt.Errorf("file says device %q but its name says %q", h.device, wantDevice)
			}
		case "store":
			if err := s.decode(&h.store); err != nil {
				return h, fmt.Errorf("store: %w", err)
			}
		case "verified":
			if err := s.decode(&h.verified); err != nil {
				return h, fmt.Errorf("verified: %w", err)
			}
		case "covers", "cutoff":
			var text string
			if err := s.decode(&text); err != nil {
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
			s.setLimit(l.MaxHeldFiles*(maxHeldName+4) + 64<<10)
			var names []string
			if err := s.decode(&names); err != nil {
				return h, fmt.Errorf("%s: %w", key, err)
			}
			if int64(len(names)) > l.MaxHeldFiles {
				return h, fmt.Errorf("%w: %s lists %d files, over the store's MaxHeldFiles (%d)", errTooLarge, key, len(names), l.MaxHeldFiles)
			}
			for _, name := range names {
				// Any folder: an older engine's snapshot may list another
				// store's file it took in. Held here, such a name is never
				// compacted: compaction deletes only names parseFileName
				// takes.
				kind, _, _, ok := parseFileNameAnywhere(name)
				if !ok || len(name) > maxHeldName || (kind == kindSnapshot) != (key == "knows") {
					return h, fmt.Errorf("%s: %q is not a name of the right kind", key, name)
				}
			}
			if key == "knows" {
				h.knows = names
			} else {
				h.included = names
			}
		case "holds":
			// Bounded as an unknown member, and one that no engine
			// writes holds nothing: an engine that does not know it
			// skips it, and a file reads alike on every version.
			var raw json.RawMessage
			if err := s.decode(&raw); err != nil {
				return h, fmt.Errorf("holds: %w", err)
			}
			if held, err := parseHeld(raw, l.MaxHeldFiles); err == nil {
				h.holds = held
			}
		case "seq":
			if h.seq, err = decodeSeq(s); err != nil {
				return h, err
			}
		case "records":
			if format == 0 || h.device == "" || h.store == "" || h.covers.IsZero() {
				return h, errors.New(`"format", "device", "store" and "covers" must come before "records"`)
			}
			if emit == nil {
				return h, nil
			}
			err := s.elements(valueBound, "record", func(i int, raw []byte) error {
				var e stateEntry
				if err := decodeStateEntry(raw, &e); err != nil {
					return fmt.Errorf("record %d: %w", i, err)
				}
				c, err := validateStateEntry(e, maxRecord, devices)
				if err != nil {
					return fmt.Errorf("record %d: %w", i, err)
				}
				return emit(c)
			})
			if err != nil {
				return h, err
			}
		default: // members of later formats
			if err := s.skip(); err != nil {
				return h, err
			}
		}
	}
	if !seen["records"] {
		return h, errors.New(`no "records"`)
	}
	return h, s.atEnd()
}

// validateStateEntry checks one record of a state file and returns it in
// the canonical form sync_states stores. Its clock must be one the merge
// rules can produce, or devices that merge it could disagree.
func validateStateEntry(e stateEntry, maxRecord int64, devices map[string]bool) (fileChange, error) {
	if err := merge.CheckTableName(e.Table); err != nil {
		return fileChange{}, err
	}
	if e.Record == "" || len(e.Record) > merge.MaxRecordIDLen {
		return fileChange{}, fmt.Errorf("record id of %d bytes (want 1-%d)", len(e.Record), merge.MaxRecordIDLen)
	}
	if int64(len(e.State)) > maxRecord || int64(len(e.Clock)) > 2*maxRecord {
		return fileChange{}, fmt.Errorf("%w: record %s/%s is over the %d-byte record limit", errTooLarge, e.Table, e.Record, maxRecord)
	}
	if at, ok := merge.ParseFreshClock(e.Clock); ok && !e.Deleted {
		// A record one write made, every path at its root's stamp: the
		// state DecodeState would build and EncodeState write back, with
		// no tree (see merge.FreshClock).
		data, err := canonicalObject(e.State, e.canonical, jsonv.Options{})
		if err != nil {
			return fileChange{}, fmt.Errorf("state of %s/%s: %w", e.Table, e.Record, err)
		}
		if err := merge.CheckStamp(at, devices); err != nil {
			return fileChange{}, fmt.Errorf("clock of %s/%s: %w", e.Table, e.Record, err)
		}
		return fileChange{table: e.Table, record: e.Record, patch: data, clock: e.Clock, // FreshClock's bytes
			version: at.Version, device: at.Device, oldest: at.Version}, nil
	}
	content, err := jsonv.ParseObject(e.State, jsonv.Options{})
	if err != nil {
		return fileChange{}, fmt.Errorf("state of %s/%s: %w", e.Table, e.Record, err)
	}
	n, err := merge.DecodeState(content, e.Clock, e.Deleted)
	if err == nil {
		err = merge.CheckRecordClock(n, devices)
	}
	if err != nil {
		return fileChange{}, fmt.Errorf("clock of %s/%s: %w", e.Table, e.Record, err)
	}
	data, clock := merge.EncodeState(n)
	return fileChange{table: e.Table, record: e.Record, patch: []byte(data), clock: []byte(clock),
		deleted: !n.Exists(), version: n.Newest().Version, device: n.Newest().Device, oldest: n.Oldest()}, nil
}
