package syncserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
	"github.com/google/uuid"
)

// serverDevice is the device a plain client's writes to a store are
// stamped with: the server stamps them itself, each after every write the
// store holds. It names the store, so that writes of two stores never
// share a stamp, even when a device brings the writes of a store since
// deleted into the one that replaced it.
func serverDevice(store string) string { return "server-" + store }

var (
	storeNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	keyRE       = regexp.MustCompile(`^[\x21-\x7e]{1,255}$`)
)

// storeName returns the store a request names (query parameter store),
// "default" when it names none.
func storeName(r *http.Request) (string, *problemError) {
	name := r.URL.Query().Get("store")
	if name == "" {
		return "default", nil
	}
	if !storeNameRE.MatchString(name) {
		return "", badField("store", "a store name is 1-128 letters, digits, '.', '_' or '-'")
	}
	return name, nil
}

// A push applies, in one transaction, every write its body holds:
//
//	{"ops": {"<table>": [<op>, ...], ..., "deletions": [<deletion>, ...]}}
//
// (deletions may also be a member of the body itself). An op is a plain
// row, {"op": "upsert", "id": "<id>", <field>: <value>, ...}, written as an
// RFC 7396 merge patch of its fields and stamped by the server; or, with
// "id": null and "tempId": "<t>", a new record whose id the server makes
// and returns in idMap, which later ops of the push may name in a member
// "<x>_tempId" (sent as "<x>_id"). A drivesync engine's op carries its
// stamp and patch in a member "drivesync". A deletion is {"table": "<t>",
// "id": "<id>", "deleted_at": "<time>"}, plus "drivesync" for an engine's.
//
// Either every write applies or none does. The answer names the store's
// clock before the push (previous_time) and after it (cursor): the
// store's writes between are the push's own, so a client whose cursor is
// at or after previous_time may pull next from cursor, and does not pull
// back what it pushed. A client whose cursor is earlier keeps it: other
// writes came between.
func (h *Handler) push(w http.ResponseWriter, r *http.Request, user string) {
	name, perr := storeName(r)
	if perr != nil {
		writeProblem(w, r, perr.p)
		return
	}
	info(r).store = name
	key := r.Header.Get("Idempotency-Key")
	if key != "" && !keyRE.MatchString(key) {
		writeProblem(w, r, badField("Idempotency-Key", "a key is 1-255 printable ASCII characters without spaces, such as a UUID").p)
		return
	}
	storeID := r.URL.Query().Get("store_id")
	body := http.MaxBytesReader(w, r.Body, h.opts.MaxBodyBytes)
	now := h.opts.Now().UnixMicro()
	h.store.sweepKeys(r.Context(), now-h.opts.KeyLifetime.Microseconds())

	var response string
	err := h.store.push(r.Context(), user, name, now, func(tx *pushTx) error {
		if storeID != "" && storeID != tx.store.id {
			return h.otherStore(r.Context(), user, name, storeID, tx.store.id)
		}
		hash := sha256.New()
		src := io.TeeReader(body, hash)
		if key != "" {
			stored, resp, found, err := tx.key(key, now-h.opts.KeyLifetime.Microseconds())
			if err != nil {
				return err
			}
			if found {
				if _, err := io.Copy(io.Discard, src); err != nil {
					return bodyErr(err)
				}
				if hex.EncodeToString(hash.Sum(nil)) != stored {
					return &problemError{problemBody{Type: problemType("idempotency-key-reused"), Title: "Idempotency key reused", Status: http.StatusUnprocessableEntity,
						Detail: "this Idempotency-Key was sent to this store before with another body; use a new key for a new push",
						Errors: []fieldError{{Field: "Idempotency-Key", Detail: "already used for another request"}}}}
				}
				response = resp
				return errReplay
			}
		}
		first := max(now, tx.store.last+1)
		a := &pushApplier{h: h, tx: tx, first: first, next: first, maxVersion: tx.store.maxVersion, now: now, idMap: map[string]string{}}
		if err := a.decode(src); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, src); err != nil {
			return bodyErr(err)
		}
		last := tx.store.last
		if a.next > a.first {
			last = a.next - 1
		}
		if err := tx.setClock(last, a.maxVersion); err != nil {
			return err
		}
		response = a.response(tx.store.id, max(last, now), tx.store.last, last)
		if key != "" {
			return tx.saveKey(key, hex.EncodeToString(hash.Sum(nil)), response, now)
		}
		return nil
	})
	switch {
	case errors.Is(err, errReplay):
		w.Header().Set("Idempotent-Replayed", "true")
	case err != nil:
		var pe *problemError
		if errors.As(err, &pe) {
			writeProblem(w, r, pe.p)
			return
		}
		info(r).err = err
		if r.Context().Err() != nil {
			problem(w, r, 499, "cancelled", "Request cancelled", "the client went away before the push was applied; nothing was applied")
			return
		}
		problem(w, r, http.StatusServiceUnavailable, "unavailable", "Push not applied",
			"the server could not apply the push (its database failed); nothing was applied: send it again with the same Idempotency-Key")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, response)
}

