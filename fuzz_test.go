package drivesync

import (
	"bytes"
	"compress/gzip"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/merge"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// FuzzDecodePatchFile feeds arbitrary bytes, raw and gzipped, to the
// patch-file reader: it must return an error or valid changes, never
// panic, and every change it accepts must be well-formed.
func FuzzDecodePatchFile(f *testing.F) {
	f.Add([]byte(`{"format":1,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{"a":1},"is_deleted":false,"sync_version":3}]}`))
	f.Add([]byte(`{"format":1,"device":"d","changes":[{"table_name":"notes","record_id":"r","patch":{},"is_deleted":true,"sync_version":1}]}`))
	f.Add([]byte(`{"format":2,"device":"d","changes":[]}`))
	f.Add([]byte(`{"device":"d","format":1,"x":[1,{"y":null}],"changes":[]}`))
	f.Add([]byte(`{"format":1,"device":"d","changes":[{"table_name":"a; DROP","record_id":"r","patch":[],"sync_version":"1"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var gz bytes.Buffer
		w := gzip.NewWriter(&gz)
		w.Write(data)
		w.Close()
		for _, in := range [][]byte{data, gz.Bytes()} {
			decodePatchFile(bytes.NewReader(in), "d", 1<<20, 1<<16, func(c fileChange) error {
				if merge.CheckTableName(c.table) != nil || c.record == "" || c.version < 1 || c.version > merge.MaxVersion {
					t.Fatalf("accepted a bad change %+v", c)
				}
				if _, err := jsonv.ParseObject(c.patch, jsonv.Options{KeepNulls: true}); err != nil {
					t.Fatalf("accepted a patch that is not canonical JSON: %q", c.patch)
				}
				return nil
			})
		}
	})
}

// FuzzParsePatchName checks that names parse back to what was encoded
// and that anything else is refused rather than misread.
func FuzzParsePatchName(f *testing.F) {
	f.Add("2026/11/22/patch_20261122T101500.123Z_dev-a.json.gz", int64(1763806500123), "dev-a")
	f.Add("patch_x_y.json.gz", int64(0), "")
	f.Fuzz(func(t *testing.T, name string, ms int64, device string) {
		if at, dev, ok := parsePatchName(name); ok {
			if merge.CheckDeviceID(dev) != nil {
				t.Fatalf("%q: accepted device %q", name, dev)
			}
			if back := patchFileName(at, dev); name != back {
				t.Fatalf("%q parsed as (%v, %q), which names %q", name, at, dev, back)
			}
		}
		if merge.CheckDeviceID(device) != nil || ms < 0 || ms > 253402300799999 {
			return
		}
		at := time.UnixMilli(ms).UTC()
		name = patchFileName(at, device)
		got, dev, ok := parsePatchName(name)
		if !ok || !got.Equal(at) || dev != device || checkRemoteName(name) != nil {
			t.Fatalf("%q: parsed (%v, %q, %v), want (%v, %q)", name, got, dev, ok, at, device)
		}
	})
}

// FuzzDiffApply: for any two JSON objects a and b, applying diff(a, b) to
// a gives b in canonical form, both with the engine's merge and with the
// reference RFC 7396 implementation, numbers exact.
func FuzzDiffApply(f *testing.F) {
	f.Add(`{"a":1,"b":{"c":2}}`, `{"b":{"d":9007199254740993},"e":[1,null]}`)
	f.Add(`{"a":{"x":1}}`, `{"a":5}`)
	f.Add(`{"a":5}`, `{"a":{}}`)
	f.Add(`{}`, `{"n":0.1000000000000000055511151231257827}`)
	f.Fuzz(func(t *testing.T, as, bs string) {
		a, err1 := jsonv.ParseObject([]byte(as), jsonv.Options{})
		b, err2 := jsonv.ParseObject([]byte(bs), jsonv.Options{})
		if err1 != nil || err2 != nil {
			return
		}
		want := string(jsonv.Encode(b))
		p := merge.Diff(a, b)
		n := merge.NewRecordState(a, merge.Stamp{Version: 1, Device: "x"})
		n.ApplyPatch(p, merge.Stamp{Version: 2, Device: "y"})
		if got := string(jsonv.Encode(n.Value())); got != want {
			t.Fatalf("merge: apply(%s, %s) = %s, want %s", jsonv.Encode(a), jsonv.Encode(p), got, want)
		}
		// The reference library drops null members of objects inside
		// arrays, where RFC 7396 takes an array value as it is; compare
		// with it only where that cannot matter.
		if !bytes.Contains(jsonv.Encode(p), []byte("null")) || !bytes.Contains(jsonv.Encode(p), []byte("[")) {
			out, err := jsonpatch.MergePatch(jsonv.Encode(a), jsonv.Encode(p))
			if err != nil {
				t.Fatalf("MergePatch: %v", err)
			}
			ref, err := jsonv.ParseObject(out, jsonv.Options{})
			if err != nil || string(jsonv.Encode(ref)) != want {
				t.Fatalf("RFC 7396: apply(%s, %s) = %s, want %s", jsonv.Encode(a), jsonv.Encode(p), out, want)
			}
		}
		// The stored form round-trips.
		back, err := merge.DecodeState(n.Value(), merge.EncodeClock(n), false)
		if err != nil || string(merge.EncodeClock(back)) != string(merge.EncodeClock(n)) {
			t.Fatalf("clock round trip of %s: %v", merge.EncodeClock(n), err)
		}
	})
}
