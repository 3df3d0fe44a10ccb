package drivesync

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"strings"
	"testing"
	"testing/iotest"
)

// Findings of a second review of the stream reader: files that both
// readers refuse, but where the first version of the new one stopped
// reading at another place than json.Decoder did, so that the fetcher
// classed the failure otherwise: a network error (the sync fails and is
// tried again) instead of a rejection, or "too large" instead of
// "corrupt". Each test failed first. One such difference is left: inside
// a value, json.Decoder stopped at the first byte that is not JSON, and
// this reader reads to the value's end before the value is checked.

// netFail serves r's first n bytes, then fails every read with err, as a
// connection that drops does.
type netFail struct {
	r   io.Reader
	n   int
	err error
}

func (f *netFail) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	k, err := f.r.Read(p)
	f.n -= k
	return k, err
}

var errNet = errors.New("connection reset by peer")

// outcome is what fetchFile / fetchStateFile make of a read: the file
// read, a remote failure (the sync fails and retries), or a rejection
// and its class.
func outcome(err error, src *countingReader) string {
	switch {
	case err == nil:
		return "read"
	case src.failed != nil:
		return "remote error (sync fails, retried)"
	case errors.Is(err, ErrUnsupportedFormat):
		return "rejected: unsupported format"
	case errors.Is(classifyFileErr(err), ErrFileTooLarge):
		return "rejected: ErrFileTooLarge"
	}
	return "rejected: ErrCorruptFile"
}

// fetchBothPatch reads the gzip stream in, cut by a network failure after
// failAt compressed bytes (never if failAt < 0), as the fetcher does, with
// the current and the earlier patch-file readers.
func fetchBothPatch(in []byte, failAt int, l Limits) (got, want string, gerr, werr error) {
	src := func() *countingReader {
		var r io.Reader = bytes.NewReader(in)
		if failAt >= 0 {
			r = &netFail{r: r, n: failAt, err: errNet}
		}
		return &countingReader{r: &limitedReader{r: r, n: l.MaxFileSize, what: "compressed file"}}
	}
	nop := func(fileChange) error { return nil }
	gs, ws := src(), src()
	_, gerr = decodePatchFile(gs, "d", l.MaxExpandedSize, l.MaxRecordSize, nop)
	werr = refDecodePatchFile(ws, "d", l.MaxExpandedSize, l.MaxRecordSize, nop)
	return outcome(gerr, gs), outcome(werr, ws), gerr, werr
}

// fetchBothState is fetchBothPatch for a state file.
func fetchBothState(in []byte, failAt int, l Limits) (got, want string, gerr, werr error) {
	src := func() *countingReader {
		var r io.Reader = bytes.NewReader(in)
		if failAt >= 0 {
			r = &netFail{r: r, n: failAt, err: errNet}
		}
		return &countingReader{r: &limitedReader{r: r, n: l.MaxSnapshotSize, what: "compressed file"}}
	}
	nop := func(fileChange) error { return nil }
	gs, ws := src(), src()
	_, gerr = decodeStateFile(gs, "d", l, nop)
	_, werr = refDecodeStateFile(ws, "d", l, nop)
	return outcome(gerr, gs), outcome(werr, ws), gerr, werr
}

// randomText is n random letters: it does not compress much, so that
// the compressed stream has room for a failure well after a point.
func randomText(n int) string {
	rng := rand.New(rand.NewSource(1))
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rng.Intn(26))
	}
	return string(b)
}

// A string after the file's closing brace: the earlier reader decoded it
// as a value (json.Decoder.Token), reading on to its end, the new one stops at
// its quote. With the connection dropping inside that string, the
// earlier reader reports the network error (the fetcher fails the sync
// and reads the file again), the new one rejects the file as corrupt.
func TestDecodeTrailingStringCutLikeBefore(t *testing.T) {
	l := Limits{}.withDefaults()
	for _, head := range []string{
		`{"format":2,"device":"d","changes":[]}`,
		`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`,
	} {
		data := []byte(head + ` "` + randomText(400<<10) + `"`)
		in := gzipBytes(data)
		got, want, gerr, werr := fetchBothPatch(in, len(in)/2, l)
		if got != want {
			t.Errorf("patch %.60q + trailing string, connection lost at %d of %d compressed bytes:\n  now:    %s (%v)\n  before: %s (%v)", head, len(in)/2, len(in), got, gerr, want, werr)
		}
	}
	state := `{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[]}`
	data := []byte(state + ` "` + randomText(400<<10) + `"`)
	in := gzipBytes(data)
	if got, want, gerr, werr := fetchBothState(in, len(in)/2, l); got != want {
		t.Errorf("state file + trailing string, connection lost mid-string:\n  now:    %s (%v)\n  before: %s (%v)", got, gerr, want, werr)
	}
}

// The same trailing string, longer than the content limit: the earlier
// reader refused the file as too large, the new one as corrupt.
func TestDecodeTrailingStringTooLargeLikeBefore(t *testing.T) {
	l := Limits{}.withDefaults()
	head := `{"format":2,"device":"d","changes":[]}`
	data := []byte(head + ` "` + strings.Repeat("a", 8<<10))
	l.MaxExpandedSize = 4 << 10
	got, want, gerr, werr := fetchBothPatch(gzipBytes(data), -1, l)
	if got != want {
		t.Errorf("trailing string past MaxExpandedSize:\n  now:    %s (%v)\n  before: %s (%v)", got, gerr, want, werr)
	}
}

