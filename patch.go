package drivesync

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// This file holds the merge rules that make devices converge.
//
// A change is an RFC 7396 merge patch stamped with (version, device).
// Keeping one version per record and dropping a patch whose version is
// not newer would diverge when two devices edit different fields without
// seeing each other. Instead every record keeps a stamp per member path,
// and the state after any set of patches is the state after applying them
// in stamp order, whatever order they arrived in and however often:
//
//   - a write to a path (a leaf value, a removal, or an object) wins over
//     every older write to the same path;
//   - a leaf value or a removal at a path also ends every older write
//     below it (its "floor"), while an object written over an object
//     merges, as RFC 7396 does;
//   - a physical delete hides the record but keeps its fields, each with
//     its stamp, under the tombstone. The record is visible when its
//     newest write is newer than its newest delete: a write stamped after
//     the delete brings back the whole record with that write on top (a
//     device that edited the record without seeing the delete sent only
//     its edit, and the fields it did not touch must not be lost), and a
//     write stamped before it merges into the hidden fields and stays
//     hidden. A record is never re-created in part. A device that
//     creates a record again over one it saw deleted sends a replacing
//     write: a reset (a removal at the root, stamped with the newest
//     write or delete of the record the device had seen) and the whole
//     new row, so no field written before it returns, while a write it
//     had not seen and the delete did not hide (another device's create)
//     merges with it.
//
// Removed paths keep a tombstone stamp so that an older write arriving
// late stays removed.

type nodeKind uint8

const (
	absentNode nodeKind = iota // removed, or never written
	leafNode                   // a string, number, bool or array
	objectNode
)

// A node is the merge state of one member path of a record.
type node struct {
	kind  nodeKind
	stamp stamp // the newest write at this path
	// floor is, for objects, the newest leaf write or removal at this path
	// that the object replaced: writes below the path stamped before it
	// are gone. It is zero when no ancestor-free reset is newer than the
	// ancestors' own floors, which keeps the state canonical.
	floor stamp
	leaf  []byte
	kids  []kid // sorted by key
	// gone is, at a record's root, the stamp of its newest physical
	// delete (zero if none): the record is hidden unless a write at the
	// root is newer.
	gone stamp
}

type kid struct {
	key  string
	node *node
}

func (n *node) child(key string, create bool) *node {
	i, ok := slices.BinarySearchFunc(n.kids, key, func(k kid, key string) int { return strings.Compare(k.key, key) })
	if ok {
		return n.kids[i].node
	}
	if !create {
		return nil
	}
	c := &node{}
	n.kids = slices.Insert(n.kids, i, kid{key: key, node: c})
	return c
}

// applyPatch merges patch (an object; null members remove) written at t.
func (n *node) applyPatch(patch jsonv.Value, t stamp) {
	n.writeObject(patch, t)
}

// applyDelete records a physical delete of the record at t: it hides the
// record's content until a newer write, and removes none of it.
func (n *node) applyDelete(t stamp) {
	if n.gone.less(t) {
		n.gone = t
	}
}

// hardDelete applies a delete of patch format 1, which the previous engine
// applied as a removal at the root: it ended every write stamped before
// it, fields included, and a record written again afterwards held only
// what was written after it. Files of that format keep that meaning, so
// that every device stores the same for them, whichever engine applied
// them.
func (n *node) hardDelete(t stamp) {
	n.reset(absentNode, nil, t)
}

// reset applies a leaf write (kind leafNode) or a removal (absentNode).
func (n *node) reset(kind nodeKind, leaf []byte, t stamp) {
	switch {
	case n.stamp.less(t):
		*n = node{kind: kind, stamp: t, leaf: leaf, gone: n.gone}
	case n.kind == objectNode && n.floor.less(t):
		// Older than the object now here, but it still ends the writes
		// below this path that came before it.
		n.floor = t
		n.prune(t)
	}
}

func (n *node) writeObject(obj jsonv.Value, t stamp) {
	if n.kind != objectNode {
		if !n.stamp.less(t) {
			return // a newer leaf or removal supersedes this object
		}
		*n = node{kind: objectNode, stamp: t, floor: n.stamp, gone: n.gone}
	} else {
		if !n.floor.less(t) {
			return // written before this path was last reset
		}
		if n.stamp.less(t) {
			n.stamp = t
		}
	}
	for _, m := range obj.Members {
		c := n.child(m.Key, true)
		switch {
		case m.Value.IsObject():
			c.writeObject(m.Value, t)
		case m.Value.IsNull():
			c.reset(absentNode, nil, t)
		default:
			c.reset(leafNode, m.Value.Leaf, t)
		}
	}
}

