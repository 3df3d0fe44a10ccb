package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Hostile remote input: every file below is rejected by name, nothing of
// it reaches the device, and a good file from another device listed in
// the same sync still applies.

const evilDev = "evil-device"

// evilName is where the hostile file goes: named before anything the
// devices upload, so it is downloaded first.
const evilName = "2026/01/01/patch_20260101T000000.000Z_" + evilDev + ".json.gz"

// goodChange edits a record b already holds: if a bad file were half
// applied, n1 would show it.
const goodChange = `{"table_name":"notes","record_id":"n1","patch":{"title":"HACKED"},"is_deleted":false,"sync_version":50}`

func evilFile(changes ...string) string {
	return `{"format":1,"device":"` + evilDev + `","changes":[` + strings.Join(changes, ",") + `]}`
}

func gzipBytes(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b) // a bytes.Buffer takes every write
	w.Close()
	return buf.Bytes()
}

// withoutRecord drops the dump lines of one record (its sync_states row
// and its notes row).
func withoutRecord(dump, id string) string {
	var out []string
	for line := range strings.SplitSeq(dump, "\n") {
		f := strings.Fields(line)
		if (len(f) > 0 && f[0] == id) || (len(f) > 1 && f[0] == "notes" && f[1] == id) {
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// expectRejected sets up devices a and b sharing a remote, lets a
// upload a good file, then puts raw (the exact bytes of a remote file) on
// the remote and syncs b once: the bad file must be rejected with one of
// want, naming the file; b's data and schema must be untouched except for
// the good file, which must apply in that same sync.
func expectRejected(t *testing.T, raw []byte, want ...error) *device {
	t.Helper()
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("n1", `{"title":"one","display_order":1}`)
	a.put("n2", `{"title":"two","tags":{"x":true}}`)
	syncAll(t, a, b)
	time.Sleep(time.Millisecond) // a second upload in a's first one's millisecond is lost: see TestConcurrentUploadsInOneMillisecond
	a.put("good", `{"v":2}`)
	good := a.sync().Uploaded
	if err := remote.Create(context.Background(), evilName, bytes.NewReader(raw)); err != nil {
		t.Fatal(err)
	}
	before, schema := b.dump(), schemaOf(t, b)
	r := b.sync()
	if len(r.Rejected) != 1 || r.Rejected[0].Name != evilName ||
		!slices.ContainsFunc(want, func(w error) bool { return errors.Is(r.Rejected[0].Err, w) }) {
		t.Fatalf("rejected %v, want %s with %v (downloaded %v)", r.Rejected, evilName, want, r.Downloaded)
	}
	if got := r.Rejected[0].Err.Error(); !strings.Contains(got, evilName) {
		t.Errorf("got error %q, want it to name %s", got, evilName)
	}
	if got, want := fmt.Sprint(r.Downloaded), fmt.Sprint([]string{good}); got != want {
		t.Fatalf("downloaded %s, want %s: a bad file stopped a good one", got, want)
	}
	if got, want := b.get("good"), `{"v":2}`; got != want {
		t.Errorf("good = %s, want %s", got, want)
	}
	if got, want := withoutRecord(b.dump(), "good"), withoutRecord(before, "good"); got != want {
		t.Errorf("local data changed by a rejected file:\n%s\nwant\n%s", got, want)
	}
	if got := schemaOf(t, b); got != schema {
		t.Errorf("schema changed by a rejected file:\n%s\nwant\n%s", got, schema)
	}
	var n int
	if err := b.db.QueryRow(`SELECT count(*) FROM notes WHERE id IN ('n1', 'n2')`).Scan(&n); err != nil || n != 2 {
		t.Errorf("got %d rows of notes (err %v), want the table with n1 and n2", n, err)
	}
	return b
}

func schemaOf(t *testing.T, d *device) string {
	t.Helper()
	var schema string
	err := d.db.QueryRow(`SELECT group_concat(type || ' ' || name || ' ' || ifnull(sql, ''), char(10))
		FROM (SELECT * FROM sqlite_master ORDER BY type, name)`).Scan(&schema)
	if err != nil {
		t.Fatal(err)
	}
	return schema
}

// heapSampler tracks the peak growth of heap objects until stopped.
func heapSampler(every time.Duration) (stop func() uint64) {
	var peak atomic.Uint64
	var wg sync.WaitGroup
	done := make(chan struct{})
	// The growth over what the heap held when sampling began: other
	// tests of the process may leave live objects behind.
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	base := s[0].Value.Uint64()
	wg.Go(func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(s)
			peak.Store(max(peak.Load(), s[0].Value.Uint64()-min(base, s[0].Value.Uint64())))
			select {
			case <-done:
				return
			case <-time.After(every):
			}
		}
	})
	return func() uint64 { close(done); wg.Wait(); return peak.Load() }
}

// bomb returns a gzip file that expands to prefix, then n MiB of fill,
// then suffix. One deflate stream of 1 GiB takes about 50 s to compress
// under -race, so the fill is n identical gzip members of 1 MiB each
// (compressed once): RFC 1952 allows concatenated members and
// gzip.Reader reads them as one stream, so the expansion is the same.
func bomb(prefix string, fill byte, n int, suffix string) []byte {
	member := gzipBytes(bytes.Repeat([]byte{fill}, 1<<20))
	var buf bytes.Buffer
	buf.Write(gzipBytes([]byte(prefix)))
	for range n {
		buf.Write(member)
	}
	buf.Write(gzipBytes([]byte(suffix)))
	return buf.Bytes()
}

// TestHostileGzipBomb: 1 GiB of expansion in about 1 MB of file is
// rejected while the heap stays under 64 MiB.
func TestHostileGzipBomb(t *testing.T) {
	const limit = 64 << 20
	tests := []struct {
		name           string
		prefix, suffix string
		fill           byte
		skip           string
	}{
		{"zero bytes", "", "", 0, ""},
		// The same bomb inside a JSON string, so that the decoder keeps
		// reading instead of failing on the first byte.
		{"json string", `{"format":1,"device":"` + evilDev + `","changes":[{"table_name":"notes","record_id":"n1","patch":{"title":"`,
			`"},"is_deleted":false,"sync_version":50}]}`, '0', ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.skip != "" {
				t.Skip(tt.skip)
			}
			raw := bomb(tt.prefix, tt.fill, 1024, tt.suffix)
			if len(raw) > 2<<20 {
				t.Fatalf("bomb has %d bytes, want about 1 MB", len(raw))
			}
			// The heap, garbage included, stays near what is live: the
			// bound is on what the engine holds, not on how late the
			// collector runs on a busy machine.
			defer debug.SetGCPercent(debug.SetGCPercent(20))
			runtime.GC()
			stop := heapSampler(2 * time.Millisecond)
			expectRejected(t, raw, ErrFileTooLarge, ErrCorruptFile)
			peak := stop()
			if peak >= limit {
				t.Errorf("peak heap %d MiB during the sync, want under %d MiB", peak>>20, limit>>20)
			}
			t.Logf("peak heap %.1f MiB", float64(peak)/(1<<20))
		})
	}
}