// errReplay ends a push's transaction that found its key: the stored
// response is sent, and nothing is written.
var errReplay = errors.New("replayed")

func bodyErr(err error) error {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return &problemError{problemBody{Type: problemType("body-too-large"), Title: "Body too large", Status: http.StatusRequestEntityTooLarge,
			Detail: fmt.Sprintf("the body is over the server's limit of %d bytes: push fewer changes at a time", mb.Limit)}}
	}
	return err
}

// pushApplier applies one push's writes.
type pushApplier struct {
	h          *Handler
	tx         *pushTx
	dec        *json.Decoder
	first      int64 // the time of the push's first write, µs
	next       int64 // the time of the next write
	now        int64
	maxVersion int64
	applied    int
	idMap      map[string]string
	idOrder    []string
}

// response is the push's answer. previous and cursor are the store's
// clock before and after the push: the store's writes after previous up
// to cursor are this push's, so a client whose cursor is previous or
// later may pull next from cursor, and not get its own writes back.
func (a *pushApplier) response(store string, at, previous, cursor int64) string {
	b := []byte(`{"ok":true,"idMap":{`)
	for i, t := range a.idOrder {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, t)
		b = append(b, ':')
		b = jsonv.AppendString(b, a.idMap[t])
	}
	b = append(b, `},"server_time":"`...)
	b = append(b, formatMicros(at)...)
	b = append(b, `","applied":`...)
	b = strconv.AppendInt(b, int64(a.applied), 10)
	b = append(b, `,"store":`...)
	b = jsonv.AppendString(b, store)
	b = append(b, `,"previous_time":"`...)
	b = append(b, formatMicros(previous)...)
	b = append(b, `","cursor":"`...)
	b = append(b, formatMicros(cursor)...)
	return string(append(b, "\"}\n"...))
}

// decode walks the body, applying each write as it is read.
func (a *pushApplier) decode(src io.Reader) error {
	a.dec = json.NewDecoder(src)
	if err := a.delim('{', "body"); err != nil {
		return err
	}
	for a.dec.More() {
		k, err := a.key("body")
		if err != nil {
			return err
		}
		switch k {
		case "ops":
			err = a.ops()
		case "deletions":
			err = a.deletions("deletions")
		default:
			err = badField(k, `unknown member: a push holds "ops" (and "deletions")`)
		}
		if err != nil {
			return err
		}
	}
	if err := a.delim('}', "body"); err != nil {
		return err
	}
	if _, err := a.dec.Token(); err != io.EOF {
		if err == nil {
			return badField("body", "data after the JSON object")
		}
		return a.syntax("body", err)
	}
	return nil
}