// prune drops every write below n stamped at or before f.
func (n *node) prune(f stamp) {
	out := n.kids[:0]
	for _, k := range n.kids {
		if !f.less(k.node.stamp) {
			continue
		}
		if k.node.kind == objectNode {
			if !f.less(k.node.floor) {
				k.node.floor = stamp{}
			}
			k.node.prune(f)
		}
		out = append(out, k)
	}
	clear(n.kids[len(out):])
	n.kids = out
}

// exists reports whether the record is present: it has content, and its
// newest write is newer than its newest delete.
func (n *node) exists() bool { return n.kind == objectNode && n.gone.less(n.stamp) }

// hasContent reports whether the record has content, shown or hidden
// under a tombstone.
func (n *node) hasContent() bool { return n.kind == objectNode }

// newest returns the stamp of the record's newest write or delete.
func (n *node) newest() stamp {
	if n.stamp.less(n.gone) {
		return n.gone
	}
	return n.stamp
}

// value returns the materialized content of an object node.
func (n *node) value() jsonv.Value {
	members := make([]jsonv.Member, 0, len(n.kids))
	for _, k := range n.kids {
		switch k.node.kind {
		case leafNode:
			members = append(members, jsonv.Member{Key: k.key, Value: jsonv.Value{Leaf: k.node.leaf}})
		case objectNode:
			members = append(members, jsonv.Member{Key: k.key, Value: k.node.value()})
		}
	}
	return jsonv.Value{Members: members}
}

// diff returns the merge patch that turns old into new (both objects):
// applying it with RFC 7396 to old gives new. Null members in the result
// mean "remove".
func diff(old, new jsonv.Value) jsonv.Value {
	var out []jsonv.Member
	i, j := 0, 0
	for i < len(old.Members) || j < len(new.Members) {
		switch {
		case j >= len(new.Members) || (i < len(old.Members) && old.Members[i].Key < new.Members[j].Key):
			out = append(out, jsonv.Member{Key: old.Members[i].Key, Value: jsonv.Null})
			i++
		case i >= len(old.Members) || new.Members[j].Key < old.Members[i].Key:
			out = append(out, new.Members[j])
			j++
		default:
			o, n := old.Members[i].Value, new.Members[j].Value
			switch {
			case o.IsObject() && n.IsObject():
				if d := diff(o, n); len(d.Members) > 0 {
					out = append(out, jsonv.Member{Key: new.Members[j].Key, Value: d})
				}
			case !jsonv.Equal(o, n):
				out = append(out, new.Members[j])
			}
			i++
			j++
		}
	}
	if out == nil {
		out = []jsonv.Member{}
	}
	return jsonv.Value{Members: out}
}

// newRecordState returns the state of a record that one patch created.
func newRecordState(patch jsonv.Value, t stamp) *node {
	n := &node{}
	n.applyPatch(patch, t)
	return n
}

// The clock column of sync_states stores every stamp of a record as
// compact canonical JSON next to its content:
//
//	{"d":["<device>",...],"n":<node>,"x":[version, device]}
//
// "d" lists the record's devices in byte order and stamps refer to them by
// index. A node is [version, device] for a leaf or a removal,
// [version, device, {children}] for an object, with the floor appended as
// two more numbers when it is set. A child whose stamp equals its
// parent's and that needs nothing else is left out: a record written by
// one patch stores a single stamp. "x" is the record's newest physical
// delete, left out when there is none; "n" is left out when no write has
// reached the record, only a delete.
//
// A root stored as [version, device] was reset by a delete of format 1
// (see hardDelete), which dropped its fields; a root's floor is such a
// reset, or the reset of a replacing patch. Format 1 of the engine stored
// clocks the same way, without "x".

