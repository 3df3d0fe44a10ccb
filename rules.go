package drivesync

import (
	"bytes"
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// Merge rules of an ordinary table's columns.
//
// A column merges by the last writer unless its Table names another rule.
// A rule never changes the file format or the merge: it is a way of
// writing a column as an object whose members merge as every object's do
// (per member, by stamp, with deletes and resets), and of reading the
// column's value back from those members. So every device's state stays
// byte-identical whatever rules its app version knows; a device whose
// Table lacks a rule a column was written with reports that record
// unwritten (it cannot read the object) instead of showing another value.
//
// MergeMax writes each value as a member of the column's object, keyed by
// the value's JSON form ({"7":true}); the column shows the largest key.
// Members only add up, so the largest value ever written wins in any
// order of arrival; a replacing write (a record created again over its
// delete) starts from nothing, as it does for every column. A local write
// below the column's value is not sent: the next sync writes the value
// back into the row and reports the write in Report.Overruled.
//
// A new rule is a new MergeRule with the two halves here: how a row's
// value becomes members of the column's object (ruleMember) and how the
// members give the value back (ruleValue).

// MergeRule is how a column of an ordinary table merges.
type MergeRule int

const (
	MergeLastWriter MergeRule = iota // last writer wins, by (version, device)
	MergeMax                         // the value only grows: the largest ever written wins
)

func (r MergeRule) String() string {
	switch r {
	case MergeLastWriter:
		return "MergeLastWriter"
	case MergeMax:
		return "MergeMax"
	}
	return "MergeRule(" + strconv.Itoa(int(r)) + ")"
}

var trueLeaf = jsonv.Value{Leaf: []byte("true")}

// ruleMember returns the member that column col of the record holds once
// the row shows value v (a leaf), given its member in the record the row
// showed (have, nil: none); overruled reports a value the rule does not
// take (the row is to show the rule's value again).
func (t *tableInfo) ruleMember(col string, v jsonv.Value, have *jsonv.Value) (member jsonv.Value, overruled bool) {
	if t.rules[col] != MergeMax || v.IsObject() {
		return v, false // already the record's form
	}
	added := jsonv.Member{Key: string(v.Leaf), Value: trueLeaf}
	if have == nil {
		return jsonv.Value{Members: []jsonv.Member{added}}, false
	}
	// The value the record shows; a leaf (written by a device without the
	// rule) is one value, which a larger one replaces.
	top, ok := t.ruleValue(col, *have)
	switch {
	case !ok:
		return v, false // not members this rule reads: the row's value replaces them
	case jsonv.Equal(top, v):
		return *have, false
	}
	if c, ok := compareLeaves(v, top); !ok || c <= 0 {
		return *have, true
	}
	var kept []jsonv.Member
	if have.IsObject() {
		kept = have.Members
	}
	out := jsonv.Value{Members: append(slices.Clone(kept), added)}
	sortMembers(out.Members)
	return out, false
}

// ruleValue returns the leaf that column col shows for member m of its
// record: m itself, or, for MergeMax, its largest key. ok is false for
// members the rule cannot read.
func (t *tableInfo) ruleValue(col string, m jsonv.Value) (jsonv.Value, bool) {
	if !m.IsObject() {
		return m, true
	}
	if t.rules[col] != MergeMax || len(m.Members) == 0 {
		return jsonv.Value{}, false
	}
	var top jsonv.Value
	for i, mm := range m.Members {
		v, err := jsonv.Parse([]byte(mm.Key), jsonv.Options{})
		if err != nil || v.IsObject() || string(jsonv.Encode(v)) != mm.Key || string(mm.Value.Leaf) != "true" {
			return jsonv.Value{}, false
		}
		if i == 0 {
			top = v
			continue
		}
		c, ok := compareLeaves(v, top)
		if !ok {
			return jsonv.Value{}, false
		}
		if c > 0 || c == 0 && mm.Key > string(top.Leaf) {
			top = v
		}
	}
	return top, true
}

// compareLeaves orders two column values as SQLite does (NULL, numbers,
// TEXT, BLOB; numbers by value, TEXT and BLOB by bytes); ok is false if
// either is not a column value.
func compareLeaves(a, b jsonv.Value) (int, bool) {
	va, err := decodeValue(a)
	if err != nil {
		return 0, false
	}
	vb, err := decodeValue(b)
	if err != nil {
		return 0, false
	}
	return compareValues(va, vb), true
}

func compareValues(a, b any) int {
	class := func(v any) int {
		switch v.(type) {
		case nil:
			return 0
		case int64, float64:
			return 1
		case string:
			return 2
		}
		return 3
	}
	if c := cmp.Compare(class(a), class(b)); c != 0 {
		return c
	}
	switch a := a.(type) {
	case nil:
		return 0
	case string:
		return strings.Compare(a, b.(string))
	case []byte:
		return bytes.Compare(a, b.([]byte))
	case int64:
		if b, ok := b.(int64); ok {
			return cmp.Compare(a, b)
		}
		return -compareFloatInt(b.(float64), a)
	}
	fa := a.(float64)
	if b, ok := b.(int64); ok {
		return compareFloatInt(fa, b)
	}
	return cmp.Compare(fa, b.(float64))
}

// compareFloatInt compares a float64 with an int64 exactly.
func compareFloatInt(f float64, i int64) int {
	switch {
	case f >= 1<<63:
		return 1
	case f < -(1 << 63):
		return -1
	}
	fi := math.Trunc(f)
	if c := cmp.Compare(int64(fi), i); c != 0 {
		return c
	}
	return cmp.Compare(f-fi, 0)
}
