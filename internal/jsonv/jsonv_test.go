package jsonv

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestParseCanonical(t *testing.T) {
	tests := []struct {
		name, in, want string
		keepNulls      bool
	}{
		{"sorted keys", `{"b":1, "a" : 2}`, `{"a":2,"b":1}`, false},
		{"null member dropped", `{"a":null,"b":{"c":null,"d":1}}`, `{"b":{"d":1}}`, false},
		{"null member kept in patch", `{"a":null,"b":{"c":null}}`, `{"a":null,"b":{"c":null}}`, true},
		{"nulls kept inside arrays", `{"a":[null,{"y":null,"x":1}]}`, `{"a":[null,{"x":1,"y":null}]}`, false},
		{"duplicate key keeps last", `{"a":1,"a":2}`, `{"a":2}`, false},
		{"big integer exact", `{"n":9007199254740993,"m":-123456789012345678901234567890}`, `{"m":-123456789012345678901234567890,"n":9007199254740993}`, false},
		{"decimal exact", `{"x":0.1000000000000000055511151231257827}`, `{"x":0.1000000000000000055511151231257827}`, false},
		{"string escapes canonical", `{"s":"a\u0041\/\n\u00e9<>&"}`, `{"s":"aA/\né<>&"}`, false},
		{"control escaped", "{\"s\":\"\\u0001\"}", `{"s":"\u0001"}`, false},
		{"surrogate pair", `{"s":"\ud83d\ude00"}`, `{"s":"😀"}`, false},
		{"lone surrogate", `{"s":"\ud83d"}`, `{"s":"` + "\ufffd" + `"}`, false},
		{"invalid utf8", "{\"s\":\"a\xffb\"}", "{\"s\":\"a\ufffdb\"}", false},
		{"empty object", `{ }`, `{}`, false},
		{"escaped key", `{"a\"b":1}`, `{"a\"b":1}`, false},
		{"nested arrays", `{"a":[[1, 2], [], {}]}`, `{"a":[[1,2],[],{}]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Parse([]byte(tt.in), Options{KeepNulls: tt.keepNulls})
			if err != nil {
				t.Fatal(err)
			}
			if got := string(Encode(v)); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			// Canonical output parses back to itself.
			v2, err := Parse(Encode(v), Options{KeepNulls: tt.keepNulls})
			if err != nil || string(Encode(v2)) != tt.want {
				t.Errorf("reparse: got %s (%v), want %s", Encode(v2), err, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{``, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `-`, `1e`, `tru`, `"abc`, `{"a":1} x`, "\"a\x01\"", `"\x"`, `{1:2}`, `NaN`, `"\u12"`} {
		if _, err := Parse([]byte(in), Options{}); err == nil {
			t.Errorf("Parse(%q) succeeded, want error", in)
		}
	}
}

func TestParseDepth(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	_, err := Parse([]byte(deep), Options{})
	if !errors.Is(err, ErrTooDeep) {
		t.Fatalf("got %v, want ErrTooDeep", err)
	}
	arr := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	if _, err := Parse([]byte(arr), Options{}); !errors.Is(err, ErrTooDeep) {
		t.Fatalf("array: got %v, want ErrTooDeep", err)
	}
	ok := strings.Repeat(`{"a":`, 50) + "1" + strings.Repeat("}", 50)
	if _, err := Parse([]byte(ok), Options{}); err != nil {
		t.Fatal(err)
	}
}

// FuzzParse checks that Parse accepts exactly what encoding/json accepts
// (within the depth limit), and that its output is a fixed point.
func FuzzParse(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",null,{"b":[]}]`, `"\ud800"`, `1e400`, `{"a":{"b":null}}`, `-0.0e-0`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data, Options{KeepNulls: true, MaxDepth: 64})
		valid := json.Valid(data)
		if err == nil && !valid {
			t.Fatalf("Parse accepted invalid JSON %q", data)
		}
		if err != nil {
			if valid && !errors.Is(err, ErrTooDeep) {
				t.Fatalf("Parse rejected valid JSON %q: %v", data, err)
			}
			return
		}
		enc := Encode(v)
		if !json.Valid(enc) {
			t.Fatalf("canonical output %q is not JSON", enc)
		}
		v2, err := Parse(enc, Options{KeepNulls: true, MaxDepth: 64})
		if err != nil {
			t.Fatalf("reparse %q: %v", enc, err)
		}
		if got := Encode(v2); string(got) != string(enc) {
			t.Fatalf("not a fixed point: %q -> %q", enc, got)
		}
	})
}

// FuzzCanonical checks Canonical against Parse and Encode: whatever it
// accepts parses and encodes to the same bytes, and the encoding of any
// value whose keys have no escapes is accepted.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":{"c":null}}`, `{"b":1,"a":2}`, `{"a":"x\ny\u0001\"\\"}`, `{"a":"\u000a"}`, `[{"b":null,"a":1}]`,
		`{"a":[1,2,{"z":null}]}`, `{"a":"\/"}`, `{"a":1,"a":2}`, `{"é":1,"e":2}`, `{"k":"\u00e9"}`, `{"a":null}`, `{"a": 1}`, `{"a\"b":1}`} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, keepNulls bool) {
		opt := Options{KeepNulls: keepNulls, MaxDepth: 16}
		v, err := Parse(data, opt)
		if Canonical(data, opt) {
			if err != nil {
				t.Fatalf("Canonical accepted %q, which Parse refuses: %v", data, err)
			}
			if enc := Encode(v); !bytes.Equal(enc, data) {
				t.Fatalf("Canonical accepted %q, whose encoding is %q", data, enc)
			}
		}
		if err != nil {
			return
		}
		enc := Encode(v)
		if !Canonical(enc, opt) && !escapedKey(t, enc) {
			t.Fatalf("Canonical refused the encoding %q", enc)
		}
	})
}

// escapedKey reports whether the JSON data has an object key that needs
// an escape, at any depth.
func escapedKey(t *testing.T, data []byte) bool {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case map[string]any:
			for k, m := range v {
				if strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' }) || walk(m) {
					return true
				}
			}
		case []any:
			for _, e := range v {
				if walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}
