package drivesync

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// FuzzEntryDecode compares the plain scan of patch-file changes and
// state-file records with json.Unmarshal, which it must match exactly on
// every input: same fields, same error or none.
func FuzzEntryDecode(f *testing.F) {
	for _, s := range []string{
		`{"table_name":"notes","record_id":"r1","patch":{"a":1,"b":null},"is_deleted":false,"sync_version":3}`,
		`{"table_name":"notes","record_id":"r1","patch":{},"is_deleted":true,"sync_version":12,"seen":{"a":[1,"x"]},"replaces":true,"reset":{"sync_version":2,"device":"d"}}`,
		` { "table_name" : "notes" , "record_id" : "r\u00e9" , "patch" : { "x" : "}" } , "sync_version" : 1 } `,
		`{"TABLE_NAME":"notes","record_id":"r","patch":{"a":1},"sync_version":1}`,
		`{"table_name":"notes","table_name":"other","record_id":"r","patch":{},"sync_version":1}`,
		`{"table_name":null,"record_id":"r","patch":null,"is_deleted":null,"sync_version":null}`,
		`{"table_name":"n\xff","record_id":"r","patch":[],"sync_version":1e2}`,
		`{"table_name":"notes","record_id":"r","patch":"x","sync_version":-1,"seen":null}`,
		`{"table_name":"notes","record_id":"r","patch":{},"sync_version":99999999999999999999}`,
		`{"table_name":"notes","record_id":"r","state":{"a":1},"clock":{"v":1,"d":"x"},"is_deleted":false}`,
		`{"table_name":"notes","record_id":"r","state":{"a":"\"}"},"clock":[1,{"a":"]"}],"is_deleted":true,"extra":1}`,
		`{"table\u005fname":"notes","record_id":"r","state":{},"clock":{}}`,
		`{"table_name":1,"record_id":"r"}`, `[]`, `null`, `"x"`, `{}`, `{"ſeen":1}`,
		`{"table_name":"notes","record_id":"r","patch":{},"sync_version":01}`,
		`{"table_name":"notes","record_id":"r","patch":{},"sync_version":1,}`,
		`{,"table_name":"notes"}`, `{"table_name":"no` + "\t" + `tes"}`, `{"patch":{"a":1}}x`, `{"patch":{"a":1} `,
		`{"table_name":"notes","patch":{"a":[1,2}}`, `{"is_deleted":tru}`, `{"is_deleted":true false}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got fileEntry
		werr := json.Unmarshal(data, &want)
		gerr := decodeFileEntry(data, &got)
		if got.canonical && !jsonv.Canonical(got.Patch, jsonv.Options{KeepNulls: true}) {
			t.Fatalf("change %q: patch %q marked canonical", data, got.Patch)
		}
		got.canonical = false
		if (werr == nil) != (gerr == nil) || (werr == nil && !reflect.DeepEqual(want, got)) {
			t.Fatalf("change %q: encoding/json gives %+v, %v; decodeFileEntry %+v, %v", data, want, werr, got, gerr)
		}
		var wantS, gotS stateEntry
		werr = json.Unmarshal(data, &wantS)
		gerr = decodeStateEntry(data, &gotS)
		if gotS.canonical && !jsonv.Canonical(gotS.State, jsonv.Options{}) {
			t.Fatalf("record %q: state %q marked canonical", data, gotS.State)
		}
		gotS.canonical = false
		if (werr == nil) != (gerr == nil) || (werr == nil && !reflect.DeepEqual(wantS, gotS)) {
			t.Fatalf("record %q: encoding/json gives %+v, %v; decodeStateEntry %+v, %v", data, wantS, werr, gotS, gerr)
		}
	})
}

// TestEntryScanTakesEngineSpelling checks that the entries the engine
// writes take the plain scan, not the encoding/json path.
func TestEntryScanTakesEngineSpelling(t *testing.T) {
	pw := patchWriter{}
	for _, c := range []fileChange{
		{table: "notes", record: "r1", patch: []byte(`{"a":"x\ny"}`), version: 3},
		{table: "notes", record: "r2", patch: []byte(`{}`), version: 4, deleted: true},
		{table: "notes", record: "r3", patch: []byte(`{"a":1}`), version: 5, seen: []byte(`{"a":0}`), flags: changeReplaces},
	} {
		raw := pw.entry(nil, c)[2:] // without ",\n"
		var e fileEntry
		if !scanFileEntry(raw, &e) {
			t.Errorf("%s: not read by the plain scan", raw)
		}
	}
	var e stateEntry
	if raw := `{"table_name":"notes","record_id":"r","state":{"a":1},"clock":{"v":1},"is_deleted":false}`; !scanStateEntry([]byte(raw), &e) {
		t.Errorf("%s: not read by the plain scan", raw)
	}
}
