package drivesync

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// decodeBoth reads data, gzipped, with the current patch- and state-file
// readers and with the earlier ones, and fails t where they disagree: on
// whether the file is read, on what it holds, or on whether it is of an
// unsupported format. With broken, it also reads the gzip stream cut
// before its trailer, with a wrong checksum and with bytes after it,
// each under l and under a limit of exactly data's length (where the
// earlier readers never read the trailer).
func decodeBoth(t *testing.T, data []byte, l Limits, broken bool) {
	t.Helper()
	in := gzipBytes(data)
	decodeBothGzip(t, data, in, l)
	if !broken {
		return
	}
	badCRC := slices.Clone(in)
	badCRC[len(badCRC)-8] ^= 0xff
	exact := l
	exact.MaxExpandedSize, exact.MaxSnapshotSize = max(int64(len(data)), 1), max(int64(len(data)), 1)
	for _, in := range [][]byte{in, in[:len(in)-4], badCRC, append(slices.Clone(in), "xy"...)} {
		decodeBothGzip(t, data, in, l)
		decodeBothGzip(t, data, in, exact)
	}
}

// collectChanges is a reader's emit that appends to out.
func collectChanges(out *[]fileChange) func(fileChange) error {
	return func(c fileChange) error { *out = append(*out, c); return nil }
}

// decodeBothGzip is decodeBoth on in, the gzip stream of data.
func decodeBothGzip(t *testing.T, data, in []byte, l Limits) {
	t.Helper()
	var got, want []fileChange
	_, gerr := decodePatchFile(bytes.NewReader(in), "d", l.MaxExpandedSize, l.MaxRecordSize, collectChanges(&got))
	werr := refDecodePatchFile(bytes.NewReader(in), "d", l.MaxExpandedSize, l.MaxRecordSize, collectChanges(&want))
	sameResult(t, "patch file", data, gerr, werr, got, want)

	got, want = nil, nil
	gh, gerr := decodeStateFile(bytes.NewReader(in), "d", l, collectChanges(&got))
	wh, werr := refDecodeStateFile(bytes.NewReader(in), "d", l, collectChanges(&want))
	sameResult(t, "state file", data, gerr, werr, got, want)
	if gerr == nil && !reflect.DeepEqual(gh, wh) {
		t.Fatalf("state file %.200q: header %+v, before %+v", data, gh, wh)
	}
}

func sameResult(t *testing.T, what string, data []byte, gerr, werr error, got, want []fileChange) {
	t.Helper()
	if (gerr == nil) != (werr == nil) || errors.Is(gerr, ErrUnsupportedFormat) != errors.Is(werr, ErrUnsupportedFormat) {
		t.Fatalf("%s %.300q (%d bytes): read with error %v, before with %v", what, data, len(data), gerr, werr)
	}
	// A state record's oldest version is worked out for the conflict log
	// (see arrivals); the earlier readers had none. TestFreshStateEntry
	// and TestClockStamps check it.
	for i := range got {
		got[i].oldest = 0
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s %.300q: read %+v, before %+v", what, data, got, want)
	}
}

