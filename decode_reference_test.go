package drivesync

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// The patch- and state-file readers of earlier versions, which read with
// json.Decoder and validated each change by parsing it, kept as the
// reference the current readers must match on
// every input (FuzzDecodeLikeBefore): devices on older app versions read
// the same store.

// valueLimiter fails reads past limit, a position in the stream that the
// decoder moves forward value by value.
type valueLimiter struct {
	r     io.Reader
	read  int64
	limit int64
}

func (v *valueLimiter) Read(p []byte) (int, error) {
	room := v.limit - v.read
	if room <= 0 {
		return 0, fmt.Errorf("%w: one change is over the record size limit", errTooLarge)
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := v.r.Read(p)
	v.read += int64(n)
	return n, err
}

func refDecodePatchFile(r io.Reader, wantDevice string, maxExpanded, maxRecord int64, emit func(fileChange) error) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("not gzip: %w", err)
	}
	defer gz.Close()
	values := &valueLimiter{r: &limitedReader{r: gz, n: maxExpanded, what: "uncompressed content"}, limit: math.MaxInt64}
	dec := json.NewDecoder(values)
	dec.UseNumber()
	// json.Decoder buffers a whole value: bound each change (and each
	// unknown member) to what a record may take, so that one huge change
	// cannot make the decoder hold the whole file.
	valueBound := boundFor(maxRecord)
	bound := func() { values.limit = addCapped(dec.InputOffset(), valueBound) }
	if err := refExpectDelim(dec, '{'); err != nil {
		return err
	}
	var format int64
	var device string
	sawChanges := false
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		if seen[key] {
			// Readers disagree on repeated members (first or last
			// wins?): an untrusted file must not be read two ways.
			return fmt.Errorf("member %q appears twice", key)
		}
		seen[key] = true
		switch key {
		case "format":
			var n json.Number
			if err := dec.Decode(&n); err != nil {
				return fmt.Errorf("format: %w", err)
			}
			if format, err = n.Int64(); err != nil || format < 1 {
				return fmt.Errorf("format %q is not a positive integer", n)
			}
			if format > patchFormat {
				return fmt.Errorf("%w: format %d; this app reads up to %d", ErrUnsupportedFormat, format, patchFormat)
			}
		case "device":
			if err := dec.Decode(&device); err != nil {
				return fmt.Errorf("device: %w", err)
			}
			if device != wantDevice {
				return fmt.Errorf("file says device %q but its name says %q", device, wantDevice)
			}
		case "changes":
			if format == 0 || device == "" {
				return errors.New(`"format" and "device" must come before "changes"`)
			}
			if err := refExpectDelim(dec, '['); err != nil {
				return fmt.Errorf("changes: %w", err)
			}
			for i := 0; dec.More(); i++ {
				var e fileEntry
				bound()
				if err := dec.Decode(&e); err != nil {
					return fmt.Errorf("change %d: %w", i, err)
				}
				c, err := refValidateEntry(e, format, maxRecord)
				if err != nil {
					return fmt.Errorf("change %d: %w", i, err)
				}
				c.device = device
				if err := emit(c); err != nil {
					return err
				}
			}
			if err := refExpectDelim(dec, ']'); err != nil {
				return err
			}
			sawChanges = true
		default:
			var skip json.RawMessage // fields of later formats
			bound()
			if err := dec.Decode(&skip); err != nil {
				return err
			}
		}
	}
	if err := refExpectDelim(dec, '}'); err != nil {
		return err
	}
	if !sawChanges {
		return errors.New(`no "changes"`)
	}
	switch _, err := dec.Token(); {
	case err == io.EOF:
		return nil
	case err != nil:
		return err // a read error, or malformed trailing data
	}
	return errors.New("data after the end of the file")
}

func refExpectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("expected %q, found %v", want, tok)
	}
	return nil
}

