package drivesync

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Findings of a review of the stream reader that replaced json.Decoder
// (jsonstream.go). Each case is a file the earlier reader and the first
// version of the new one read differently, or read in quadratic time.

// A gzip stream whose trailer is cut, wrong or followed by junk, holding
// exactly the store's limit of content: the earlier reader took the read
// that ended the content, dropped its error, and found the end of the
// stream at the limit, so it read the file; a reader that kept the error
// refused it. Under a limit one byte higher both refuse it.
func TestDecodeBrokenGzipTailLikeBefore(t *testing.T) {
	l := Limits{MaxRecordSize: 1 << 16}.withDefaults()
	for _, content := range []string{
		`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[{"table_name":"notes","record_id":"r","state":{"a":1},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}]}`,
		`{"format":9`, // an unsupported format, whatever follows
		bigPatchContent(5000),
	} {
		for _, over := range []int64{0, 1} {
			m := l
			m.MaxExpandedSize, m.MaxSnapshotSize = int64(len(content))+over, int64(len(content))+over
			decodeBoth(t, []byte(content), m, true)
		}
	}
}

// bigPatchContent is the JSON of a patch file of n changes.
func bigPatchContent(n int) string {
	var b strings.Builder
	b.WriteString(`{"format":2,"device":"d","changes":[`)
	for i := range n {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, `{"table_name":"notes","record_id":"r%d","patch":{"a":%d,"b":"some text %d"},"is_deleted":false,"sync_version":%d}`, i, i, i*7919, i+1)
	}
	b.WriteString("\n]}\n")
	return b.String()
}

// Whitespace after the last token up to exactly the bound of the last
// value: the earlier reader got the last bytes with the end of the
// stream and never read again, so the bound did not refuse the file.
func TestDecodeTrailingSpaceAtBoundLikeBefore(t *testing.T) {
	small := Limits{MaxRecordSize: 1 << 10}.withDefaults()
	for _, base := range []string{
		`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r1","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`,
		`{"format":2,"device":"d","z":1,"changes":[]}`,
		`{"format":2,"device":"d","changes":[],"z":1}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[{"table_name":"notes","record_id":"r","state":{"a":1},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}]}`,
	} {
		// The bound of the last value starts before it, within base.
		bound := int(addCapped(boundFor(small.MaxRecordSize), 2*small.MaxRecordSize))
		if strings.Contains(base, `"changes"`) {
			bound = int(boundFor(small.MaxRecordSize))
		}
		for total := bound; total <= bound+len(base)+2; total++ {
			decodeBoth(t, []byte(base+strings.Repeat(" ", total-len(base))), small, false)
		}
	}
	// With the default limits, newlines to the last change's bound.
	l := Limits{}.withDefaults()
	base := `{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r1","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`
	total := strings.Index(base, `[{`) + 1 + int(boundFor(l.MaxRecordSize))
	decodeBoth(t, []byte(base+strings.Repeat("\n", total-len(base))), l, false)
}

// A file cut right after "format":9 where the 9 is the last byte its
// bound lets the reader read: the earlier reader found the end of the
// stream with it and refused the file as of a newer format, not as too
// large.
func TestDecodeFormatAtBoundLikeBefore(t *testing.T) {
	l := Limits{MaxRecordSize: 1 << 10}.withDefaults()
	patchBound := int(boundFor(l.MaxRecordSize))
	stateBound := int(addCapped(boundFor(l.MaxRecordSize), 2*l.MaxRecordSize))
	for _, c := range []struct {
		head  string // the bound starts after its first key
		key   int    // the end of that key
		bound int
	}{
		{`{"x":1,"format":`, len(`{"x"`), patchBound},
		{`{"x":1,"format":`, len(`{"x"`), stateBound},
		{`{"format":`, len(`{"format"`), stateBound},
	} {
		for pad := -3; pad <= 3; pad++ {
			n := c.key + c.bound - len(c.head) - 1 + pad
			decodeBoth(t, []byte(c.head+strings.Repeat(" ", n)+"9"), l, false)
		}
	}
}

// Nesting around the depths where readers stop: the canonical check's
// 200 and encoding/json's 10,000.
func TestDecodeDepthLikeBefore(t *testing.T) {
	l := Limits{MaxRecordSize: 1 << 16}.withDefaults()
	for _, d := range []int{199, 200, 201, 9998, 9999, 10000, 10001} {
		seen := strings.Repeat("[", d) + strings.Repeat("]", d)
		obj := strings.Repeat(`{"a":`, d) + "1" + strings.Repeat("}", d)
		for _, f := range []string{
			`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3,"seen":` + seen + `}]}`,
			`{"format":2,"device":"d","x":` + seen + `,"changes":[]}`,
			`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","x":` + seen + `,"records":[]}`,
			`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":` + obj + `,"is_deleted":false,"sync_version":3}]}`,
			`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[{"table_name":"notes","record_id":"r","state":` + obj + `,"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}]}`,
		} {
			decodeBoth(t, []byte(f), l, false)
		}
	}
}

// BenchmarkDecodeEscapes reads a change whose text holds n escaped
// newlines, for n and 16n: a reader that looks for a string's end from
// each escape again takes 16 times as long per byte for 16n (the first
// version of the stream reader took 20 s for a million, the earlier
// reader 34 ms). x-per-byte is the time per byte of 16n over that of n.
func BenchmarkDecodeEscapes(b *testing.B) {
	l := Limits{}.withDefaults()
	file := func(n int) []byte {
		return gzipBytes([]byte(`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":"` +
			strings.Repeat(`\n`, n) + `"},"is_deleted":false,"sync_version":3}]}`))
	}
	counts := []int{1 << 14, 1 << 18}
	files := [][]byte{file(counts[0]), file(counts[1])}
	var perEscape [2]float64
	for b.Loop() {
		for i, in := range files {
			start := time.Now()
			if _, err := decodePatchFile(bytes.NewReader(in), "d", l.MaxExpandedSize, l.MaxRecordSize, func(fileChange) error { return nil }); err != nil {
				b.Fatal(err)
			}
			perEscape[i] += float64(time.Since(start)) / float64(counts[i])
		}
	}
	b.ReportMetric(perEscape[1]/perEscape[0], "x-per-byte")
}
