package drivesync

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drivesync/drivesync/internal/merge"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// A patch file is one device's changes from one sync: gzip-compressed JSON,
// named patch_{remoteTime}_{deviceID}.json.gz under the YYYY/MM/DD folder
// of the remote time, so names sort by the time the remote saw them:
//
//	{"format":1,"device":"<device id>","changes":[
//	  {"table_name":"notes","record_id":"<id>","patch":{...},"is_deleted":false,"sync_version":124},
//	  ...],"seq":17}
//
// seq numbers the file among its device's files (1, 2, 3, ...; see
// vanished.go); files of engines that did not number them have none, and
// readers that do not know it skip it.
//
// patch is an RFC 7396 merge patch against the record's last synced state;
// a physical delete has is_deleted true and an empty patch. A write with
// "replaces":true (format 2) is a record created again over one its
// device saw deleted: its patch is the whole record, and every write
// stamped before it is gone. In format 3 it names the stamp of the
// newest write or delete of the record its device had seen ("reset":
// {"sync_version":N,"device":"<device id>"}), and only writes stamped up
// to that one are gone: a write of another device that it had not seen
// and that the delete did not hide merges with it, as two creates of one
// record do. One change may take several writes of one
// record, all with the same version: together they are one write (see
// ownWrites).

// patchFormat is the format version this engine writes. It reads every
// version up to this one and refuses newer ones. Format 2 keeps the layout
// of format 1 and changes what a physical delete means (it hides the
// record's fields instead of dropping them, see patch.go): an engine that
// reads only format 1 would merge format 2 files differently, so it must
// refuse them. Format 3 adds a replacing write's reset stamp, which a
// format 2 reader would ignore; the engine writes format 3 only for files
// that hold such a write, so that devices on an older app version read
// every other file.
const patchFormat = 3

const nameTimeLayout = "20060102T150405.000Z"

func patchFileName(at time.Time, device string) string {
	return remoteFileName(kindPatch, at, device)
}

// parsePatchName returns the time and device a patch file name claims.
func parsePatchName(name string) (at time.Time, device string, ok bool) {
	kind, at, device, ok := parseFileName(name)
	if kind != kindPatch {
		return time.Time{}, "", false
	}
	return at, device, ok
}

// The kinds of file the engine writes, by the prefix of their names.
type fileKind uint8

const (
	kindPatch    fileKind = iota + 1 // one sync's changes (this file)
	kindSnapshot                     // every record's state (snapshot.go)
	kindMerge                        // a state file every device applies (snapshot.go)
)

var kindPrefixes = [...]string{kindPatch: "patch_", kindSnapshot: "snapshot_", kindMerge: "merge_"}

// remoteFileName names a file written at the remote time at:
// YYYY/MM/DD/{kind}_{time}_{device}.json.gz, sortable by time.
func remoteFileName(kind fileKind, at time.Time, device string) string {
	at = at.UTC()
	return at.Format("2006/01/02") + "/" + kindPrefixes[kind] + at.Format(nameTimeLayout) + "_" + device + ".json.gz"
}

// parseFileName returns the kind, time and device a file name claims; ok
// is false for a name the engine does not write: only the one spelling
// of a name remoteFileName makes is taken, in the day folder of its
// time. A file elsewhere is another store's kept below this one's root
// (an S3 store under a prefix of the bucket's root store, a store's
// folder inside another's), which must be neither applied nor compacted
// here; and time.Parse also takes a comma for the decimal point, but two
// names for one file would be two files to the ledger.
func parseFileName(name string) (kind fileKind, at time.Time, device string, ok bool) {
	kind, at, device, ok = parseFileNameAnywhere(name)
	if !ok || name != remoteFileName(kind, at, device) {
		return 0, time.Time{}, "", false
	}
	return kind, at, device, true
}