// TestHostileRecordSize: a change over Config.MaxRecordSize makes its
// file too large; one under it is applied and round-trips exactly.
func TestHostileRecordSize(t *testing.T) {
	t.Run("100 MB", func(t *testing.T) {
		raw := bomb(`{"format":1,"device":"`+evilDev+`","changes":[{"table_name":"notes","record_id":"n1","patch":{"title":"`,
			'x', 100, `"},"is_deleted":false,"sync_version":50}]}`)
		expectRejected(t, raw, ErrFileTooLarge)
	})
	t.Run("1 MB", func(t *testing.T) {
		remote := NewMemoryRemote()
		b := newDevice(t, "dev-b", remote)
		// Non-ASCII, escapes and a number beyond float64's precision.
		unit := `héllo "q" \ tab	 ✓ 𝄞 `
		want := strings.Repeat(unit, (1<<20)/len(unit)+1)
		patch, err := json.Marshal(map[string]any{"big": want, "n": json.Number("12345678901234567890123")})
		if err != nil {
			t.Fatal(err)
		}
		change := `{"table_name":"notes","record_id":"big","patch":` + string(patch) + `,"is_deleted":false,"sync_version":50}`
		writeRaw(t, remote, evilName, true, evilFile(change))
		r := b.sync()
		if len(r.Rejected) != 0 || r.ChangesReceived != 1 {
			t.Fatalf("got rejected %v, received %d; want the change applied", r.Rejected, r.ChangesReceived)
		}
		// Compared in SQL: the JSON text of the string may be escaped
		// differently, its value may not.
		for _, q := range []string{
			`SELECT content ->> '$.big' = ?1, length(content ->> '$.big'), content -> '$.n' FROM notes WHERE id = 'big'`,
			`SELECT record_data ->> '$.big' = ?1, length(record_data ->> '$.big'), record_data -> '$.n' FROM sync_states WHERE record_id = 'big'`,
		} {
			var same bool
			var n int
			var num string
			if err := b.db.QueryRow(q, want).Scan(&same, &n, &num); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			if !same || num != "12345678901234567890123" {
				t.Errorf("%s: got a string of %d characters (equal: %t) and n=%s, want the string sent and n=12345678901234567890123", q, n, same, num)
			}
		}
	})
}