func encodeClock(root *node) []byte {
	devs := map[string]int{}
	var collect func(n *node)
	collect = func(n *node) {
		for _, s := range []stamp{n.stamp, n.floor, n.gone} {
			if !s.isZero() {
				devs[s.device] = 0
			}
		}
		for _, k := range n.kids {
			collect(k.node)
		}
	}
	collect(root)
	names := make([]string, 0, len(devs))
	for d := range devs {
		names = append(names, d)
	}
	slices.Sort(names)
	for i, d := range names {
		devs[d] = i
	}
	b := []byte(`{"d":[`)
	for i, d := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, d)
	}
	b = append(b, ']')
	if !root.stamp.isZero() {
		b = append(b, `,"n":`...)
		b = appendClockNode(b, root, devs)
	}
	if !root.gone.isZero() {
		b = append(b, `,"x":[`...)
		b = appendStamp(b, root.gone, devs)
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendStamp(b []byte, s stamp, devs map[string]int) []byte {
	b = strconv.AppendInt(b, s.version, 10)
	b = append(b, ',')
	return strconv.AppendInt(b, int64(devs[s.device]), 10)
}

func appendClockNode(b []byte, n *node, devs map[string]int) []byte {
	b = append(b, '[')
	b = appendStamp(b, n.stamp, devs)
	if n.kind == objectNode {
		b = append(b, ",{"...)
		first := true
		for _, k := range n.kids {
			if implicit(k.node, n.stamp) {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = jsonv.AppendString(b, k.key)
			b = append(b, ':')
			b = appendClockNode(b, k.node, devs)
		}
		b = append(b, '}')
		if !n.floor.isZero() {
			b = append(b, ',')
			b = appendStamp(b, n.floor, devs)
		}
	}
	return append(b, ']')
}

// implicit reports whether a child's clock can be left out: it carries its
// parent's stamp and nothing else.
func implicit(n *node, parent stamp) bool {
	switch n.kind {
	case leafNode:
		return n.stamp == parent
	case objectNode:
		if n.stamp != parent || !n.floor.isZero() {
			return false
		}
		for _, k := range n.kids {
			if !implicit(k.node, parent) {
				return false
			}
		}
		return true
	}
	return false // removals must be listed: content does not show them
}

var errBadClock = errors.New("malformed clock")

// clockOptions parse a clock: it nests two levels ([stamp, {children}])
// for each level of the content it describes.
var clockOptions = jsonv.Options{MaxDepth: 2*jsonv.DefaultMaxDepth + 8}

// decodeState rebuilds a record's merge state from its stored content and
// clock. deleted must agree with the clock: a record is stored as deleted
// exactly when its newest delete is newer than its newest write.
func decodeState(content jsonv.Value, clock []byte, deleted bool) (*node, error) {
	cv, err := jsonv.ParseObject(clock, clockOptions)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBadClock, err)
	}
	for _, m := range cv.Members {
		if m.Key != "d" && m.Key != "n" && m.Key != "x" {
			return nil, errBadClock
		}
	}
	dv, okD := cv.Get("d")
	nv, okN := cv.Get("n")
	xv, okX := cv.Get("x")
	if !okD {
		return nil, errBadClock
	}
	list, err := jsonv.ParseArray(dv.Leaf, clockOptions)
	if err != nil {
		return nil, errBadClock
	}
	devs := make([]string, len(list))
	for i, d := range list {
		var ok bool
		if devs[i], ok = d.String(); !ok {
			return nil, errBadClock
		}
	}
	var gone stamp
	if okX {
		c, err := parseClockNode(xv.Leaf, devs)
		if err != nil || c.kids != nil {
			return nil, errBadClock
		}
		gone = c.stamp
	}
	root := &node{}
	if okN {
		c, err := parseClockNode(nv.Leaf, devs)
		if err != nil {
			return nil, err
		}
		if c.kids == nil {
			// A record reset by a delete of format 1 (see hardDelete):
			// the delete's stamp, no content.
			root = &node{kind: absentNode, stamp: c.stamp}
		} else if root, err = buildNode(content, nv.Leaf, devs, stamp{}, true); err != nil {
			return nil, err
		}
	}
	if !root.hasContent() && len(content.Members) != 0 {
		return nil, errBadClock // content with no stamp
	}
	root.gone = gone
	if deleted == root.exists() {
		return nil, fmt.Errorf("%w: the record's deleted flag disagrees with its stamps", errBadClock)
	}
	return root, nil
}

// buildNode pairs a content value (present says whether there is one)
// with its clock entry (nil when implicit: the parent stamp applies).
func buildNode(content jsonv.Value, clock []byte, devs []string, parent stamp, present bool) (*node, error) {
	n := &node{stamp: parent}
	var c clockEntry
	if clock != nil {
		var err error
		if c, err = parseClockNode(clock, devs); err != nil {
			return nil, err
		}
		n.stamp, n.floor = c.stamp, c.floor
	}
	switch {
	case !present:
		if clock == nil || c.kids != nil {
			return nil, errBadClock
		}
		n.kind = absentNode
		return n, nil
	case !content.IsObject():
		if c.kids != nil {
			return nil, errBadClock
		}
		n.kind, n.leaf = leafNode, content.Leaf
		return n, nil
	case clock != nil && c.kids == nil:
		return nil, errBadClock
	}
	n.kind = objectNode
	n.kids = make([]kid, 0, len(content.Members))
	for _, m := range content.Members {
		var kc []byte
		if c.kids != nil {
			v, _ := c.kids.Get(m.Key)
			kc = v.Leaf
		}
		k, err := buildNode(m.Value, kc, devs, n.stamp, true)
		if err != nil {
			return nil, err
		}
		n.kids = append(n.kids, kid{key: m.Key, node: k})
	}
	if c.kids != nil {
		for _, m := range c.kids.Members {
			if _, ok := content.Get(m.Key); ok {
				continue
			}
			k, err := buildNode(jsonv.Value{}, m.Value.Leaf, devs, n.stamp, false) // a removal
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, kid{key: m.Key, node: k})
		}
		slices.SortFunc(n.kids, func(a, b kid) int { return strings.Compare(a.key, b.key) })
	}
	return n, nil
}