// parseFileNameAnywhere is parseFileName for a name in any folder and
// spelling: the names that snapshot headers of older engines may list
// (they took another store's files below theirs in as their own).
func parseFileNameAnywhere(name string) (kind fileKind, at time.Time, device string, ok bool) {
	if checkRemoteName(name) != nil {
		return 0, time.Time{}, "", false // "..", absolute, hidden: not a name we write
	}
	base := path.Base(name)
	rest := ""
	for k, p := range kindPrefixes {
		if r, found := strings.CutPrefix(base, p); found && p != "" {
			kind, rest = fileKind(k), r
			break
		}
	}
	if kind == 0 {
		return 0, time.Time{}, "", false
	}
	rest, found := strings.CutSuffix(rest, ".json.gz")
	if !found || len(rest) < len(nameTimeLayout)+2 || rest[len(nameTimeLayout)] != '_' {
		return 0, time.Time{}, "", false
	}
	at, err := time.Parse(nameTimeLayout, rest[:len(nameTimeLayout)])
	device = rest[len(nameTimeLayout)+1:]
	if err != nil || merge.CheckDeviceID(device) != nil {
		return 0, time.Time{}, "", false
	}
	return kind, at, device, true
}

// fileEntry is one change in a patch file.
type fileEntry struct {
	Table   string          `json:"table_name"`
	Record  string          `json:"record_id"`
	Patch   json.RawMessage `json:"patch"`
	Deleted bool            `json:"is_deleted"`
	Version int64           `json:"sync_version"`
	// Replaces (format 2): the patch is the record's whole content, and
	// every write stamped before it is gone (see applyChange).
	Replaces bool `json:"replaces,omitempty"`
	// Reset (format 3, with Replaces): the newest write or delete of the
	// record its writer had seen; only writes up to it are gone.
	Reset *entryStamp `json:"reset,omitempty"`
	// Seen (any format, optional): what the writer's synced state held at
	// the paths it writes, for the conflict log (see conflicts.go).
	// Readers that do not know it merge alike.
	Seen json.RawMessage `json:"seen,omitempty"`
	// canonical: Patch is spelled canonically, as the plain scan found
	// (see entrydecode.go); not a member of the file.
	canonical bool
}

type entryStamp struct {
	Version int64  `json:"sync_version"`
	Device  string `json:"device"`
}

// patchWriter streams a patch file, within the store's limits on its
// compressed and uncompressed size: add says whether a change still fits,
// so that the writer never makes a file every reader rejects.
//
// The compressed size of what the compressor has not flushed yet is only
// bounded: deflate stores a block it cannot shrink, adding 5 bytes per
// block of up to 64 KiB, and the bound allows a 64th more, plus the gzip
// header and trailer. When the bound no longer fits, the compressor is
// flushed and the bound starts again from the bytes written. Near the
// limit, the writer ends the gzip stream and writes each further change
// as a gzip member of its own, whose size it knows exactly before
// writing it (gzip readers read concatenated members as one stream).
type patchWriter struct {
	format int             // the file's format: 2, or 3 for a file that holds resets
	out    *countingWriter // the compressed bytes written so far
	gz     *gzip.Writer
	bw     *bufio.Writer // nil once the stream ended: one member per change
	buf    []byte
	n      int // changes written

	maxFile, maxExpanded int64
	in                   int64 // uncompressed bytes written so far
	// flushedIn and flushedOut are in and out.n at the last flush.
	flushedIn, flushedOut int64
}

// patchTrailer ends a patch file's JSON, after its changes: with the
// file's number among its device's files ("seq", see vanished.go), known
// only once the plan knows which files it sends, or without it.
func patchTrailer(seq int64) []byte {
	if seq == 0 {
		return []byte("\n]}\n")
	}
	return fmt.Appendf(nil, "\n],\"seq\":%d}\n", seq)
}

// maxTrailer bounds the length of a patch file's trailer, and
// maxTrailerMember that of the trailer as a gzip member of its own (a
// stored deflate block and gzip's header and footer around it).
const (
	maxTrailer       = int64(len("\n],\"seq\":") + 19 + len("}\n"))
	maxTrailerMember = maxTrailer + 64
)

// newPatchWriter starts a patch file of the given format.
func newPatchWriter(w io.Writer, device string, format int, l Limits) (*patchWriter, error) {
	out := &countingWriter{w: w}
	gz, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	pw := &patchWriter{format: format, gz: gz, out: out, bw: bufio.NewWriterSize(gz, 64<<10), maxFile: l.MaxFileSize, maxExpanded: l.MaxExpandedSize}
	pw.buf = fmt.Appendf(pw.buf[:0], `{"format":%d,"device":`, format)
	pw.buf = jsonv.AppendString(pw.buf, device)
	pw.buf = append(pw.buf, `,"changes":[`...)
	pw.in = int64(len(pw.buf))
	_, err = pw.bw.Write(pw.buf)
	return pw, err
}