// TestHostileMalformedFiles: files that are not the expected JSON.
func TestHostileMalformedFiles(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	header := `{"format":1,"device":"` + evilDev + `",`
	tests := []struct {
		name string
		raw  []byte // used as is when set
		body string // gzipped otherwise
		want error
		skip string
	}{
		{name: "patch nested 10000 deep", body: evilFile(goodChange, `{"table_name":"notes","record_id":"n2","patch":`+deep+`,"is_deleted":false,"sync_version":51}`)},
		{name: "patch nested 1000 deep", body: evilFile(goodChange, `{"table_name":"notes","record_id":"n2","patch":`+strings.Repeat(`{"a":`, 1000)+"1"+strings.Repeat("}", 1000)+`,"is_deleted":false,"sync_version":51}`)},
		{name: "unknown header field nested 100000 deep", body: header + `"later":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `,"changes":[` + goodChange + `]}`},
		{name: "array instead of object", body: "[" + evilFile(goodChange) + "]"},
		{name: "changes not an array", body: header + `"changes":{"0":` + goodChange + `}}`},
		{name: "changes missing", body: header + `"changed":[` + goodChange + `]}`},
		{name: "device missing", body: `{"format":1,"changes":[` + goodChange + `]}`},
		{name: "table_name a number", body: evilFile(goodChange, `{"table_name":5,"record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51}`)},
		{name: "record_id null", body: evilFile(goodChange, `{"table_name":"notes","record_id":null,"patch":{"a":1},"is_deleted":false,"sync_version":51}`)},
		{name: "is_deleted a string", body: evilFile(goodChange, `{"table_name":"notes","record_id":"n2","patch":{},"is_deleted":"true","sync_version":51}`)},
		{name: "duplicate device key", body: `{"format":1,"device":"` + evilDev + `","device":"dev-a","changes":[` + goodChange + `]}`},
		{name: "duplicate changes key", body: header + `"changes":[` + goodChange + `],"changes":[]}`},
		{name: "trailing garbage in the JSON", body: evilFile(goodChange) + " garbage"},
		{name: "second JSON object", body: evilFile(goodChange) + evilFile(goodChange)},
		{name: "trailing garbage after the gzip stream", raw: append(gzipBytes([]byte(evilFile(goodChange))), "garbage"...)},
		{name: "truncated gzip stream", raw: func() []byte { g := gzipBytes([]byte(evilFile(goodChange))); return g[:len(g)-6] }()},
		{name: "empty file", raw: []byte{}},
		{name: "gzip of nothing", body: ""},
		{name: "reset in format 2", body: `{"format":2,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51,"replaces":true,"reset":{"sync_version":3,"device":"dev-a"}}]}`},
		{name: "reset without replaces", body: `{"format":3,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51,"reset":{"sync_version":3,"device":"dev-a"}}]}`},
		{name: "replaces without reset in format 3", body: `{"format":3,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51,"replaces":true}]}`},
		{name: "reset at the write's version", body: `{"format":3,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51,"replaces":true,"reset":{"sync_version":51,"device":"dev-a"}}]}`},
		{name: "reset of version 0", body: `{"format":3,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51,"replaces":true,"reset":{"sync_version":0,"device":"dev-a"}}]}`},
		{name: "reset of a bad device", body: `{"format":3,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51,"replaces":true,"reset":{"sync_version":3,"device":"no/slash"}}]}`},
		{name: "reset of a delete", body: `{"format":3,"device":"` + evilDev + `","changes":[` + goodChange + `,{"table_name":"notes","record_id":"n2","patch":{},"is_deleted":true,"sync_version":51,"replaces":true,"reset":{"sync_version":3,"device":"dev-a"}}]}`},
		{name: "future format", body: `{"format":` + fmt.Sprint(patchFormat+1) + `,"device":"` + evilDev + `","changes":[` + goodChange + `]}`, want: ErrUnsupportedFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.skip != "" {
				t.Skip(tt.skip)
			}
			raw := tt.raw
			if raw == nil {
				raw = gzipBytes([]byte(tt.body))
			}
			want := tt.want
			if want == nil {
				want = ErrCorruptFile
			}
			expectRejected(t, raw, want)
		})
	}
}