type clockEntry struct {
	stamp, floor stamp
	kids         *jsonv.Value // nil for a leaf or a removal
}

// parseClockNode parses [v,d], [v,d,{...}] or [v,d,{...},fv,fd].
func parseClockNode(b []byte, devs []string) (clockEntry, error) {
	var c clockEntry
	if b == nil {
		return c, errBadClock
	}
	el, err := jsonv.ParseArray(b, clockOptions)
	if err != nil || (len(el) != 2 && len(el) != 3 && len(el) != 5) {
		return c, errBadClock
	}
	if c.stamp, err = parseStamp(el[0], el[1], devs); err != nil {
		return c, err
	}
	if len(el) == 2 {
		return c, nil
	}
	if !el[2].IsObject() {
		return c, errBadClock
	}
	for _, m := range el[2].Members {
		if m.Value.IsObject() {
			return c, errBadClock
		}
	}
	c.kids = &el[2]
	if len(el) == 5 {
		if c.floor, err = parseStamp(el[3], el[4], devs); err != nil {
			return c, err
		}
	}
	return c, nil
}

func parseStamp(v, d jsonv.Value, devs []string) (stamp, error) {
	ver, err1 := strconv.ParseInt(string(v.Leaf), 10, 64)
	di, err2 := strconv.Atoi(string(d.Leaf))
	if err1 != nil || err2 != nil || di < 0 || di >= len(devs) {
		return stamp{}, errBadClock
	}
	return stamp{version: ver, device: devs[di]}, nil
}

// merge folds the writes that state o records into n: afterwards n is the
// state of the union of both sets of writes, as if every patch behind o
// had been applied to n. Snapshots and merge files carry states, not
// patches; this is how a device takes them in. It replays, for every path
// of o, the newest write there and the reset below it (its floor), each
// as the nested patch that would have written it; the merge rules above
// then make the order irrelevant.
func (n *node) merge(o *node) {
	n.replay(o, nil)
	if !o.gone.isZero() {
		n.applyDelete(o.gone)
	}
}

func (n *node) replay(o *node, path []string) {
	if !o.floor.isZero() {
		n.writeAt(path, jsonv.Null, o.floor)
	}
	switch o.kind {
	case absentNode:
		if !o.stamp.isZero() {
			n.writeAt(path, jsonv.Null, o.stamp)
		}
	case leafNode:
		n.writeAt(path, jsonv.Value{Leaf: o.leaf}, o.stamp)
	case objectNode:
		n.writeAt(path, jsonv.Value{Members: []jsonv.Member{}}, o.stamp)
		for _, k := range o.kids {
			n.replay(k.node, append(path, k.key))
		}
	}
}

// writeAt applies the write of v at path (null: a removal), stamped t.
func (n *node) writeAt(path []string, v jsonv.Value, t stamp) {
	if len(path) == 0 {
		if v.IsNull() {
			n.reset(absentNode, nil, t) // a reset of the root (hardDelete); merge takes its gone
		} else {
			n.applyPatch(v, t)
		}
		return
	}
	for i := len(path) - 1; i >= 0; i-- {
		v = jsonv.Value{Members: []jsonv.Member{{Key: path[i], Value: v}}}
	}
	n.applyPatch(v, t)
}

func applyChange(n *node, c fileChange, device string) error {
	if c.clock != nil { // a state file's record: merge its state
		content, err := jsonv.ParseObject(c.patch, jsonv.Options{})
		if err != nil {
			return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
		}
		o, err := decodeState(content, c.clock, c.deleted)
		if err != nil {
			return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
		}
		n.merge(o)
		return nil
	}
	at := stamp{version: c.version, device: device}
	switch {
	case c.deleted && c.flags&changeHard != 0:
		n.hardDelete(at)
		return nil
	case c.deleted:
		n.applyDelete(at)
		return nil
	}
	p, err := jsonv.ParseObject(c.patch, jsonv.Options{KeepNulls: true})
	if err != nil {
		return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	if c.flags&changeReplaces != 0 {
		// The reset ends every write up to the newest one its writer had
		// seen (format 3); the patch is the record, merged only with
		// writes its writer had not seen and no delete hid. Format 2
		// stamped it with the version before the patch's, by the same
		// device.
		r := c.reset
		if r.version == 0 {
			r = stamp{version: c.version - 1, device: device}
		}
		n.reset(absentNode, nil, r)
	}
	n.applyPatch(p, at)
	return nil
}

// encodeState returns what sync_states stores for a record: its content,
// shown or hidden under a tombstone, and its clock.
func encodeState(n *node) (data, clock string) {
	data = "{}"
	if n.hasContent() {
		data = string(jsonv.Encode(n.value()))
	}
	return data, string(encodeClock(n))
}
