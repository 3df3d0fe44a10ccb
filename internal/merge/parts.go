package merge

import (
	"errors"
	"fmt"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// ErrTooLarge says that a value is over a size limit.
var ErrTooLarge = errors.New("too large")

// StateParts splits a record's state that is over the record limit (a
// record merged from writes of several devices may grow past it, each
// write within it) into parts that are not: each is the record's root,
// with its stamps and its delete, and some of its members, a member too
// large for one part split the same way below it. A reader merges the
// parts as it merges any state (see Node.Merge): the writes behind them
// are, together, exactly the writes behind the whole, so the merge gives
// the whole state. prune first drops the values no part can hold (see
// pruneNode).
func StateParts(data, clock []byte, deleted bool, maxRecord int64, prune bool) ([]*Node, error) {
	content, err := jsonv.ParseObject(data, jsonv.Options{})
	if err != nil {
		return nil, err
	}
	n, err := DecodeState(content, clock, deleted)
	if err != nil {
		return nil, err
	}
	fits := recordFits(maxRecord)
	if prune {
		pruneNode(n, asRecord, fits)
	}
	return splitState(n, asRecord, fits)
}

// recordFits reports whether a record's state (or a part of it) is within
// the record limit.
func recordFits(maxRecord int64) func(*Node) bool {
	return func(p *Node) bool {
		d, c := EncodeState(p)
		return int64(len(d)) <= maxRecord && int64(len(c)) <= 2*maxRecord
	}
}

// asRecord wraps a record's root: itself.
func asRecord(n *Node) *Node { return n }

// under returns the wrap of kid key of n, n being wrapped by wrap: n with
// that kid alone, wrapped.
func under(n *Node, key string, wrap func(*Node) *Node) func(*Node) *Node {
	return func(sub *Node) *Node {
		c := *n
		c.Kids = []Kid{{Key: key, Node: sub}}
		return wrap(&c)
	}
}

// pruneNode turns every value under n (wrapped by wrap in its record's
// root and the path down to it) that does not fit alone, where splitState
// fails, into a removal of the same stamp, so that it still ends the
// older writes of its path, as the write did. It reports whether n must
// go whole: its key alone is too long (no write of it fits either).
// Stamps of records, deletes and floors stay.
func pruneNode(n *Node, wrap func(*Node) *Node, fits func(*Node) bool) bool {
	if fits(wrap(n)) {
		return false
	}
	if n.Kind == ObjectNode && len(n.Kids) > 0 {
		parent := *n // the kids' wraps take n's stamps, not its kids
		out := n.Kids[:0]
		for _, k := range n.Kids {
			if !pruneNode(k.Node, under(&parent, k.Key, wrap), fits) {
				out = append(out, k)
			}
		}
		clear(n.Kids[len(out):])
		n.Kids = out
	} else if n.Kind != AbsentNode {
		*n = Node{Kind: AbsentNode, Stamp: n.Stamp, Gone: n.Gone}
	}
	return !fits(wrap(n))
}

// splitState returns parts of n, each wrapped (by wrap) in the record's
// root and the path down to n, that fit: n whole, or its members split in
// halves, down to a single member, split below its own key.
func splitState(n *Node, wrap func(*Node) *Node, fits func(*Node) bool) ([]*Node, error) {
	if whole := wrap(n); fits(whole) {
		return []*Node{whole}, nil
	}
	if n.Kind != ObjectNode || len(n.Kids) == 0 {
		return nil, fmt.Errorf("%w: a single value is over the store's record limit", ErrTooLarge)
	}
	if len(n.Kids) == 1 {
		return splitState(n.Kids[0].Node, under(n, n.Kids[0].Key, wrap), fits)
	}
	half := len(n.Kids) / 2
	a, b := *n, *n
	a.Kids, b.Kids = n.Kids[:half:half], n.Kids[half:]
	pa, err := splitState(&a, wrap, fits)
	if err != nil {
		return nil, err
	}
	pb, err := splitState(&b, wrap, fits)
	return append(pa, pb...), err
}

// PruneRecord drops from a record's state n the values no part within
// maxRecord can hold, as StateParts with prune does.
func PruneRecord(n *Node, maxRecord int64) {
	pruneNode(n, asRecord, recordFits(maxRecord))
}
