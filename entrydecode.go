package drivesync

import (
	"encoding/json"
	"strconv"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// Every change of a patch file and every record of a state file is read
// by encoding/json's rules: which member names match a field (any case),
// which of a repeated member wins (the last), what an invalid UTF-8 byte
// becomes (U+FFFD). Devices on every app version must read a file alike,
// so those rules stay. But reflection makes them the costliest part of
// applying a file, and nearly every entry is spelled the one way the
// engine writes it. So an entry is first read by a plain scan that takes
// only that spelling: each member once, by its exact name, strings with
// no escape and valid UTF-8, booleans as true or false, integers as
// digits. Anything else (a member of a later format, an escape, a null)
// goes to json.Unmarshal, and the result is the same either way
// (FuzzEntryDecode compares the two). The scan checks what it takes as
// strictly as the JSON grammar: a value it keeps as bytes must be
// canonical JSON (jsonv.Canonical), which is valid JSON.

// decodeFileEntry decodes raw, one value as jsonStream delimits it, into
// e as json.Unmarshal does, errors included: the plain scan accepts only
// valid JSON.
func decodeFileEntry(raw []byte, e *fileEntry) error {
	if scanFileEntry(raw, e) {
		return nil
	}
	*e = fileEntry{}
	return json.Unmarshal(raw, e)
}

// decodeStateEntry is decodeFileEntry for a record of a state file.
func decodeStateEntry(raw []byte, e *stateEntry) error {
	if scanStateEntry(raw, e) {
		return nil
	}
	*e = stateEntry{}
	return json.Unmarshal(raw, e)
}

func scanFileEntry(raw []byte, e *fileEntry) bool {
	var have uint8
	return scanMembers(raw, func(key, val []byte) (ok bool) {
		var bit uint8
		switch string(key) {
		case "table_name":
			bit = 1 << 0
			e.Table, ok = jsonv.PlainString(val)
		case "record_id":
			bit = 1 << 1
			e.Record, ok = jsonv.PlainString(val)
		case "patch":
			bit, e.Patch, ok = 1<<2, val, plainJSON(val)
			e.canonical = ok
		case "is_deleted":
			bit = 1 << 3
			e.Deleted, ok = plainBool(val)
		case "sync_version":
			bit = 1 << 4
			e.Version, ok = plainInt(val)
		case "replaces":
			bit = 1 << 5
			e.Replaces, ok = plainBool(val)
		case "seen":
			bit, e.Seen, ok = 1<<6, val, plainJSON(val)
		default: // "reset", rare, or an unknown member
			return false
		}
		if have&bit != 0 {
			return false
		}
		have |= bit
		return ok
	})
}

func scanStateEntry(raw []byte, e *stateEntry) bool {
	var have uint8
	return scanMembers(raw, func(key, val []byte) (ok bool) {
		var bit uint8
		switch string(key) {
		case "table_name":
			bit = 1 << 0
			e.Table, ok = jsonv.PlainString(val)
		case "record_id":
			bit = 1 << 1
			e.Record, ok = jsonv.PlainString(val)
		case "state":
			// Canonical as a state: no null member where a state drops
			// it (a state that has one is read the slow way).
			bit, e.State, ok = 1<<2, val, jsonv.Canonical(val, jsonv.Options{})
			e.canonical = ok
		case "clock":
			bit, e.Clock, ok = 1<<3, val, plainJSON(val)
		case "is_deleted":
			bit = 1 << 4
			e.Deleted, ok = plainBool(val)
		default:
			return false
		}
		if have&bit != 0 {
			return false
		}
		have |= bit
		return ok
	})
}

// scanMembers calls member for each member of the JSON object raw, with
// its key (only keys of printable ASCII with no escape are taken) and its
// value's bytes, and reports whether raw is such an object and member
// took every member. It checks the object's structure; member checks
// each value (the value's bytes are only delimited here).
func scanMembers(raw []byte, member func(key, val []byte) bool) bool {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return skipSpace(raw, i+1) == len(raw)
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return false
		}
		k := i + 1
		for k < len(raw) && raw[k] != '"' {
			if raw[k] < 0x20 || raw[k] >= 0x7f || raw[k] == '\\' {
				return false
			}
			k++
		}
		if k >= len(raw) {
			return false
		}
		key := raw[i+1 : k]
		i = skipSpace(raw, k+1)
		if i >= len(raw) || raw[i] != ':' {
			return false
		}
		i = skipSpace(raw, i+1)
		end := valueEnd(raw, i)
		if end <= i || !member(key, raw[i:end]) {
			return false
		}
		i = skipSpace(raw, end)
		if i >= len(raw) {
			return false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case '}':
			return skipSpace(raw, i+1) == len(raw)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// valueEnd delimits the value at b[i:]: a string to its closing quote,
// an object or array to its closing bracket, anything else to the first
// byte that cannot be in a number or literal. It returns i where b[i:]
// holds no such end.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	if c := b[i]; c != '"' && c != '{' && c != '[' {
		j := i
		for j < len(b) && scalarByte(b[j]) {
			j++
		}
		return j
	}
	depth, inString, escaped := 0, false, false
	for j := i; j < len(b); j++ {
		c := b[j]
		switch {
		case escaped:
			escaped = false
		case inString:
			k := quoteOrEscape(b[j:])
			if k < 0 {
				return i
			}
			j += k
			if b[j] == '\\' {
				escaped = true
				continue
			}
			inString = false
			if depth == 0 {
				return j + 1
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth--; depth == 0 {
				return j + 1
			}
		}
	}
	return i
}

// scalarByte reports whether c may be part of a number or a literal.
func scalarByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '+' || c == '.'
}

// plainJSON reports whether v is JSON in its canonical spelling, as the
// engine writes patches, states, clocks and seen lists: valid JSON, kept
// as raw bytes.
func plainJSON(v []byte) bool {
	return jsonv.Canonical(v, jsonv.Options{KeepNulls: true})
}

func plainBool(v []byte) (bool, bool) {
	switch string(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// plainInt is a non-negative integer in JSON's spelling, which
// encoding/json decodes into an int64 field as strconv.ParseInt does.
func plainInt(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 || (v[0] == '0' && len(v) > 1) {
		return 0, false
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}