// entry encodes one change as add takes it, appending to b. A replacing
// write's reset goes only in a file of format 3 (see entryFormat).
func (pw *patchWriter) entry(b []byte, c fileChange) []byte {
	table, record, patch, deleted, version := c.table, c.record, c.patch, c.deleted, c.version
	b = append(b, ",\n{\"table_name\":"...)
	b = jsonv.AppendString(b, table)
	b = append(b, `,"record_id":`...)
	b = jsonv.AppendString(b, record)
	b = append(b, `,"patch":`...)
	b = append(b, patch...)
	b = fmt.Appendf(b, `,"is_deleted":%t,"sync_version":%d`, deleted, version)
	if c.seen != nil {
		b = append(b, `,"seen":`...)
		b = append(b, c.seen...)
	}
	if c.flags&changeReplaces != 0 {
		b = append(b, `,"replaces":true`...)
		if c.reset.Version > 0 {
			b = fmt.Appendf(b, `,"reset":{"sync_version":%d,"device":`, c.reset.Version)
			b = jsonv.AppendString(b, c.reset.Device)
			b = append(b, '}')
		}
	}
	return append(b, '}')
}

// entryFormat is the oldest patch format that holds change c: 3 for a
// replacing write with its reset, else 2.
func entryFormat(c fileChange) int {
	if c.flags&changeReplaces != 0 && c.reset.Version > 0 {
		return 3
	}
	return 2
}

// add writes the entries of one change (encoded by entry) if they fit
// in the file with its end, and reports whether they did.
func (pw *patchWriter) add(entries []byte) (bool, error) {
	if pw.n == 0 {
		entries = entries[1:] // no comma before the first
	}
	if pw.in+int64(len(entries))+maxTrailer > pw.maxExpanded {
		return false, nil
	}
	if pw.bw != nil {
		bound := func() int64 {
			x := pw.in - pw.flushedIn + int64(len(entries)) + maxTrailer
			return pw.flushedOut + x + x/64 + 64
		}
		if bound() > pw.maxFile && pw.flushedIn < pw.in {
			if err := pw.flush(); err != nil {
				return false, err
			}
		}
		if bound() <= pw.maxFile {
			pw.in += int64(len(entries))
			pw.n++
			_, err := pw.bw.Write(entries)
			return true, err
		}
		if err := pw.endStream(); err != nil {
			return false, err
		}
	}
	m, err := gzipMember(entries)
	if err != nil {
		return false, err
	}
	if pw.out.n+int64(len(m))+maxTrailerMember > pw.maxFile {
		return false, nil
	}
	pw.in += int64(len(entries))
	pw.n++
	_, err = pw.out.Write(m)
	return true, err
}

func (pw *patchWriter) flush() error {
	if err := pw.bw.Flush(); err != nil {
		return err
	}
	if err := pw.gz.Flush(); err != nil {
		return err
	}
	pw.flushedIn, pw.flushedOut = pw.in, pw.out.n
	return nil
}

// endStream ends the gzip stream: what follows goes in members of its own.
func (pw *patchWriter) endStream() error {
	if err := pw.bw.Flush(); err != nil {
		return err
	}
	pw.bw = nil
	return pw.gz.Close()
}

// gzipMember returns b compressed as one gzip member.
func gzipMember(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := gz.Write(b); err != nil {
		return nil, err
	}
	err = gz.Close()
	return buf.Bytes(), err
}

