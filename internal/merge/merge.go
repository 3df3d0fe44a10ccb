// Package merge holds the merge rules that make every replica of a store
// converge, and the rules on what a write may name: the devices' engines
// and the sync server apply the same ones.
package merge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/drivesync/drivesync/internal/jsonv"
)

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

// NodeKind says what a Node holds.
type NodeKind uint8

const (
	AbsentNode NodeKind = iota // removed, or never written
	LeafNode                   // a string, number, bool or array
	ObjectNode
)

// A Node is the merge state of one member path of a record.
type Node struct {
	Kind  NodeKind
	Stamp Stamp // the newest write at this path
	// Floor is, for objects, the newest leaf write or removal at this path
	// that the object replaced: writes below the path stamped before it
	// are gone. It is zero when no ancestor-free reset is newer than the
	// ancestors' own floors, which keeps the state canonical.
	Floor Stamp
	Leaf  []byte
	Kids  []Kid // sorted by key
	// Gone is, at a record's root, the stamp of its newest physical
	// delete (zero if none): the record is hidden unless a write at the
	// root is newer.
	Gone Stamp
}

// A Kid is a member of an object Node.
type Kid struct {
	Key  string
	Node *Node
}

// Child returns the member key of n, adding it if create is set, or nil.
func (n *Node) Child(key string, create bool) *Node {
	i, ok := slices.BinarySearchFunc(n.Kids, key, func(k Kid, key string) int { return strings.Compare(k.Key, key) })
	if ok {
		return n.Kids[i].Node
	}
	if !create {
		return nil
	}
	c := &Node{}
	n.Kids = slices.Insert(n.Kids, i, Kid{Key: key, Node: c})
	return c
}

// ApplyPatch merges patch (an object; null members remove) written at t.
func (n *Node) ApplyPatch(patch jsonv.Value, t Stamp) {
	n.writeObject(patch, t)
}

// ApplyDelete records a physical delete of the record at t: it hides the
// record's content until a newer write, and removes none of it.
func (n *Node) ApplyDelete(t Stamp) {
	if n.Gone.Less(t) {
		n.Gone = t
	}
}

// HardDelete applies a delete of patch format 1, which the previous engine
// applied as a removal at the root: it ended every write stamped before
// it, fields included, and a record written again afterwards held only
// what was written after it. Files of that format keep that meaning, so
// that every device stores the same for them, whichever engine applied
// them.
func (n *Node) HardDelete(t Stamp) {
	n.Reset(AbsentNode, nil, t)
}

// Reset applies a leaf write (kind LeafNode) or a removal (AbsentNode).
func (n *Node) Reset(kind NodeKind, leaf []byte, t Stamp) {
	switch {
	case n.Stamp.Less(t):
		*n = Node{Kind: kind, Stamp: t, Leaf: leaf, Gone: n.Gone}
	case n.Kind == ObjectNode && n.Floor.Less(t):
		// Older than the object now here, but it still ends the writes
		// below this path that came before it.
		n.Floor = t
		n.Prune(t)
	}
}

func (n *Node) writeObject(obj jsonv.Value, t Stamp) {
	if n.Kind != ObjectNode {
		if !n.Stamp.Less(t) {
			return // a newer leaf or removal supersedes this object
		}
		*n = Node{Kind: ObjectNode, Stamp: t, Floor: n.Stamp, Gone: n.Gone}
	} else {
		if !n.Floor.Less(t) {
			return // written before this path was last reset
		}
		if n.Stamp.Less(t) {
			n.Stamp = t
		}
	}
	for _, m := range obj.Members {
		c := n.Child(m.Key, true)
		switch {
		case m.Value.IsObject():
			c.writeObject(m.Value, t)
		case m.Value.IsNull():
			c.Reset(AbsentNode, nil, t)
		default:
			c.Reset(LeafNode, m.Value.Leaf, t)
		}
	}
}

// Prune drops every write below n stamped at or before f.
func (n *Node) Prune(f Stamp) {
	out := n.Kids[:0]
	for _, k := range n.Kids {
		if !f.Less(k.Node.Stamp) {
			continue
		}
		if k.Node.Kind == ObjectNode {
			if !f.Less(k.Node.Floor) {
				k.Node.Floor = Stamp{}
			}
			k.Node.Prune(f)
		}
		out = append(out, k)
	}
	clear(n.Kids[len(out):])
	n.Kids = out
}

// Exists reports whether the record is present: it has content, and its
// newest write is newer than its newest delete.
func (n *Node) Exists() bool { return n.Kind == ObjectNode && n.Gone.Less(n.Stamp) }

