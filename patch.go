package drivesync

import (
	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// applyChange merges one change of a patch file, or one record of a state
// file, into the record's state n.
func applyChange(n *merge.Node, c fileChange, device string) error {
	if c.clock != nil { // a state file's record: merge its state
		o, err := changeState(c)
		if err != nil {
			return err
		}
		n.Merge(o)
		return nil
	}
	var p jsonv.Value
	if !c.deleted {
		var err error
		if p, err = jsonv.ParseObject(c.patch, jsonv.Options{KeepNulls: true}); err != nil {
			return &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
		}
	}
	applyWrite(n, c, device, p)
	return nil
}

// changeState returns the merge state of c, a state file's record.
func changeState(c fileChange) (*merge.Node, error) {
	content, err := jsonv.ParseObject(c.patch, jsonv.Options{})
	if err != nil {
		return nil, &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	o, err := merge.DecodeState(content, c.clock, c.deleted)
	if err != nil {
		return nil, &Error{Op: "apply", Table: c.table, Record: c.record, Err: err}
	}
	return o, nil
}

// applyWrite merges write c of a patch file, its patch already parsed
// into p (with its nulls; ignored for a delete).
func applyWrite(n *merge.Node, c fileChange, device string, p jsonv.Value) {
	w := merge.Write{At: merge.Stamp{Version: c.version, Device: device}, Deleted: c.deleted,
		Hard: c.flags&changeHard != 0, Replaces: c.flags&changeReplaces != 0, Reset: c.reset}
	if !c.deleted {
		w.Patch = p
	}
	n.Apply(w)
}