func refDecodeStateFile(r io.Reader, wantDevice string, l Limits, emit func(fileChange) error) (stateHeader, error) {
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
	valueBound := addCapped(boundFor(maxRecord), addCapped(maxRecord, maxRecord)) // content and clock
	bound := func() { values.limit = addCapped(dec.InputOffset(), valueBound) }
	if err := refExpectDelim(dec, '{'); err != nil {
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
		case "records":
			if format == 0 || h.device == "" || h.store == "" || h.covers.IsZero() {
				return h, errors.New(`"format", "device", "store" and "covers" must come before "records"`)
			}
			if emit == nil {
				return h, nil
			}
			if err := refExpectDelim(dec, '['); err != nil {
				return h, fmt.Errorf("records: %w", err)
			}
			for i := 0; dec.More(); i++ {
				var e stateEntry
				bound()
				if err := dec.Decode(&e); err != nil {
					return h, fmt.Errorf("record %d: %w", i, err)
				}
				c, err := refValidateStateEntry(e, maxRecord, devices)
				if err != nil {
					return h, fmt.Errorf("record %d: %w", i, err)
				}
				if err := emit(c); err != nil {
					return h, err
				}
			}
			if err := refExpectDelim(dec, ']'); err != nil {
				return h, err
			}
		default:
			var skip json.RawMessage // members of later formats
			if err := dec.Decode(&skip); err != nil {
				return h, err
			}
		}
	}
	if err := refExpectDelim(dec, '}'); err != nil {
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

func refValidateEntry(e fileEntry, format, maxRecord int64) (fileChange, error) {
	if err := merge.CheckTableName(e.Table); err != nil {
		return fileChange{}, err
	}
	if e.Record == "" || len(e.Record) > merge.MaxRecordIDLen {
		return fileChange{}, fmt.Errorf("record id of %d bytes (want 1-%d)", len(e.Record), merge.MaxRecordIDLen)
	}
	if e.Version < 1 || e.Version > merge.MaxVersion {
		return fileChange{}, fmt.Errorf("sync_version %d out of range (1-%d)", e.Version, int64(merge.MaxVersion))
	}
	if int64(len(e.Patch)) > maxRecord {
		// Checked before parsing: a parsed tree takes many times its
		// text's size.
		return fileChange{}, fmt.Errorf("%w: patch of %s/%s has %d bytes, over the %d-byte record limit", errTooLarge, e.Table, e.Record, len(e.Patch), maxRecord)
	}
	c := fileChange{table: e.Table, record: e.Record, deleted: e.Deleted, version: e.Version, patch: []byte("{}")}
	switch {
	case e.Reset != nil && (format < 3 || !e.Replaces):
		return fileChange{}, fmt.Errorf("%s/%s: a reset belongs only to a replacing write of format 3", e.Table, e.Record)
	case e.Replaces && format >= 3 && e.Reset == nil:
		return fileChange{}, fmt.Errorf("%s/%s: a replacing write of format 3 must name its reset", e.Table, e.Record)
	case e.Replaces && format >= 3:
		if e.Reset.Version < 1 || e.Reset.Version >= e.Version || merge.CheckDeviceID(e.Reset.Device) != nil {
			return fileChange{}, fmt.Errorf("%s/%s: reset {%d %q} must be a valid stamp below the write's version %d", e.Table, e.Record, e.Reset.Version, e.Reset.Device, e.Version)
		}
		if e.Deleted {
			return fileChange{}, fmt.Errorf("%s/%s: a replacing patch cannot be a delete", e.Table, e.Record)
		}
		c.flags |= changeReplaces
		c.reset = merge.Stamp{Version: e.Reset.Version, Device: e.Reset.Device}
	case e.Replaces && (format < 2 || e.Deleted || e.Version < 2):
		return fileChange{}, fmt.Errorf("%s/%s: a replacing patch must be a format 2 write of version 2 or more", e.Table, e.Record)
	case e.Replaces:
		c.flags |= changeReplaces
	case e.Deleted && format == 1:
		c.flags |= changeHard
	}
	if e.Deleted {
		return c, nil // its patch cannot matter
	}
	p, err := jsonv.ParseObject(e.Patch, jsonv.Options{KeepNulls: true})
	if err != nil {
		return fileChange{}, fmt.Errorf("patch of %s/%s: %w", e.Table, e.Record, err)
	}
	c.patch = jsonv.Encode(p)
	if len(e.Seen) > 0 && len(e.Seen) <= maxSeen {
		c.seen = e.Seen // read when applied; one that cannot be read logs nothing
	}
	return c, nil
}

// refValidateStateEntry checks one record of a state file and returns it in
// the canonical form sync_states stores. Its clock must be one the merge
// rules can produce, or devices that merge it could disagree.
func refValidateStateEntry(e stateEntry, maxRecord int64, devices map[string]bool) (fileChange, error) {
	if err := merge.CheckTableName(e.Table); err != nil {
		return fileChange{}, err
	}
	if e.Record == "" || len(e.Record) > merge.MaxRecordIDLen {
		return fileChange{}, fmt.Errorf("record id of %d bytes (want 1-%d)", len(e.Record), merge.MaxRecordIDLen)
	}
	if int64(len(e.State)) > maxRecord || int64(len(e.Clock)) > 2*maxRecord {
		return fileChange{}, fmt.Errorf("%w: record %s/%s is over the %d-byte record limit", errTooLarge, e.Table, e.Record, maxRecord)
	}
	content, err := jsonv.ParseObject(e.State, jsonv.Options{})
	if err != nil {
		return fileChange{}, fmt.Errorf("state of %s/%s: %w", e.Table, e.Record, err)
	}
	if at, ok := merge.ParseFreshClock(e.Clock); ok && !e.Deleted {
		// A record one write made, every path at its root's stamp: the
		// state DecodeState would build and EncodeState write back, with
		// no tree (see merge.FreshClock).
		if err := merge.CheckStamp(at, devices); err != nil {
			return fileChange{}, fmt.Errorf("clock of %s/%s: %w", e.Table, e.Record, err)
		}
		return fileChange{table: e.Table, record: e.Record, patch: jsonv.Encode(content), clock: e.Clock, // FreshClock's bytes
			version: at.Version, device: at.Device}, nil
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
		deleted: !n.Exists(), version: n.Newest().Version, device: n.Newest().Device}, nil
}