// HasContent reports whether the record has content, shown or hidden
// under a tombstone.
func (n *Node) HasContent() bool { return n.Kind == ObjectNode }

// Newest returns the stamp of the record's newest write or delete.
func (n *Node) Newest() Stamp {
	if n.Stamp.Less(n.Gone) {
		return n.Gone
	}
	return n.Stamp
}

// Oldest returns the lowest version of a stamp the record's state holds
// (its writes', floors' and delete's), 0 if it holds none.
func (n *Node) Oldest() int64 {
	var low int64
	var walk func(n *Node)
	walk = func(n *Node) {
		for _, s := range []Stamp{n.Stamp, n.Floor, n.Gone} {
			if !s.IsZero() && (low == 0 || s.Version < low) {
				low = s.Version
			}
		}
		for _, k := range n.Kids {
			walk(k.Node)
		}
	}
	walk(n)
	return low
}

// Value returns the materialized content of an object node.
func (n *Node) Value() jsonv.Value {
	members := make([]jsonv.Member, 0, len(n.Kids))
	for _, k := range n.Kids {
		switch k.Node.Kind {
		case LeafNode:
			members = append(members, jsonv.Member{Key: k.Key, Value: jsonv.Value{Leaf: k.Node.Leaf}})
		case ObjectNode:
			members = append(members, jsonv.Member{Key: k.Key, Value: k.Node.Value()})
		}
	}
	return jsonv.Value{Members: members}
}

