package syncserver

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/drivesync/drivesync/internal/merge"
)

// A pull returns the records of a store written after a time, oldest
// first, a page at a time:
//
//	GET /sync/pull?store=NAME&since=<time>&limit=<n>&view=rows
//	{"changes": {"<table>": [<row>, ...]}, "nextCursor": "<time>" or null,
//	 "server_time": "<time>", "store": "<store id>",
//	 "limits": {"max_record_bytes": n, "max_body_bytes": n}}
//
// Without since, it returns every record: the initial snapshot. While
// nextCursor is not null, more records follow: pull again with since set
// to it. After the last page, keep server_time as the next pull's since:
// every write after it is stamped later. Deleted records come as rows
// whose deleted_at is set (soft deletes), with their last fields.
//
// A row (view=rows, the default) is {"id": ..., <field>: <value>, ...,
// "updated_at": ..., "deleted_at": ...}: the record's fields, with the
// server's times. With view=drivesync a row carries instead, in a member
// "drivesync", the record's merge state (data, clock and deleted), which
// the drivesync engine merges.
func (h *Handler) pull(w http.ResponseWriter, r *http.Request, user string) {
	name, perr := storeName(r)
	if perr != nil {
		writeProblem(w, r, perr.p)
		return
	}
	info(r).store = name
	q := r.URL.Query()
	since := int64(-1)
	if s := q.Get("since"); s != "" {
		t, err := parseTime(s)
		if err != nil {
			writeProblem(w, r, badField("since", err.Error()).p)
			return
		}
		since = t
	}
	limit := DefaultPullLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxPullLimit {
			writeProblem(w, r, badField("limit", "must be an integer from 1 to "+strconv.Itoa(MaxPullLimit)).p)
			return
		}
		limit = n
	}
	view := q.Get("view")
	if view != "" && view != "rows" && view != "drivesync" {
		writeProblem(w, r, badField("view", `must be "rows" or "drivesync"`).p)
		return
	}
	pg, err := h.store.pull(r.Context(), user, name, since, limit, pageBytes)
	if pe := (*problemError)(nil); errors.As(err, &pe) {
		writeProblem(w, r, pe.p)
		return
	}
	if err != nil {
		info(r).err = err
		problem(w, r, http.StatusServiceUnavailable, "unavailable", "Pull failed", "the server could not read its database; pull again later")
		return
	}
	if id := q.Get("store_id"); id != "" && id != pg.store.id {
		var pe *problemError
		if err := h.otherStore(r.Context(), user, name, id, pg.store.id); !errors.As(err, &pe) {
			info(r).err = err
			problem(w, r, http.StatusServiceUnavailable, "unavailable", "Pull failed", "the server could not read its database; pull again later")
		} else {
			writeProblem(w, r, pe.p)
		}
		return
	}
	b := []byte(`{"changes":{`)
	// Rows grouped by table, each table's in the order they were written.
	var tables []string
	byTable := map[string][]record{}
	for _, rec := range pg.records {
		if _, ok := byTable[rec.table]; !ok {
			tables = append(tables, rec.table)
		}
		byTable[rec.table] = append(byTable[rec.table], rec)
	}
	for i, t := range tables {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, t)
		b = append(b, ":["...)
		for j, rec := range byTable[t] {
			if j > 0 {
				b = append(b, ',')
			}
			if b, err = appendRow(b, rec, view == "drivesync", h.partBytes()); err != nil {
				info(r).err = err
				problem(w, r, http.StatusInternalServerError, "corrupt-record", "Stored record unreadable", "a stored record of this store cannot be read: "+err.Error())
				return
			}
		}
		b = append(b, ']')
	}
	b = append(b, `},"nextCursor":`...)
	if pg.more {
		b = append(b, '"')
		b = append(b, formatMicros(pg.records[len(pg.records)-1].updated)...)
		b = append(b, '"')
	} else {
		b = append(b, "null"...)
	}
	// The store's clock: every write up to it is in this page or before
	// the cursor, and every later write is stamped after it, whatever
	// the clocks of the server processes say. A store without writes
	// has the clock's start, 1970-01-01T00:00:00Z.
	serverTime := pg.store.last
	b = append(b, `,"server_time":"`...)
	b = append(b, formatMicros(serverTime)...)
	b = append(b, `","store":`...)
	if pg.found {
		b = jsonv.AppendString(b, pg.store.id)
	} else {
		b = append(b, "null"...)
	}
	// features: what an engine may send besides the first protocol's
	// members ("seen" lists, see seen.go).
	b = fmt.Appendf(b, `,"limits":{"max_record_bytes":%d,"max_body_bytes":%d},"features":["seen"]}`+"\n", h.opts.MaxRecordBytes, h.opts.MaxBodyBytes)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

// rowKeys are the members of a row that the server sets, and that a
// record's fields of the same names cannot override.
var rowKeys = map[string]bool{"id": true, "updated_at": true, "deleted_at": true, "drivesync": true}

// appendRow appends rec as a row, or as several rows of the same id when
// its state is over partBytes: a record merged from many writes may grow
// past what one write may hold, and a device takes states up to that
// size. Each part is the record's root with some of its members; merged,
// the parts give the whole state.
func appendRow(b []byte, rec record, state bool, partBytes int64) ([]byte, error) {
	if state && (int64(len(rec.data)) > partBytes || int64(len(rec.clock)) > 2*partBytes) {
		parts, err := merge.StateParts([]byte(rec.data), []byte(rec.clock), rec.deleted, partBytes, false)
		if err != nil {
			// A value over partBytes, written under a larger limit
			// than the server has now: parts of the largest size a
			// device takes. A value over even that (a server whose
			// limit is over the default took it) goes whole, and a
			// device reports it refused.
			if parts, err = merge.StateParts([]byte(rec.data), []byte(rec.clock), rec.deleted, DefaultMaxRecordBytes, false); err != nil {
				parts = nil
			}
		}
		for i, p := range parts {
			part := rec
			part.data, part.clock = merge.EncodeState(p)
			if i > 0 {
				b = append(b, ',')
			}
			b, _ = appendOne(b, part, true)
		}
		if len(parts) > 0 {
			return b, nil
		}
	}
	return appendOne(b, rec, state)
}

// appendOne appends rec as one row.
func appendOne(b []byte, rec record, state bool) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = jsonv.AppendString(b, rec.id)
	if state {
		b = append(b, `,"drivesync":{"data":`...)
		b = append(b, rec.data...)
		b = append(b, `,"clock":`...)
		b = append(b, rec.clock...)
		b = append(b, `,"deleted":`...)
		b = strconv.AppendBool(b, rec.deleted)
		if rec.seen != "" {
			b = append(b, `,"seen":`...)
			b = append(b, rec.seen...)
		}
		b = append(b, '}')
	} else {
		data, err := jsonv.ParseObject([]byte(rec.data), jsonv.Options{})
		if err != nil {
			return b, err
		}
		for _, m := range data.Members {
			if rowKeys[m.Key] {
				continue
			}
			b = append(b, ',')
			b = jsonv.AppendString(b, m.Key)
			b = append(b, ':')
			b = jsonv.Append(b, m.Value)
		}
	}
	b = append(b, `,"updated_at":"`...)
	b = append(b, formatMicros(rec.updated)...)
	b = append(b, `","deleted_at":`...)
	if rec.deleted {
		b = append(b, '"')
		b = append(b, formatMicros(rec.deletedAt)...)
		b = append(b, '"')
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}'), nil
}