// TestHostileTableNames: table names that are not registered identifiers
// are rejected before any SQL sees them; the file's valid change to notes
// is not applied either.
func TestHostileTableNames(t *testing.T) {
	for _, tt := range []struct{ label, name string }{
		{"sql", "notes; DROP TABLE notes"},
		{"sqlite_master", "sqlite_master"},
		{"sqlite_schema upper case", "SQLITE_SCHEMA"},
		{"engine table", "sync_states"},
		{"engine table mixed case", "Sync_Pending_Changes"},
		{"the capture log", "sync_pending_log"},
		{"quoted", `"notes"`},
		{"comment", "notes--"},
		{"cyrillic o", "n\u043etes"},
		{"fullwidth", "\uff4e\uff4f\uff54\uff45\uff53"},
		{"zero-width space", "notes\u200b"},
		{"NUL", "notes\x00"},
		{"empty", ""},
		{"10 KB", strings.Repeat("n", 10<<10)},
	} {
		// Labels only: "#" and "?" in a test's TempDir would cut testDSN's URI.
		t.Run(tt.label, func(t *testing.T) {
			quoted, err := json.Marshal(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			b := expectRejected(t, gzipBytes([]byte(evilFile(goodChange,
				`{"table_name":`+string(quoted)+`,"record_id":"n2","patch":{"a":1},"is_deleted":false,"sync_version":51}`))), ErrCorruptFile)
			var n int
			if err := b.db.QueryRow(`SELECT count(*) FROM sync_states WHERE table_name = ?`, tt.name).Scan(&n); err != nil || n != 0 {
				t.Errorf("got %d sync_states rows for the table (err %v), want 0", n, err)
			}
		})
	}
}

// TestHostileUnregisteredTable: a valid name of a table this app does not
// register is kept in sync_states only, counted, and not rejected.
func TestHostileUnregisteredTable(t *testing.T) {
	remote := NewMemoryRemote()
	a, b := newDevice(t, "dev-a", remote), newDevice(t, "dev-b", remote)
	a.put("good", `{"v":2}`)
	good := a.sync().Uploaded
	writeRaw(t, remote, evilName, true, evilFile(
		`{"table_name":"future_table","record_id":"r1","patch":{"a":1},"is_deleted":false,"sync_version":50}`))
	schema := schemaOf(t, b)
	r := b.sync()
	if len(r.Rejected) != 0 || r.Unregistered != 1 || r.ChangesReceived != 2 || len(r.Downloaded) != 2 || r.Downloaded[1] != good {
		t.Fatalf("got %+v, want both files applied and one unregistered change", r)
	}
	var data string
	if err := b.db.QueryRow(`SELECT record_data FROM sync_states WHERE table_name = 'future_table' AND record_id = 'r1'`).Scan(&data); err != nil || data != `{"a":1}` {
		t.Errorf("got sync_states %q (err %v), want {\"a\":1}", data, err)
	}
	if got := schemaOf(t, b); got != schema {
		t.Errorf("schema changed:\n%s\nwant\n%s", got, schema)
	}
	if got, want := b.get("good"), `{"v":2}`; got != want {
		t.Errorf("good = %s, want %s", got, want)
	}
}

// TestHostileLyingDevice: a file whose header names another device than
// its file name is rejected: it could otherwise forge that device's stamps.
func TestHostileLyingDevice(t *testing.T) {
	expectRejected(t, gzipBytes([]byte(`{"format":1,"device":"dev-a","changes":[`+goodChange+`]}`)), ErrCorruptFile)
}

// listingRemote lists extra names that its Open serves with a valid
// patch file, counting every Open of them.
type listingRemote struct {
	Remote
	extra  []string
	body   []byte
	opened atomic.Int32
}

func (l *listingRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	files, err := l.Remote.List(ctx, since)
	for _, name := range l.extra {
		files = append(files, RemoteFile{Name: name, Size: int64(len(l.body))})
	}
	return files, err
}

func (l *listingRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if slices.Contains(l.extra, name) {
		l.opened.Add(1)
		return io.NopCloser(bytes.NewReader(l.body)), nil
	}
	return l.Remote.Open(ctx, name)
}

// TestHostileListedNames: listed names whose device part holds a path
// separator or "..", or that leave the remote's root, are not patch
// files: parsePatchName refuses them and a sync ignores them.
func TestHostileListedNames(t *testing.T) {
	const ts = "20260101T000000.000Z"
	for _, tt := range []struct {
		label string
		names []string
		skip  string
	}{
		{"device part", []string{
			"2026/01/01/patch_" + ts + "_dev/x.json.gz",
			"2026/01/01/patch_" + ts + `_dev\x.json.gz`,
			"2026/01/01/patch_" + ts + "_...json.gz",
			"2026/01/01/patch_" + ts + "_../dev-x.json.gz",
			"2026/01/01/patch_" + ts + "_..%2Fdev-x.json.gz",
			`2026\01\01\patch_` + ts + "_dev-x.json.gz",
		}, ""},
		{"outside the root", []string{
			"../patch_" + ts + "_dev-x.json.gz",
			"2026/01/01/../../../patch_" + ts + "_dev-x.json.gz",
			"/etc/patch_" + ts + "_dev-x.json.gz",
		}, ""},
	} {
		t.Run(tt.label, func(t *testing.T) {
			if tt.skip != "" {
				t.Skip(tt.skip)
			}
			for _, name := range tt.names {
				if _, dev, ok := parsePatchName(name); ok {
					t.Errorf("parsePatchName(%q) accepted device %q, want it refused", name, dev)
				}
			}
			mem := NewMemoryRemote()
			lr := &listingRemote{Remote: mem, extra: tt.names,
				body: gzipBytes([]byte(`{"format":1,"device":"dev-x","changes":[` + goodChange + `]}`))}
			a, b := newDevice(t, "dev-a", mem), newDevice(t, "dev-b", lr)
			a.put("good", `{"v":2}`)
			good := a.sync().Uploaded
			r, err := b.eng.Sync(context.Background())
			if err != nil {
				t.Fatalf("got %v, want the listed names ignored", err)
			}
			if len(r.Rejected) != 0 || fmt.Sprint(r.Downloaded) != fmt.Sprint([]string{good}) {
				t.Errorf("got rejected %v, downloaded %v; want only %s downloaded", r.Rejected, r.Downloaded, good)
			}
			if n := lr.opened.Load(); n != 0 {
				t.Errorf("opened the listed names %d times, want 0", n)
			}
		})
	}
}