// Diff returns the merge patch that turns old into new (both objects):
// applying it with RFC 7396 to old gives new. Null members in the result
// mean "remove".
func Diff(old, new jsonv.Value) jsonv.Value {
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
				if d := Diff(o, n); len(d.Members) > 0 {
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

// NewRecordState returns the state of a record that one patch created.
func NewRecordState(patch jsonv.Value, t Stamp) *Node {
	n := &Node{}
	n.ApplyPatch(patch, t)
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

func EncodeClock(root *Node) []byte {
	devs := map[string]int{}
	var collect func(n *Node)
	collect = func(n *Node) {
		for _, s := range []Stamp{n.Stamp, n.Floor, n.Gone} {
			if !s.IsZero() {
				devs[s.Device] = 0
			}
		}
		for _, k := range n.Kids {
			collect(k.Node)
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
	if !root.Stamp.IsZero() {
		b = append(b, `,"n":`...)
		b = appendClockNode(b, root, devs)
	}
	if !root.Gone.IsZero() {
		b = append(b, `,"x":[`...)
		b = appendStamp(b, root.Gone, devs)
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendStamp(b []byte, s Stamp, devs map[string]int) []byte {
	b = strconv.AppendInt(b, s.Version, 10)
	b = append(b, ',')
	return strconv.AppendInt(b, int64(devs[s.Device]), 10)
}

func appendClockNode(b []byte, n *Node, devs map[string]int) []byte {
	b = append(b, '[')
	b = appendStamp(b, n.Stamp, devs)
	if n.Kind == ObjectNode {
		b = append(b, ",{"...)
		first := true
		for _, k := range n.Kids {
			if implicit(k.Node, n.Stamp) {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = jsonv.AppendString(b, k.Key)
			b = append(b, ':')
			b = appendClockNode(b, k.Node, devs)
		}
		b = append(b, '}')
		if !n.Floor.IsZero() {
			b = append(b, ',')
			b = appendStamp(b, n.Floor, devs)
		}
	}
	return append(b, ']')
}

// implicit reports whether a child's clock can be left out: it carries its
// parent's stamp and nothing else.
func implicit(n *Node, parent Stamp) bool {
	switch n.Kind {
	case LeafNode:
		return n.Stamp == parent
	case ObjectNode:
		if n.Stamp != parent || !n.Floor.IsZero() {
			return false
		}
		for _, k := range n.Kids {
			if !implicit(k.Node, parent) {
				return false
			}
		}
		return true
	}
	return false // removals must be listed: content does not show them
}

var ErrBadClock = errors.New("malformed clock")

// clockOptions parse a clock: it nests two levels ([stamp, {children}])
// for each level of the content it describes.
var clockOptions = jsonv.Options{MaxDepth: 2*jsonv.DefaultMaxDepth + 8}

// DecodeState rebuilds a record's merge state from its stored content and
// clock. deleted must agree with the clock: a record is stored as deleted
// exactly when its newest delete is newer than its newest write.
func DecodeState(content jsonv.Value, clock []byte, deleted bool) (*Node, error) {
	cv, err := jsonv.ParseObject(clock, clockOptions)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadClock, err)
	}
	for _, m := range cv.Members {
		if m.Key != "d" && m.Key != "n" && m.Key != "x" {
			return nil, ErrBadClock
		}
	}
	dv, okD := cv.Get("d")
	nv, okN := cv.Get("n")
	xv, okX := cv.Get("x")
	if !okD {
		return nil, ErrBadClock
	}
	list, err := jsonv.ParseArray(dv.Leaf, clockOptions)
	if err != nil {
		return nil, ErrBadClock
	}
	devs := make([]string, len(list))
	for i, d := range list {
		var ok bool
		if devs[i], ok = d.String(); !ok {
			return nil, ErrBadClock
		}
	}
	var gone Stamp
	if okX {
		c, err := parseClockNode(xv.Leaf, devs)
		if err != nil || c.kids != nil {
			return nil, ErrBadClock
		}
		gone = c.stamp
	}
	root := &Node{}
	if okN {
		c, err := parseClockNode(nv.Leaf, devs)
		if err != nil {
			return nil, err
		}
		if c.kids == nil {
			// A record reset by a delete of format 1 (see hardDelete):
			// the delete's stamp, no content.
			root = &Node{Kind: AbsentNode, Stamp: c.stamp}
		} else if root, err = buildNode(content, nv.Leaf, devs, Stamp{}, true); err != nil {
			return nil, err
		}
	}
	if !root.HasContent() && len(content.Members) != 0 {
		return nil, ErrBadClock // content with no stamp
	}
	root.Gone = gone
	if deleted == root.Exists() {
		return nil, fmt.Errorf("%w: the record's deleted flag disagrees with its stamps", ErrBadClock)
	}
	return root, nil
}

// ClockStamps calls fn with every stamp clock holds (its writes', their
// floors' and its delete's; a stamp may come more than once), without
// the record's content: the writes a record's state records.
func ClockStamps(clock []byte, fn func(Stamp)) error {
	cv, err := jsonv.ParseObject(clock, clockOptions)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadClock, err)
	}
	dv, ok := cv.Get("d")
	if !ok {
		return ErrBadClock
	}
	list, err := jsonv.ParseArray(dv.Leaf, clockOptions)
	if err != nil {
		return ErrBadClock
	}
	devs := make([]string, len(list))
	for i, d := range list {
		if devs[i], ok = d.String(); !ok {
			return ErrBadClock
		}
	}
	var walk func(b []byte) error
	walk = func(b []byte) error {
		c, err := parseClockNode(b, devs)
		if err != nil {
			return err
		}
		fn(c.stamp)
		if !c.floor.IsZero() {
			fn(c.floor)
		}
		if c.kids != nil {
			for _, m := range c.kids.Members {
				if err := walk(m.Value.Leaf); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if xv, ok := cv.Get("x"); ok {
		if err := walk(xv.Leaf); err != nil {
			return err
		}
	}
	if nv, ok := cv.Get("n"); ok {
		return walk(nv.Leaf)
	}
	return nil
}

// buildNode pairs a content value (present says whether there is one)
// with its clock entry (nil when implicit: the parent stamp applies).
func buildNode(content jsonv.Value, clock []byte, devs []string, parent Stamp, present bool) (*Node, error) {
	n := &Node{Stamp: parent}
	var c clockEntry
	if clock != nil {
		var err error
		if c, err = parseClockNode(clock, devs); err != nil {
			return nil, err
		}
		n.Stamp, n.Floor = c.stamp, c.floor
	}
	switch {
	case !present:
		if clock == nil || c.kids != nil {
			return nil, ErrBadClock
		}
		n.Kind = AbsentNode
		return n, nil
	case !content.IsObject():
		if c.kids != nil {
			return nil, ErrBadClock
		}
		n.Kind, n.Leaf = LeafNode, content.Leaf
		return n, nil
	case clock != nil && c.kids == nil:
		return nil, ErrBadClock
	}
	n.Kind = ObjectNode
	n.Kids = make([]Kid, 0, len(content.Members))
	for _, m := range content.Members {
		var kc []byte
		if c.kids != nil {
			v, _ := c.kids.Get(m.Key)
			kc = v.Leaf
		}
		k, err := buildNode(m.Value, kc, devs, n.Stamp, true)
		if err != nil {
			return nil, err
		}
		n.Kids = append(n.Kids, Kid{Key: m.Key, Node: k})
	}
	if c.kids != nil {
		for _, m := range c.kids.Members {
			if _, ok := content.Get(m.Key); ok {
				continue
			}
			k, err := buildNode(jsonv.Value{}, m.Value.Leaf, devs, n.Stamp, false) // a removal
			if err != nil {
				return nil, err
			}
			n.Kids = append(n.Kids, Kid{Key: m.Key, Node: k})
		}
		slices.SortFunc(n.Kids, func(a, b Kid) int { return strings.Compare(a.Key, b.Key) })
	}
	return n, nil
}

type clockEntry struct {
	stamp, floor Stamp
	kids         *jsonv.Value // nil for a leaf or a removal
}

// parseClockNode parses [v,d], [v,d,{...}] or [v,d,{...},fv,fd].
func parseClockNode(b []byte, devs []string) (clockEntry, error) {
	var c clockEntry
	if b == nil {
		return c, ErrBadClock
	}
	el, err := jsonv.ParseArray(b, clockOptions)
	if err != nil || (len(el) != 2 && len(el) != 3 && len(el) != 5) {
		return c, ErrBadClock
	}
	if c.stamp, err = parseStamp(el[0], el[1], devs); err != nil {
		return c, err
	}
	if len(el) == 2 {
		return c, nil
	}
	if !el[2].IsObject() {
		return c, ErrBadClock
	}
	for _, m := range el[2].Members {
		if m.Value.IsObject() {
			return c, ErrBadClock
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

func parseStamp(v, d jsonv.Value, devs []string) (Stamp, error) {
	ver, err1 := strconv.ParseInt(string(v.Leaf), 10, 64)
	di, err2 := strconv.Atoi(string(d.Leaf))
	if err1 != nil || err2 != nil || di < 0 || di >= len(devs) {
		return Stamp{}, ErrBadClock
	}
	return Stamp{Version: ver, Device: devs[di]}, nil
}

// Merge folds the writes that state o records into n: afterwards n is the
// state of the union of both sets of writes, as if every patch behind o
// had been applied to n. Snapshots and Merge files carry states, not
// patches; this is how a device takes them in. It replays, for every path
// of o, the newest write there and the reset below it (its floor), each
// as the nested patch that would have written it; the Merge rules above
// then make the order irrelevant.
func (n *Node) Merge(o *Node) {
	n.replay(o, nil)
	if !o.Gone.IsZero() {
		n.ApplyDelete(o.Gone)
	}
}

func (n *Node) replay(o *Node, path []string) {
	if !o.Floor.IsZero() {
		n.WriteAt(path, jsonv.Null, o.Floor)
	}
	switch o.Kind {
	case AbsentNode:
		if !o.Stamp.IsZero() {
			n.WriteAt(path, jsonv.Null, o.Stamp)
		}
	case LeafNode:
		n.WriteAt(path, jsonv.Value{Leaf: o.Leaf}, o.Stamp)
	case ObjectNode:
		n.WriteAt(path, jsonv.Value{Members: []jsonv.Member{}}, o.Stamp)
		for _, k := range o.Kids {
			n.replay(k.Node, append(path, k.Key))
		}
	}
}

// WriteAt applies the write of v at path (null: a removal), stamped t.
func (n *Node) WriteAt(path []string, v jsonv.Value, t Stamp) {
	if len(path) == 0 {
		if v.IsNull() {
			n.Reset(AbsentNode, nil, t) // a reset of the root (hardDelete); merge takes its gone
		} else {
			n.ApplyPatch(v, t)
		}
		return
	}
	for i := len(path) - 1; i >= 0; i-- {
		v = jsonv.Value{Members: []jsonv.Member{{Key: path[i], Value: v}}}
	}
	n.ApplyPatch(v, t)
}

// FreshClock returns the clock EncodeState gives a record that had no
// state after one write stamped at, neither a delete nor a replacing
// write, of a patch that is an object with no null member at any depth
// (one that removes nothing). Its content is that patch, canonically
// encoded. Every path of such a record carries the write's stamp, which
// the clock leaves implicit: the record's tree need not be built.
func FreshClock(at Stamp) string {
	// EncodeClock of an object node at the stamp, with no kids: its one
	// device, and the root's stamp.
	b := make([]byte, 0, 32+len(at.Device))
	b = append(b, `{"d":[`...)
	b = jsonv.AppendString(b, at.Device)
	b = append(b, `],"n":[`...)
	b = strconv.AppendInt(b, at.Version, 10)
	return string(append(b, `,0,{}]}`...))
}

// ParseFreshClock returns the stamp of a clock in FreshClock's form, byte
// for byte, and false for any other clock.
func ParseFreshClock(clock []byte) (Stamp, bool) {
	rest, ok := bytes.CutPrefix(clock, []byte(`{"d":[`))
	if !ok {
		return Stamp{}, false
	}
	rest, ok = bytes.CutSuffix(rest, []byte(`,0,{}]}`))
	if !ok {
		return Stamp{}, false
	}
	i := bytes.LastIndex(rest, []byte(`],"n":[`))
	if i < 0 {
		return Stamp{}, false
	}
	var at Stamp
	if dev, ok := jsonv.PlainString(rest[:i]); ok {
		at.Device = dev
	} else if err := json.Unmarshal(rest[:i], &at.Device); err != nil {
		return Stamp{}, false
	}
	var err error
	if at.Version, err = strconv.ParseInt(string(rest[i+len(`],"n":[`):]), 10, 64); err != nil {
		return Stamp{}, false
	}
	if FreshClock(at) != string(clock) {
		return Stamp{}, false // not in the form FreshClock writes
	}
	return at, true
}

// EncodeState returns what sync_states stores for a record: its content,
// shown or hidden under a tombstone, and its clock.
func EncodeState(n *Node) (data, clock string) {
	data = "{}"
	if n.HasContent() {
		data = string(jsonv.Encode(n.Value()))
	}
	return data, string(EncodeClock(n))
}

// A Stamp identifies one write: the Lamport version it was given and the
// device that made it. Stamps are totally ordered by version and then by
// device id, so two devices that Stamp the same version still agree on a
// winner. Every write a device makes gets a version no other write of
// that device has, so a Stamp names exactly one write.
type Stamp struct {
	Version int64
	Device  string
}

func (a Stamp) Compare(b Stamp) int {
	switch {
	case a.Version < b.Version:
		return -1
	case a.Version > b.Version:
		return 1
	}
	return strings.Compare(a.Device, b.Device)
}

func (a Stamp) Less(b Stamp) bool { return a.Compare(b) < 0 }

func (a Stamp) IsZero() bool { return a.Version == 0 && a.Device == "" }

// A Write is one write of a record as a device made it.
type Write struct {
	At Stamp
	// Patch is an RFC 7396 merge patch, null members kept (they remove);
	// unused for a delete.
	Patch   jsonv.Value
	Deleted bool // a physical delete: it hides the record
	// Hard marks a delete of the first patch format, which ended every
	// older write (see HardDelete).
	Hard bool
	// Replaces marks a record created again over one its writer saw
	// deleted: Patch is the whole record, and every write up to Reset
	// (the newest write or delete of the record its writer had seen) is
	// gone. A zero Reset means the version before At's, by At's device.
	Replaces bool
	Reset    Stamp
}

// Apply merges w into the record's state n.
func (n *Node) Apply(w Write) {
	switch {
	case w.Deleted && w.Hard:
		n.HardDelete(w.At)
		return
	case w.Deleted:
		n.ApplyDelete(w.At)
		return
	}
	if w.Replaces {
		// The reset ends every write up to the newest one its writer had
		// seen; the patch is the record, merged only with writes its
		// writer had not seen and no delete hid.
		r := w.Reset
		if r.Version == 0 {
			r = Stamp{Version: w.At.Version - 1, Device: w.At.Device}
		}
		n.Reset(AbsentNode, nil, r)
	}
	n.ApplyPatch(w.Patch, w.At)
}

// Reuses reports whether n holds another write under w's stamp: at a path
// w writes, a value, a removal or an object stamped w.At that w does not
// write, or a delete stamped w.At where w writes. A stamp names one write;
// two writes under one stamp (two copies of one database, syncing under
// one device id) would each stay where it arrived first, for good.
// Applying w twice is not a reuse.
func (n *Node) Reuses(w Write) bool {
	if w.Deleted {
		return n.Stamp == w.At && n.Kind != AbsentNode
	}
	return n.Gone == w.At || n.reusesObject(w.Patch, w.At)
}

func (n *Node) reusesObject(obj jsonv.Value, t Stamp) bool {
	for _, m := range obj.Members {
		c := n.Child(m.Key, false)
		if c == nil {
			continue
		}
		if c.Stamp != t {
			if m.Value.IsObject() && c.Kind == ObjectNode && c.reusesObject(m.Value, t) {
				return true
			}
			continue
		}
		switch {
		case m.Value.IsObject():
			if c.Kind != ObjectNode || c.reusesObject(m.Value, t) {
				return true
			}
		case m.Value.IsNull():
			if c.Kind != AbsentNode {
				return true
			}
		case c.Kind != LeafNode || !bytes.Equal(c.Leaf, m.Value.Leaf):
			return true
		}
	}
	return false
}