// FuzzDecodeLikeBefore checks that the patch- and state-file readers
// accept and refuse what the readers of earlier versions did, and read
// the same changes, on any input and under any limit on its size.
func FuzzDecodeLikeBefore(f *testing.F) {
	for _, s := range []string{
		`{"format":2,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`,
		`{"format":3,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"b":null,"a":[1]},"is_deleted":false,"sync_version":3,"replaces":true,"reset":{"sync_version":2,"device":"e"}}]}`,
		`{"format":1,"device":"d","x":[1,{"y":null}],"changes":[],"later":"z"}`,
		`{"format":"2","device":"d","changes":[ ,]}`, `{"format":9,"device":"d","changes":[]}`, `{"format":1,"device":"d"}`,
		`{"format":1,"device":"d","changes":[]} x`, `{"format":1,"device":"d","changes":[]`, `{"format":1,"format":1}`,
		`{"device":"d","format":1,"changes":[{"table_name":"notes","record_id":"r","patch":{},"is_deleted":true,"sync_version":1}],}`,
		`{"format":1,"device":"\u0064","changes":[{"Table_Name":"notes","record_id":"r","patch":{"a":"\u00e9"},"sync_version":1}]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[{"table_name":"notes","record_id":"r","state":{"a":1},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","included":["2026/11/27/patch_20261127T000000.000Z_d.json.gz"],"knows":[],"records":[]}`,
	} {
		f.Add([]byte(s), uint16(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, expanded uint16) {
		l := Limits{MaxRecordSize: 1 << 16}.withDefaults()
		l.MaxExpandedSize, l.MaxSnapshotSize = 1<<20, 1<<20
		if expanded > 0 {
			l.MaxExpandedSize, l.MaxSnapshotSize = int64(expanded), int64(expanded)
		}
		decodeBoth(t, data, l, true)
	})
}

// TestDecodeBoundsLikeBefore pads files with whitespace so that a change,
// a record, an unknown member or the file's end falls on each side of
// the bound on what one value may take, and on the limit on the whole
// file, and checks that the readers decide as the earlier ones did.
func TestDecodeBoundsLikeBefore(t *testing.T) {
	l := Limits{MaxRecordSize: 1 << 10}.withDefaults()
	patchBound := int(boundFor(l.MaxRecordSize))
	stateBound := int(addCapped(boundFor(l.MaxRecordSize), 2*l.MaxRecordSize))
	change := `{"table_name":"notes","record_id":"r%d","patch":{"a":%d},"is_deleted":false,"sync_version":3}`
	record := `{"table_name":"notes","record_id":"r%d","state":{"a":%d},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}`
	// Each shape has a %s where the padding goes.
	shapes := []string{
		`{"format":2,"device":"d","changes":[%s` + change + `]}`,
		`{"format":2,"device":"d","changes":[` + change + `%s]}`,
		`{"format":2,"device":"d","changes":[` + change + `,%s` + change + `]}`,
		`{"format":2,"device":"d","changes":[` + change + `%s,` + change + `]}`,
		`{"format":2,"device":"d","changes":[` + change + `]}%s`,
		`{"format":2,"device":"d","changes":[` + change + `]%s}`,
		`{"format":2,"device":"d","x":%s1,"changes":[` + change + `]}`,
		`{"format":2,"device":"d","x":"y"%s,"changes":[` + change + `]}`,
		`{"format":2,"device":"d","x":[%s],"changes":[` + change + `]}`,
		`{"x":1,"format":%s2,"device":"d","changes":[]}`,
		`{"x":1,"format":2%s,"device":"d","changes":[]}`,
		`{"x":1,"format":9%s,"device":"d","changes":[]}`,
		`{"x":1,"format":%s9,"device":"d","changes":[]}`,
		`{"format":2,"device":"d","changes":[{"table_name":"notes",%s"record_id":"r1","patch":{},"sync_version":1}]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[%s` + record + `]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[` + record + `,` + record + `%s]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[` + record + `]}%s`,
		`{"format":1,"store":"s","device":"d","covers":%s"2026-11-27T00:00:00Z","records":[]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","later":1%s,"records":[]}`,
		`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","included":[%s],"records":[]}`,
	}
	cases := 0
	for _, shape := range shapes {
		filled := strings.Replace(shape, "%s", "%[1]s", 1)
		n := strings.Count(shape, "%d")
		args := func(pad string) []any {
			a := []any{pad}
			for i := range n {
				a = append(a, i)
			}
			return a
		}
		// %d verbs after the padding take their arguments in order.
		filled = strings.ReplaceAll(filled, "%d", "%d")
		base := len(fmt.Sprintf(strings.Replace(filled, "%[1]s", "", 1), args("")[1:]...))
		for _, bound := range []int{patchBound, stateBound} {
			// Every padding from a little more than the shape's own
			// length below the bound to a few bytes past it: the end of
			// each token meets the bound once.
			for pad := bound - base - 3; pad <= bound+3; pad++ {
				if pad < 0 || (pad > bound-base+3 && pad < bound-64) {
					continue
				}
				data := []byte(fmt.Sprintf(filled, args(strings.Repeat(" ", pad))...))
				decodeBoth(t, data, l, false)
				cases++
				if pad%16 == 0 {
					// And the whole file's limit on each side of its length.
					for e := -1; e <= 1; e++ {
						m := l
						m.MaxExpandedSize, m.MaxSnapshotSize = int64(len(data)+e), int64(len(data)+e)
						decodeBoth(t, data, m, false)
					}
				}
			}
		}
	}
	t.Logf("%d padded files", cases)
}

// TestDecodeEveryRefillLikeBefore moves one change (and one state
// record) across the end of the reader's first buffer, byte by byte, so
// that a read ends at every offset inside it: in each literal, number,
// string and escape. A reader that judged a value from what it had read
// so far refused a literal cut as "fal" (found by the benchmarks, whose
// files are large; the fuzzed files are too small to cross a buffer).
func TestDecodeEveryRefillLikeBefore(t *testing.T) {
	l := Limits{}.withDefaults()
	change := `{"table_name":"notes","record_id":"r\u00e9\n1","patch":{"a":-1.25e+3,"b":[true,false,null,0],"c":"x\"y\\z","d":{"e":null}},"is_deleted":false,"sync_version":12,"seen":[[["a"],3,"d"]]}`
	record := `{"table_name":"notes","record_id":"r","state":{"a":-0.5E-2,"b":[true,false,null],"c":"q\tr"},"clock":{"d":["d"],"n":[1,0,{}]},"is_deleted":false}`
	for pad := 0; pad <= 512+len(change); pad++ {
		ws := strings.Repeat(" ", pad)
		decodeBoth(t, []byte(`{"format":2,"device":"d","changes":[`+ws+change+`,`+change+`]}`), l, false)
		decodeBoth(t, []byte(`{"format":1,"store":"s","device":"d","covers":"2026-11-27T00:00:00Z","records":[`+ws+record+`]}`), l, false)
	}
}