// A file that is a string, not an object; and a "changes" that is a
// string: json.Decoder.Token decoded the whole string before the
// earlier reader found it was no delimiter.
func TestDecodeStringForDelimiterCutLikeBefore(t *testing.T) {
	l := Limits{}.withDefaults()
	long := randomText(400 << 10)
	for _, data := range []string{
		`"` + long + `"`,
		`{"format":2,"device":"d","changes":"` + long + `"}`,
	} {
		in := gzipBytes([]byte(data))
		got, want, gerr, werr := fetchBothPatch(in, len(in)/2, l)
		if got != want {
			t.Errorf("%.50q..., connection lost mid-string:\n  now:    %s (%v)\n  before: %s (%v)", data, got, gerr, want, werr)
		}
	}
}

// zeroEvery returns (0, nil) before every read it passes on.
type zeroEvery struct {
	r    io.Reader
	flip bool
}

func (z *zeroEvery) Read(p []byte) (int, error) {
	if z.flip = !z.flip; z.flip {
		return 0, nil
	}
	return z.r.Read(p)
}

// onceErr fails one read (the k-th), then goes on: an error that is not
// sticky.
type onceErr struct {
	r io.Reader
	k int
}

func (o *onceErr) Read(p []byte) (int, error) {
	if o.k--; o.k == 0 {
		return 0, errNet
	}
	return o.r.Read(p)
}

// dataErr returns its last bytes with errNet rather than nil or EOF.
type dataErr struct {
	r   io.Reader
	n   int
	err error
}

func (d *dataErr) Read(p []byte) (int, error) {
	if d.n <= 0 {
		return 0, d.err
	}
	if len(p) > d.n {
		p = p[:d.n]
	}
	k, _ := d.r.Read(p)
	d.n -= k
	if d.n <= 0 {
		return k, d.err
	}
	return k, nil
}

func readerFor(in []byte, mode uint8, at int) io.Reader {
	var r io.Reader = bytes.NewReader(in)
	switch mode % 9 {
	case 1:
		r = iotest.OneByteReader(r)
	case 2:
		r = iotest.HalfReader(r)
	case 3:
		r = iotest.DataErrReader(r)
	case 4:
		r = iotest.TimeoutReader(r)
	case 5:
		r = &netFail{r: r, n: at % (len(in) + 1), err: errNet}
	case 6:
		r = &zeroEvery{r: r}
	case 7:
		r = &onceErr{r: iotest.HalfReader(r), k: at%8 + 1}
	case 8:
		r = &dataErr{r: r, n: at % (len(in) + 1), err: errNet}
	}
	return r
}

// FuzzDecodeReadersLikeBefore reads every input through readers that cut, fail,
// return nothing or return data with an error, with the current readers
// and the earlier ones, as the fetcher does, and compares whether the
// file is read, whether it is of a newer format, and what it holds.
func FuzzDecodeReadersLikeBefore(f *testing.F) {
	for _, s := range []string{
		`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[{"table_name":"notes","record_id":"r","state":{"a":1},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}]}`,
		`{"format":9,"device":"d","changes":[]}`, `{"format":2,"device":"d","changes":[]}  `, bigPatchContent(50),
	} {
		for m := range 9 {
			f.Add([]byte(s), uint8(m), uint16(len(s)/2), uint16(0))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, mode uint8, at uint16, expanded uint16) {
		l := Limits{MaxRecordSize: 1 << 10}.withDefaults()
		if expanded > 0 {
			l.MaxExpandedSize, l.MaxSnapshotSize = int64(expanded), int64(expanded)
		}
		in := gzipBytes(data)
		if mode&0x10 != 0 {
			in = in[:len(in)-int(mode>>5)] // cut trailer
		}
		var got, want []fileChange
		gs := &countingReader{r: readerFor(in, mode, int(at))}
		ws := &countingReader{r: readerFor(in, mode, int(at))}
		_, gerr := decodePatchFile(gs, "d", l.MaxExpandedSize, l.MaxRecordSize, collectChanges(&got))
		werr := refDecodePatchFile(ws, "d", l.MaxExpandedSize, l.MaxRecordSize, collectChanges(&want))
		sameResult(t, "patch file", data, gerr, werr, got, want)
		if gerr == nil && (gs.n != ws.n) {
			t.Fatalf("patch %q: read %d compressed bytes, before %d", data, gs.n, ws.n)
		}
		got, want = nil, nil
		gs = &countingReader{r: readerFor(in, mode, int(at))}
		ws = &countingReader{r: readerFor(in, mode, int(at))}
		_, gerr = decodeStateFile(gs, "d", l, collectChanges(&got))
		_, werr = refDecodeStateFile(ws, "d", l, collectChanges(&want))
		sameResult(t, "state file", data, gerr, werr, got, want)
	})
}

// The content limit falls one byte before the file's closing brace,
// after whitespace. limitedReader reads that byte and fails with
// errTooLarge, then finds the end of the stream (io.EOF): it is not
// sticky. json.Decoder.More dropped the first error, and Token read
// again and got io.EOF: before, the file was refused as corrupt (EOF);
// now as too large.
func TestDecodeLimitBeforeClosingLikeBefore(t *testing.T) {
	l := Limits{}.withDefaults()
	for _, data := range []string{
		`{"format":2,"device":"d","changes":[]   }`,
		`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3}   ]}`,
	} {
		m := l
		m.MaxExpandedSize = int64(strings.LastIndexAny(data, "}]"))
		got, want, gerr, werr := fetchBothPatch(gzipBytes([]byte(data)), -1, m)
		if got != want {
			t.Errorf("%q under a limit of %d:\n  now:    %s (%v)\n  before: %s (%v)", data, m.MaxExpandedSize, got, gerr, want, werr)
		}
	}
}