func (a *pushApplier) syntax(field string, err error) error {
	if e := bodyErr(err); e != err {
		return e
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badField("body", "the JSON ends early: the body was cut short")
	}
	return badField(field, "malformed JSON: "+err.Error())
}

func (a *pushApplier) delim(want json.Delim, field string) error {
	tok, err := a.dec.Token()
	if err != nil {
		return a.syntax(field, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		kind := map[json.Delim]string{'{': "an object", '[': "an array", '}': "the end of an object", ']': "the end of an array"}[want]
		return badField(field, "must be "+kind)
	}
	return nil
}

func (a *pushApplier) key(field string) (string, error) {
	tok, err := a.dec.Token()
	if err != nil {
		return "", a.syntax(field, err)
	}
	return tok.(string), nil // inside an object, the decoder gives keys
}

func (a *pushApplier) ops() error {
	if err := a.delim('{', "ops"); err != nil {
		return err
	}
	for a.dec.More() {
		table, err := a.key("ops")
		if err != nil {
			return err
		}
		if table == "deletions" {
			if err := a.deletions("ops.deletions"); err != nil {
				return err
			}
			continue
		}
		field := "ops." + table
		if err := merge.CheckTableName(table); err != nil {
			return badField(field, err.Error())
		}
		if err := a.delim('[', field); err != nil {
			return err
		}
		for i := 0; a.dec.More(); i++ {
			raw, err := a.element(fmt.Sprintf("%s[%d]", field, i))
			if err != nil {
				return err
			}
			if err := a.op(table, fmt.Sprintf("%s[%d]", field, i), raw); err != nil {
				return err
			}
		}
		if err := a.delim(']', field); err != nil {
			return err
		}
	}
	return a.delim('}', "ops")
}

func (a *pushApplier) element(field string) (jsonv.Value, error) {
	var raw json.RawMessage
	if err := a.dec.Decode(&raw); err != nil {
		return jsonv.Value{}, a.syntax(field, err)
	}
	// A write's patch, or a state's data, is bounded below; this bounds
	// what is parsed to find out (a state's clock may take twice its
	// data).
	if int64(len(raw)) > 3*a.h.opts.MaxRecordBytes+64<<10 {
		return jsonv.Value{}, badField(field, fmt.Sprintf("%d bytes, over the server's limit of %d for one write", len(raw), a.h.opts.MaxRecordBytes))
	}
	v, err := jsonv.Parse(raw, jsonv.Options{KeepNulls: true})
	if err != nil {
		return jsonv.Value{}, badField(field, err.Error())
	}
	if !v.IsObject() {
		return jsonv.Value{}, badField(field, "must be an object")
	}
	return v, nil
}

// timeFields are the members of a plain row that must hold RFC 3339 times.
var timeFields = []string{"created_at", "updated_at", "deleted_at"}

// op applies one member of ops.<table>.
func (a *pushApplier) op(table, field string, v jsonv.Value) error {
	var id, tempID string
	var ds *jsonv.Value
	kind := "upsert"
	fields := jsonv.Value{Members: []jsonv.Member{}}
	for _, m := range v.Members {
		switch m.Key {
		case "op":
			s, ok := m.Value.String()
			if !ok || (s != "upsert" && s != "delete") {
				return badField(field+".op", `must be "upsert" or "delete"`)
			}
			kind = s
		case "id":
			if m.Value.IsNull() {
				continue
			}
			s, ok := m.Value.String()
			if !ok {
				return badField(field+".id", "must be a string, or null with a tempId")
			}
			if err := checkID(s); err != nil {
				return badField(field+".id", err.Error())
			}
			id = s
		case "tempId":
			s, ok := m.Value.String()
			if !ok || s == "" || len(s) > 256 {
				return badField(field+".tempId", "must be a string of 1-256 bytes")
			}
			tempID = s
		case "drivesync":
			ds = &m.Value
		default:
			fields.Members = append(fields.Members, m)
		}
	}
	switch {
	case id == "" && tempID == "":
		return badField(field+".id", "an op needs an id, or a tempId for a new record")
	case id != "" && tempID != "":
		return badField(field+".tempId", "an op with an id takes no tempId")
	case tempID != "" && a.idMap[tempID] != "":
		return badField(field+".tempId", "tempId "+strconv.Quote(tempID)+" is used twice in this push")
	case tempID != "" && (ds != nil || kind == "delete"):
		return badField(field+".tempId", "only a plain upsert creates a record from a tempId")
	}
	if ds != nil {
		if len(fields.Members) > 0 {
			return badField(field+"."+fields.Members[0].Key, "a drivesync op carries its fields in drivesync.patch")
		}
		if kind == "delete" {
			return badField(field+".op", `a drivesync delete is a member of "deletions"`)
		}
		if st, ok := ds.Get("state"); ok {
			if len(ds.Members) != 1 {
				return badField(field+".drivesync", "a state comes alone")
			}
			n, err := a.state(field+".drivesync.state", st)
			if err != nil {
				return err
			}
			return a.write(table, id, func(m *merge.Node) error { m.Merge(n); return nil }, nil, nil)
		}
		w, err := a.stamped(field+".drivesync", *ds, false)
		if err != nil {
			return err
		}
		var seen map[string]merge.Stamp
		if v, ok := ds.Get("seen"); ok {
			if seen, err = parseSeenList(v); err != nil {
				return badField(field+".drivesync.seen", err.Error())
			}
		}
		return a.write(table, id, a.stampedWrite(field, w), &w, seen)
	}
	if kind == "delete" {
		if len(fields.Members) > 0 {
			return badField(field+"."+fields.Members[0].Key, "a delete takes no fields")
		}
		return a.write(table, id, applying(merge.Write{At: a.serverStamp(), Deleted: true}), nil, nil)
	}
	if tempID != "" {
		id = uuid.NewString()
		a.idMap[tempID] = id
		a.idOrder = append(a.idOrder, tempID)
	}
	patch, err := a.plainFields(field, fields)
	if err != nil {
		return err
	}
	return a.write(table, id, applying(merge.Write{At: a.serverStamp(), Patch: patch}), nil, nil)
}

// plainFields checks a plain row's fields and resolves its references to
// records created earlier in the push ("<x>_tempId" becomes "<x>_id").
func (a *pushApplier) plainFields(field string, fields jsonv.Value) (jsonv.Value, error) {
	out := jsonv.Value{Members: make([]jsonv.Member, 0, len(fields.Members))}
	for _, m := range fields.Members {
		if ref, ok := strings.CutSuffix(m.Key, "_tempId"); ok && ref != "" {
			t, ok := m.Value.String()
			if !ok || a.idMap[t] == "" {
				return jsonv.Value{}, badField(field+"."+m.Key, "must name the tempId of a record created earlier in this push")
			}
			if _, dup := fields.Get(ref + "_id"); dup {
				return jsonv.Value{}, badField(field+"."+m.Key, "the row also has "+ref+"_id")
			}
			out.Members = append(out.Members, jsonv.Member{Key: ref + "_id", Value: jsonv.Value{Leaf: jsonv.AppendString(nil, a.idMap[t])}})
			continue
		}
		for _, tf := range timeFields {
			if m.Key != tf || m.Value.IsNull() {
				continue
			}
			s, ok := m.Value.String()
			if !ok {
				return jsonv.Value{}, badField(field+"."+m.Key, "must be an RFC 3339 time string or null")
			}
			if _, err := parseTime(s); err != nil {
				return jsonv.Value{}, badField(field+"."+m.Key, err.Error())
			}
		}
		out.Members = append(out.Members, m)
	}
	// Keys changed by the references: keep the members sorted.
	sortMembers(out.Members)
	if int64(len(jsonv.Encode(out))) > a.h.opts.MaxRecordBytes {
		return jsonv.Value{}, badField(field, fmt.Sprintf("the row is over the server's limit of %d bytes", a.h.opts.MaxRecordBytes))
	}
	return out, nil
}

func (a *pushApplier) deletions(field string) error {
	if err := a.delim('[', field); err != nil {
		return err
	}
	for i := 0; a.dec.More(); i++ {
		f := fmt.Sprintf("%s[%d]", field, i)
		v, err := a.element(f)
		if err != nil {
			return err
		}
		var table, id string
		var ds *jsonv.Value
		for _, m := range v.Members {
			switch m.Key {
			case "table":
				s, ok := m.Value.String()
				if !ok {
					return badField(f+".table", "must be a string")
				}
				if err := merge.CheckTableName(s); err != nil {
					return badField(f+".table", err.Error())
				}
				table = s
			case "id":
				s, ok := m.Value.String()
				if !ok {
					return badField(f+".id", "must be a string")
				}
				if err := checkID(s); err != nil {
					return badField(f+".id", err.Error())
				}
				id = s
			case "deleted_at":
				s, ok := m.Value.String()
				if !ok {
					return badField(f+".deleted_at", "must be an RFC 3339 time string")
				}
				if _, err := parseTime(s); err != nil {
					return badField(f+".deleted_at", err.Error())
				}
			case "drivesync":
				ds = &m.Value
			default:
				return badField(f+"."+m.Key, `unknown member: a deletion holds "table", "id" and "deleted_at"`)
			}
		}
		if table == "" {
			return badField(f+".table", "missing")
		}
		if id == "" {
			return badField(f+".id", "missing")
		}
		var apply func(*merge.Node) error
		if ds != nil {
			wr, err := a.stamped(f+".drivesync", *ds, true)
			if err != nil {
				return err
			}
			apply = a.stampedWrite(f, wr)
		} else {
			apply = applying(merge.Write{At: a.serverStamp(), Deleted: true})
		}
		if err := a.write(table, id, apply, nil, nil); err != nil {
			return err
		}
	}
	return a.delim(']', field)
}

// stamped reads an engine's write: {"version": n, "device": "<id>",
// "patch": {...}, "replaces": true, "reset": {"version": n, "device":
// "<id>"}}; a deletion's holds only version and device.
func (a *pushApplier) stamped(field string, v jsonv.Value, deleted bool) (merge.Write, error) {
	w := merge.Write{Deleted: deleted}
	if !v.IsObject() {
		return w, badField(field, "must be an object")
	}
	var err error
	var havePatch bool
	for _, m := range v.Members {
		switch m.Key {
		case "version", "device":
		case "seen": // read by op
			if deleted {
				return w, badField(field+".seen", "a deletion carries no seen list")
			}
		case "patch":
			if deleted {
				return w, badField(field+".patch", "a deletion carries no patch")
			}
			if !m.Value.IsObject() {
				return w, badField(field+".patch", "must be an object (an RFC 7396 merge patch)")
			}
			w.Patch, havePatch = m.Value, true
		case "replaces":
			if string(m.Value.Leaf) != "true" && string(m.Value.Leaf) != "false" {
				return w, badField(field+".replaces", "must be true or false")
			}
			w.Replaces = string(m.Value.Leaf) == "true"
		case "reset":
			// A reset names the newest write its writer had seen,
			// which may be the server's own.
			if w.Reset, err = a.stamp(field+".reset", m.Value, true); err != nil {
				return w, err
			}
		default:
			return w, badField(field+"."+m.Key, "unknown member")
		}
	}
	if w.At, err = a.stamp(field, v, false); err != nil {
		return w, err
	}
	switch {
	case !deleted && !havePatch:
		return w, badField(field+".patch", "missing")
	case w.Replaces && deleted:
		return w, badField(field+".replaces", "a deletion does not replace")
	case !w.Replaces && !w.Reset.IsZero():
		return w, badField(field+".reset", "only a replacing write has a reset")
	case w.Replaces && w.Reset.IsZero():
		return w, badField(field+".reset", "a replacing write names its reset")
	case w.Replaces && !w.Reset.Less(w.At):
		return w, badField(field+".reset", "must be stamped before the write")
	}
	if int64(len(jsonv.Encode(w.Patch))) > a.h.opts.MaxRecordBytes {
		return w, badField(field+".patch", fmt.Sprintf("over the server's limit of %d bytes", a.h.opts.MaxRecordBytes))
	}
	a.maxVersion = max(a.maxVersion, w.At.Version)
	return w, nil
}

// stamp reads the version and device members of v.
func (a *pushApplier) stamp(field string, v jsonv.Value, serverOK bool) (merge.Stamp, error) {
	var s merge.Stamp
	if !v.IsObject() {
		return s, badField(field, "must be an object")
	}
	ver, ok := v.Get("version")
	if !ok {
		return s, badField(field+".version", "missing")
	}
	n, err := strconv.ParseInt(string(ver.Leaf), 10, 64)
	// Versions are bounded by the server's clock as a device bounds those
	// of a file by its name's time: a stamp far ahead would stop the
	// store from taking changes.
	if limit := merge.VersionsAllowed(microTime(a.now)); err != nil || n < 1 || n > limit {
		return s, badField(field+".version", fmt.Sprintf("must be an integer from 1 to %d", limit))
	}
	dev, ok := v.Get("device")
	d, isStr := dev.String()
	if !ok || !isStr {
		return s, badField(field+".device", "must be a device id")
	}
	if err := merge.CheckDeviceID(d); err != nil {
		return s, badField(field+".device", err.Error())
	}
	if merge.ServerDevice(d) && !serverOK {
		return s, badField(field+".device", `"server" and "server-…" are the server's own stamps: a device may not write with them`)
	}
	return merge.Stamp{Version: n, Device: d}, nil
}

// serverStamp stamps a plain client's write after every write the store
// holds.
func (a *pushApplier) serverStamp() merge.Stamp {
	a.maxVersion++
	return merge.Stamp{Version: a.maxVersion, Device: serverDevice(a.tx.store.id)}
}

// write applies fn to the record's state and, if that changed it, stores
// it at the push's next time, with what the writes of its paths had seen
// (w and seen: an engine's write and its list, or nil; see seen.go).
func (a *pushApplier) write(table, id string, fn func(*merge.Node) error, w *merge.Write, seen map[string]merge.Stamp) error {
	r, found, err := a.tx.record(table, id)
	if err != nil {
		return err
	}
	n := &merge.Node{}
	if found {
		content, err := jsonv.ParseObject([]byte(r.data), jsonv.Options{})
		if err == nil {
			n, err = merge.DecodeState(content, []byte(r.clock), r.deleted)
		}
		if err != nil {
			return fmt.Errorf("stored record %s/%s: %w", table, id, err)
		}
	}
	if err := fn(n); err != nil {
		return err
	}
	data, clock := merge.EncodeState(n)
	if data == r.data && clock == r.clock {
		a.applied++ // nothing new: a write seen before
		return nil
	}
	wasDeleted := found && r.deleted
	r.data, r.clock, r.deleted = data, clock, !n.Exists()
	r.seen = updateSeen(r.seen, n, w, seen)
	r.updated = a.next
	a.next++
	if r.deleted && !wasDeleted {
		r.deletedAt = r.updated
	}
	a.applied++
	return a.tx.putRecord(r)
}

func checkID(id string) error {
	if id == "" || len(id) > merge.MaxRecordIDLen {
		return fmt.Errorf("an id is 1-%d bytes", merge.MaxRecordIDLen)
	}
	return nil
}

func sortMembers(m []jsonv.Member) {
	slices.SortFunc(m, func(a, b jsonv.Member) int { return strings.Compare(a.Key, b.Key) })
}

func microTime(us int64) time.Time { return time.UnixMicro(us) }

// otherStore is the problem of a request for store id that is not the
// store user's name now holds (current, "" if none). It says only what
// the server knows: an id it holds under another name is that store; of
// an id it does not hold it cannot tell whether the store was deleted or
// the client synced it through another server or remote.
func (h *Handler) otherStore(ctx context.Context, user, name, id, current string) error {
	owner, idName, err := h.store.owner(ctx, id)
	if err != nil {
		return err
	}
	if owner != "" && owner != user {
		return &problemError{problemBody{Type: problemType("forbidden"), Title: "Not your store", Status: http.StatusForbidden,
			Detail: fmt.Sprintf("store %s belongs to another user: a token reaches only its own user's stores", id)}}
	}
	now := fmt.Sprintf("store %q is %s", name, current)
	if current == "" {
		now = fmt.Sprintf("there is no store %q", name)
	}
	detail := fmt.Sprintf("%s, and this server holds no store %s, the one this client syncs with: it was deleted, or the client synced it through another server or remote", now, id)
	if owner != "" {
		detail = fmt.Sprintf("%s, but this client syncs with store %q (%s)", now, idName, id)
	}
	return &problemError{problemBody{Type: problemType("store-replaced"), Title: "Store replaced", Status: http.StatusConflict, Detail: detail}}
}

// state reads a record's state, as a joining engine sends it:
// {"data": {...}, "clock": {...}, "deleted": bool}, checked as a device
// checks a snapshot's records.
func (a *pushApplier) state(field string, v jsonv.Value) (*merge.Node, error) {
	data, okD := v.Get("data")
	clock, okC := v.Get("clock")
	del, okX := v.Get("deleted")
	switch {
	case !v.IsObject() || len(v.Members) != 3 || !okD || !okC || !okX:
		return nil, badField(field, `must be {"data": {...}, "clock": {...}, "deleted": true or false}`)
	case !data.IsObject() || !clock.IsObject():
		return nil, badField(field, "data and clock must be objects")
	case string(del.Leaf) != "true" && string(del.Leaf) != "false":
		return nil, badField(field+".deleted", "must be true or false")
	}
	n, err := merge.DecodeState(data, jsonv.Encode(clock), string(del.Leaf) == "true")
	if err == nil {
		err = merge.CheckRecordClock(n, map[string]bool{})
	}
	if err != nil {
		return nil, badField(field, err.Error())
	}
	if v := n.Newest().Version; v > merge.VersionsAllowed(microTime(a.now)) {
		return nil, badField(field+".clock", fmt.Sprintf("version %d is ahead of the server's clock", v))
	}
	if int64(len(jsonv.Encode(data))) > a.h.opts.MaxRecordBytes {
		return nil, badField(field+".data", fmt.Sprintf("over the server's limit of %d bytes", a.h.opts.MaxRecordBytes))
	}
	a.maxVersion = max(a.maxVersion, n.Newest().Version)
	return n, nil
}

func applying(w merge.Write) func(*merge.Node) error {
	return func(n *merge.Node) error { n.Apply(w); return nil }
}

// stampedWrite applies an engine's write, unless the record holds another
// write under its stamp: then two databases sync under one device id (a
// copied database), and the push is refused whole, so that the device
// stamps its changes again under an id of its own.
func (a *pushApplier) stampedWrite(field string, w merge.Write) func(*merge.Node) error {
	return func(n *merge.Node) error {
		if n.Reuses(w) {
			return &problemError{problemBody{Type: problemType("stamp-reused"), Title: "Stamp reused", Status: http.StatusConflict,
				Detail: fmt.Sprintf("the store holds another write stamped (%d, %s): two databases sync under device id %s (a copied database); nothing of this push was applied, stamp its changes under a new device id",
					w.At.Version, w.At.Device, w.At.Device),
				Errors: []fieldError{{Field: field, Detail: "another write has this stamp"}}}}
		}
		n.Apply(w)
		return nil
	}
}