// close ends the file, numbered seq (0: no number). Its sizes are
// checked once more: a file over the store's limits would be rejected by
// every reader.
func (pw *patchWriter) close(seq int64) error {
	trailer := patchTrailer(seq)
	pw.in += int64(len(trailer))
	if pw.bw != nil {
		if _, err := pw.bw.Write(trailer); err != nil {
			return err
		}
		if err := pw.endStream(); err != nil {
			return err
		}
	} else {
		m, err := gzipMember(trailer)
		if err != nil {
			return err
		}
		if _, err := pw.out.Write(m); err != nil {
			return err
		}
	}
	if pw.in > pw.maxExpanded || pw.out.n > pw.maxFile {
		return fmt.Errorf("patch file of %d bytes (%d uncompressed) is over the store's limits (%d, %d)", pw.out.n, pw.in, pw.maxFile, pw.maxExpanded)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Limits bound what a store's files may hold. Everything on the remote is
// untrusted: another app version, a broken sync tool or an attacker with
// access to the folder may have written it, so every reader checks these
// bounds before it trusts a byte.
//
// Whether a file is readable must not depend on which device reads it: a
// file one device applies and another rejects would split them. So the
// limits belong to the store, not to a device. They are recorded in the
// store's marker when the store is created (from Config.Limits of the
// device that creates it) and every device reads and writes under the
// marker's limits, whatever its own Config says. A zero field means its
// default.
type Limits struct {
	// MaxFileSize bounds the compressed size of a patch file
	// (DefaultMaxFileSize), MaxExpandedSize its uncompressed size
	// (DefaultMaxExpandedSize).
	MaxFileSize, MaxExpandedSize int64
	// MaxRecordSize bounds one write of a patch file, one record entry
	// of a snapshot, and twice it the entry's clock
	// (DefaultMaxRecordSize). A change larger than it goes out as
	// several writes of its members; a single value over it is not sent
	// (Report.Skipped) and stays pending. A record that merged past it
	// goes into snapshots as several entries of its members.
	MaxRecordSize int64
	// MaxSnapshotSize bounds a snapshot or merge file, compressed and
	// uncompressed (DefaultMaxSnapshotSize).
	MaxSnapshotSize int64
	// MaxHeldFiles bounds the file names a snapshot's header lists
	// (DefaultMaxHeldFiles). A writer with more lists the oldest: the
	// files it leaves out are not compacted, and new devices download
	// them as well, which costs bytes but loses nothing.
	MaxHeldFiles int64
}

// Default limits of a new store.
const (
	DefaultMaxFileSize     = 64 << 20  // compressed bytes of one patch file
	DefaultMaxExpandedSize = 256 << 20 // uncompressed bytes of one patch file
	DefaultMaxRecordSize   = 4 << 20   // bytes of one write, or one record of a snapshot
	DefaultMaxSnapshotSize = 16 << 30  // bytes of one snapshot or merge file
	DefaultMaxHeldFiles    = 1 << 20   // file names in one snapshot header
)

// withDefaults returns l with every unset field at its default.
func (l Limits) withDefaults() Limits {
	for _, f := range []struct {
		v   *int64
		def int64
	}{
		{&l.MaxFileSize, DefaultMaxFileSize},
		{&l.MaxExpandedSize, DefaultMaxExpandedSize},
		{&l.MaxRecordSize, DefaultMaxRecordSize},
		{&l.MaxSnapshotSize, DefaultMaxSnapshotSize},
		{&l.MaxHeldFiles, DefaultMaxHeldFiles},
	} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	return l
}

// check reports a limit outside the bounds every device accepts.
func (l Limits) check() error {
	for _, b := range []struct {
		name      string
		v, lo, hi int64
	}{
		{"MaxFileSize", l.MaxFileSize, 1 << 10, 1 << 40},
		{"MaxExpandedSize", l.MaxExpandedSize, 1 << 10, 1 << 40},
		{"MaxRecordSize", l.MaxRecordSize, 1 << 10, 1 << 30},
		{"MaxSnapshotSize", l.MaxSnapshotSize, 1 << 10, 1 << 44},
		{"MaxHeldFiles", l.MaxHeldFiles, 1 << 10, 1 << 30},
	} {
		if b.v < b.lo || b.v > b.hi {
			return fmt.Errorf("limit %s = %d is outside %d-%d", b.name, b.v, b.lo, b.hi)
		}
	}
	return nil
}

// key names the limits and formats that decide whether a file is
// readable: a file rejected under another key is read again.
func (l Limits) key() string {
	return fmt.Sprintf("patch format %d, state format %d, limits %d/%d/%d/%d/%d",
		patchFormat, stateFormat, l.MaxFileSize, l.MaxExpandedSize, l.MaxRecordSize, l.MaxSnapshotSize, l.MaxHeldFiles)
}

var errTooLarge = merge.ErrTooLarge

// limitedReader fails once more than n bytes have been read, instead of
// pretending the input ended as io.LimitReader does.
type limitedReader struct {
	r    io.Reader
	n    int64
	what string
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		var one [1]byte
		if k, _ := l.r.Read(one[:]); k > 0 {
			return 0, fmt.Errorf("%w: %s exceeds its limit", errTooLarge, l.what)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	k, err := l.r.Read(p)
	l.n -= int64(k)
	return k, err
}

// boundFor is how far the decoder may read for one value of a file whose
// records may take maxRecord bytes: twice that (JSON escapes) and some
// room for the members around it. An unbounded maxRecord (math.MaxInt64,
// for the device's own files) stays unbounded instead of overflowing.
func boundFor(maxRecord int64) int64 {
	return addCapped(addCapped(maxRecord, maxRecord), 64<<10)
}

// addCapped is a+b for non-negative a and b, or math.MaxInt64 where that
// overflows.
func addCapped(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// fileChange is a validated change, as the spool holds it.
type fileChange struct {
	table, record string
	patch         []byte // canonical merge patch (nulls kept), "{}" for deletes; a state file's record_data
	clock         []byte // nil for a patch; a state file's record clock (then version and device are its root stamp)
	device        string // the writer of a patch; a state record's root stamp device
	deleted       bool
	version       int64
	flags         uint8 // changeHard, changeReplaces; own plan only: planNoop, planRowCanonical, planNoState
	// reset, for a replacing write of format 3: the newest write or delete
	// of the record its writer had seen (zero: the version before its own).
	reset merge.Stamp
	// base, own plan only: what the app's row held when the plan read it
	// (nil: no row), the base of the app's writes during the sync.
	base []byte
	// seen, for a write: its "seen" list (nil: unknown; see conflicts.go).
	seen []byte
	// oldest, for a state file's record: the lowest version its clock
	// holds (see arrivals).
	oldest int64
	// parsed is what writing an ordinary row takes from patch, when a
	// spool replay worked it out ahead (see Engine.parseAhead); nil
	// otherwise. Never spooled.
	parsed *parsedRow
}

const (
	changeHard     = 1 << 3 // a delete of format 1, which ended every older write (see applyChange)
	changeReplaces = 1 << 4 // a patch that replaces the record (fileEntry.Replaces)
)

const (
	planNoop         = 1 << 0 // pending record whose content did not change
	planRowCanonical = 1 << 1 // the app's row already holds the canonical content
	planNoState      = 1 << 2 // sync_states had no row for the record
)

// decodePatchFile reads a whole patch file from r (gzip), validates every
// change, hands each to emit, and returns the file's number (0: none).
// The file's device must be wantDevice (the one its name claims).
// Nothing is emitted for a file that fails after emit was called: callers
// spool the changes and discard the spool on error, so a malformed file is
// never half-applied.
func decodePatchFile(r io.Reader, wantDevice string, maxExpanded, maxRecord int64, emit func(fileChange) error) (seq int64, err error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return 0, fmt.Errorf("not gzip: %w", err)
	}
	defer gz.Close()
	s := newJSONStream(&limitedReader{r: gz, n: maxExpanded, what: "uncompressed content"})
	// The reader holds a whole value: bound each change (and each
	// unknown member) to what a record may take, so that one huge change
	// cannot make it hold the whole file.
	valueBound := boundFor(maxRecord)
	if err := s.token('{'); err != nil {
		return 0, err
	}
	var format int64
	var device string
	sawChanges := false
	seen := map[string]bool{}
	for n := 0; ; n++ {
		key, ok, err := s.member(n)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		if seen[key] {
			// Readers disagree on repeated members (first or last
			// wins?): an untrusted file must not be read two ways.
			return 0, fmt.Errorf("member %q appears twice", key)
		}
		seen[key] = true
		switch key {
		case "format":
			var n json.Number
			if err := s.decode(&n); err != nil {
				return 0, fmt.Errorf("format: %w", err)
			}
			if format, err = n.Int64(); err != nil || format < 1 {
				return 0, fmt.Errorf("format %q is not a positive integer", n)
			}
			if format > patchFormat {
				return 0, fmt.Errorf("%w: format %d; this app reads up to %d", ErrUnsupportedFormat, format, patchFormat)
			}
		case "device":
			if err := s.decode(&device); err != nil {
				return 0, fmt.Errorf("device: %w", err)
			}
			if device != wantDevice {
				return 0, fmt.Errorf("file says device %q but its name says %q", device, wantDevice)
			}
		case "seq":
			s.setLimit(valueBound)
			if seq, err = decodeSeq(s); err != nil {
				return 0, err
			}
		case "changes":
			if format == 0 || device == "" {
				return 0, errors.New(`"format" and "device" must come before "changes"`)
			}
			err := s.elements(valueBound, "change", func(i int, raw []byte) error {
				var e fileEntry
				if err := decodeFileEntry(raw, &e); err != nil {
					return fmt.Errorf("change %d: %w", i, err)
				}
				c, err := validateEntry(e, format, maxRecord)
				if err != nil {
					return fmt.Errorf("change %d: %w", i, err)
				}
				c.device = device
				return emit(c)
			})
			if err != nil {
				return 0, err
			}
			sawChanges = true
		default: // a member of a later format
			s.setLimit(valueBound)
			if err := s.skip(); err != nil {
				return 0, err
			}
		}
	}
	if !sawChanges {
		return 0, errors.New(`no "changes"`)
	}
	return seq, s.atEnd()
}

// decodeSeq reads a file's number. A value that is not a positive
// integer, or is past maxFileSeq, is no number (0): an engine that does not know the member
// skips it, and whether a file is readable must not depend on the
// version that reads it.
func decodeSeq(s *jsonStream) (int64, error) {
	var raw json.RawMessage
	if err := s.decode(&raw); err != nil {
		return 0, fmt.Errorf("seq: %w", err)
	}
	seq, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || seq < 1 || seq > maxFileSeq {
		return 0, nil
	}
	return seq, nil
}

func validateEntry(e fileEntry, format, maxRecord int64) (fileChange, error) {
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
	patch, err := canonicalObject(e.Patch, e.canonical, jsonv.Options{KeepNulls: true})
	if err != nil {
		return fileChange{}, fmt.Errorf("patch of %s/%s: %w", e.Table, e.Record, err)
	}
	c.patch = patch
	if len(e.Seen) > 0 && len(e.Seen) <= maxSeen {
		c.seen = e.Seen // read when applied; one that cannot be read logs nothing
	}
	return c, nil
}

// canonicalObject returns the canonical encoding of the JSON object data:
// data itself where it is spelled canonically already (known says it was
// checked to be), as the files the engine writes are, else the encoding
// of its parsed tree.
func canonicalObject(data []byte, known bool, opt jsonv.Options) ([]byte, error) {
	if len(data) > 0 && data[0] == '{' && (known || jsonv.Canonical(data, opt)) {
		return data, nil
	}
	v, err := jsonv.ParseObject(data, opt)
	if err != nil {
		return nil, err
	}
	return jsonv.Encode(v), nil
}

// A spool is a local temporary file of validated changes, written once
// and read back inside the sync transaction. Spooling keeps memory flat
// however many changes a sync moves, and lets a file be validated whole
// before any of it is applied.
type spool struct {
	f       *os.File
	w       *bufio.Writer
	n       int
	deletes int // changes that delete their record, or state records deleted
	buf     []byte
}

func newSpool(dir string) (*spool, error) {
	f, err := os.CreateTemp(dir, "drivesync-spool-*")
	if err != nil {
		return nil, fmt.Errorf("drivesync: create spool file: %w", err)
	}
	return &spool{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

func (s *spool) add(c fileChange) error {
	b := s.buf[:0]
	b = binary.AppendUvarint(b, uint64(len(c.table)))
	b = append(b, c.table...)
	b = binary.AppendUvarint(b, uint64(len(c.record)))
	b = append(b, c.record...)
	var flags uint8 = c.flags << 1
	if c.deleted {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(c.version))
	b = binary.AppendUvarint(b, uint64(len(c.patch)))
	b = append(b, c.patch...)
	b = binary.AppendUvarint(b, uint64(len(c.device)))
	b = append(b, c.device...)
	b = binary.AppendUvarint(b, uint64(c.reset.Version))
	b = binary.AppendUvarint(b, uint64(len(c.reset.Device)))
	b = append(b, c.reset.Device...)
	for _, opt := range [][]byte{c.clock, c.base, c.seen} {
		if opt == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(opt))+1)
		b = append(b, opt...)
	}
	b = binary.AppendUvarint(b, uint64(c.oldest))
	s.buf = b
	s.n++
	if c.deleted {
		s.deletes++
	}
	_, err := s.w.Write(b)
	return err
}

// each replays the spooled changes in order, on the caller's goroutine.
// They are read from the file a batch ahead of fn, on a goroutine of
// their own (see readAhead), and the first error of either ends the
// replay.
func (s *spool) each(fn func(fileChange) error) error { return s.eachWith(nil, fn) }

// eachWith is each, calling prepare, if not nil, with every change on
// the reading goroutine, before fn sees it.
func (s *spool) eachWith(prepare func(*fileChange), fn func(fileChange) error) error {
	if err := s.w.Flush(); err != nil {
		return err
	}
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	defer s.f.Seek(0, io.SeekEnd)
	r := &spoolReader{r: bufio.NewReaderSize(s.f, 64<<10)}
	return readAhead(func(send func(fileChange, int) bool) error {
		for range s.n {
			c, err := r.change()
			if err != nil {
				return fmt.Errorf("drivesync: read spool: %w", err)
			}
			if prepare != nil {
				prepare(&c)
			}
			size := len(c.table) + len(c.record) + len(c.patch) + len(c.device) + len(c.reset.Device) + len(c.clock) + len(c.base) + len(c.seen)
			if c.parsed != nil {
				size += 4 * len(c.patch) // about what the parsed record and its values hold
			}
			if !send(c, size) {
				return nil
			}
		}
		return nil
	}, func(c *fileChange) error { return fn(*c) })
}

// A spoolReader reads back the changes spool.add wrote.
type spoolReader struct {
	r       *bufio.Reader
	scratch []byte
}

// change reads the next change. It gets bytes of its own (a replay's fn
// may keep them); a string is read through scratch and copied once.
func (s *spoolReader) change() (c fileChange, err error) {
	if c.table, err = s.str(); err != nil {
		return c, err
	}
	if c.record, err = s.str(); err != nil {
		return c, err
	}
	flags, err := s.r.ReadByte()
	if err != nil {
		return c, err
	}
	c.deleted, c.flags = flags&1 != 0, flags>>1
	v, err := binary.ReadUvarint(s.r)
	if err != nil {
		return c, err
	}
	c.version = int64(v)
	if c.patch, err = s.bytes(0); err != nil {
		return c, err
	}
	if c.device, err = s.str(); err != nil {
		return c, err
	}
	if v, err = binary.ReadUvarint(s.r); err != nil {
		return c, err
	}
	c.reset.Version = int64(v)
	if c.reset.Device, err = s.str(); err != nil {
		return c, err
	}
	for _, opt := range []*[]byte{&c.clock, &c.base, &c.seen} {
		if *opt, err = s.bytes(1); err != nil {
			return c, err
		}
	}
	if v, err = binary.ReadUvarint(s.r); err != nil {
		return c, err
	}
	c.oldest = int64(v)
	return c, nil
}

// bytes reads a length and that many bytes; the length is off by shift
// (1: an optional field, whose length 0 means nil).
func (s *spoolReader) bytes(shift uint64) ([]byte, error) {
	n, err := binary.ReadUvarint(s.r)
	if err != nil || n < shift {
		return nil, err
	}
	b := make([]byte, n-shift)
	_, err = io.ReadFull(s.r, b)
	return b, err
}

func (s *spoolReader) str() (string, error) {
	n, err := binary.ReadUvarint(s.r)
	if err != nil {
		return "", err
	}
	s.scratch = slices.Grow(s.scratch[:0], int(n))[:n]
	_, err = io.ReadFull(s.r, s.scratch)
	return string(s.scratch), err
}

func (s *spool) close() {
	s.f.Close()
	os.Remove(s.f.Name())
}
