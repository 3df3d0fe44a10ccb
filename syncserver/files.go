package syncserver

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/drivesync/drivesync/internal/jsonv"
	"github.com/google/uuid"
)

// A store keeps records or files. Records are what push and pull carry:
// the server reads and merges them. Files are for devices whose data the
// server must not read (an encrypted store): the server keeps the files
// the devices write, sealed, and the devices merge them, as they do on a
// shared folder. A store's kind is fixed when it is made, by the first
// push (records) or the first file written (files); a request of the
// other kind is refused, so that a device without the store's key never
// takes an empty records store for its data.
//
//	GET    /sync/files?store=NAME&since=<time>   {"files": [{"name": ..., "size": n}], "server_time": ..., "store": ...}
//	GET    /sync/file?store=NAME&name=<name>     the file's bytes
//	PUT    /sync/file?store=NAME&name=<name>     stores the body, unless the name is taken
//	DELETE /sync/file?store=NAME&name=<name>
//	GET    /sync/time                            {"server_time": ...}
const (
	kindRecords = "records"
	kindFiles   = "files"
)

// DefaultMaxFileBytes bounds a file's size by default: above the engine's
// default limit on a patch file (64 MiB) and what sealing adds to it.
const DefaultMaxFileBytes = 80 << 20

// wrongKind is the problem of a request of one kind to a store of the
// other (kind is the store's).
func wrongKind(name, kind string) *problemError {
	if kind == kindFiles {
		return &problemError{problemBody{Type: problemType("files-store"), Title: "Store keeps files", Status: http.StatusConflict,
			Detail: fmt.Sprintf("store %q keeps files that its devices seal and merge themselves (an encrypted store), not records: sync it with the store's key set (drivesync Config.Encryption), or push and pull records in a store of another name", name)}}
	}
	return &problemError{problemBody{Type: problemType("records-store"), Title: "Store keeps records", Status: http.StatusConflict,
		Detail: fmt.Sprintf("store %q keeps records that the server merges, synced without a key: it cannot keep files. To encrypt, sync with a key in a store of another name (and join it from each device)", name)}}
}

// checkFileName reports why name cannot name a file: the rules of the
// engine's file names, which every storage it syncs through keeps.
func checkFileName(name string) *problemError {
	bad := func(why string) *problemError { return badField("name", why) }
	switch {
	case name == "":
		return bad("missing: name the file")
	case len(name) > 1024:
		return bad("over 1024 bytes")
	case !utf8.ValidString(name):
		return bad("not UTF-8")
	case name[0] == '/' || strings.ContainsAny(name, "\\\x00"):
		return bad("a name is relative, separated by /, without backslashes or NUL")
	}
	for elem := range strings.SplitSeq(name, "/") {
		if elem == "" || elem[0] == '.' {
			return bad(`has an empty element or one starting with "."`)
		}
	}
	return nil
}

// fileStore returns the id of owner's store name, which keeps files,
// making it when create is set; "" when there is none.
func (s *Store) fileStore(ctx context.Context, owner, name string, now int64, create bool) (string, error) {
	db := s.read
	if create {
		db = s.db
		if _, err := db.ExecContext(ctx, s.q(`INSERT INTO sync_server_stores (id, owner, name, created_us, last_us, max_version, kind)
			VALUES ($1, $2, $3, $4, 0, 0, $5) ON CONFLICT (owner, name) DO NOTHING`), uuid.NewString(), owner, name, now, kindFiles); err != nil {
			return "", err
		}
	}
	var id, kind string
	err := db.QueryRowContext(ctx, s.q(`SELECT id, kind FROM sync_server_stores WHERE owner = $1 AND name = $2`), owner, name).Scan(&id, &kind)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", nil
	case err != nil:
		return "", err
	case kind != kindFiles:
		return "", wrongKind(name, kind)
	}
	return id, nil
}

type fileInfo struct {
	name string
	size int64
}

// listFiles returns the files of store id created at or after since.
func (s *Store) listFiles(ctx context.Context, id string, since int64) ([]fileInfo, error) {
	rows, err := s.read.QueryContext(ctx, s.q(`SELECT name, size FROM sync_server_files WHERE store_id = $1 AND created_us >= $2 ORDER BY name`), id, since)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var files []fileInfo
	for rows.Next() {
		var f fileInfo
		if err := rows.Scan(&f.name, &f.size); err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, rows.Err()
}

// getFile returns the content of a file of store id.
func (s *Store) getFile(ctx context.Context, id, name string) ([]byte, bool, error) {
	var data []byte
	err := s.read.QueryRowContext(ctx, s.q(`SELECT data FROM sync_server_files WHERE store_id = $1 AND name = $2`), id, name).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	return data, err == nil, err
}

// errFileExists says that another file has the name.
var errFileExists = errors.New("file exists")

// putFile creates a file of store id unless one of that name exists. A
// file of that name with the same content is taken as this one, sent
// again after its answer was lost: created is then false.
func (s *Store) putFile(ctx context.Context, id, name string, data []byte, now int64) (created bool, err error) {
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO sync_server_files (store_id, name, data, size, sha256, created_us)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (store_id, name) DO NOTHING`), id, name, data, len(data), hash, now)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err == nil, err
	}
	var stored string
	err = s.db.QueryRowContext(ctx, s.q(`SELECT sha256 FROM sync_server_files WHERE store_id = $1 AND name = $2`), id, name).Scan(&stored)
	switch {
	case errors.Is(err, sql.ErrNoRows): // deleted in between: it was there
		return false, errFileExists
	case err != nil:
		return false, err
	case stored != hash:
		return false, errFileExists
	}
	return false, nil
}

// deleteFile deletes a file of store id.
func (s *Store) deleteFile(ctx context.Context, id, name string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM sync_server_files WHERE store_id = $1 AND name = $2`), id, name)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n > 0, err
}

// fileRequest reads a file request's store and, for one file, its name,
// and finds the store. It writes the problem and returns ok false when
// the request cannot go on.
func (h *Handler) fileRequest(w http.ResponseWriter, r *http.Request, user string, oneFile, create bool) (store, id, file string, ok bool) {
	store, perr := storeName(r)
	if perr == nil && oneFile {
		file = r.URL.Query().Get("name")
		perr = checkFileName(file)
	}
	if perr != nil {
		writeProblem(w, r, perr.p)
		return "", "", "", false
	}
	info(r).store = store
	id, err := h.store.fileStore(r.Context(), user, store, h.opts.Now().UnixMicro(), create)
	if err != nil {
		h.fileFailed(w, r, err)
		return "", "", "", false
	}
	return store, id, file, true
}

// fileFailed answers a file request that failed with err.
func (h *Handler) fileFailed(w http.ResponseWriter, r *http.Request, err error) {
	var pe *problemError
	if errors.As(err, &pe) {
		writeProblem(w, r, pe.p)
		return
	}
	info(r).err = err
	problem(w, r, http.StatusServiceUnavailable, "unavailable", "Database unavailable", "the server could not use its database; nothing was changed: try again later")
}

func (h *Handler) listFiles(w http.ResponseWriter, r *http.Request, user string) {
	since := int64(0)
	if s := r.URL.Query().Get("since"); s != "" {
		t, err := parseTime(s)
		if err != nil {
			writeProblem(w, r, badField("since", err.Error()).p)
			return
		}
		since = t
	}
	_, id, _, ok := h.fileRequest(w, r, user, false, false)
	if !ok {
		return
	}
	now := h.opts.Now().UnixMicro()
	var files []fileInfo
	if id != "" {
		var err error
		if files, err = h.store.listFiles(r.Context(), id, since); err != nil {
			h.fileFailed(w, r, err)
			return
		}
	}
	b := []byte(`{"files":[`)
	for i, f := range files {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(append(b, `{"name":`...), f.name)
		b = strconv.AppendInt(append(b, `,"size":`...), f.size, 10)
		b = append(b, '}')
	}
	b = append(b, `],"server_time":"`...)
	b = append(b, formatMicros(now)...)
	b = append(b, `","store":`...)
	if id != "" {
		b = jsonv.AppendString(b, id)
	} else {
		b = append(b, "null"...)
	}
	writeJSON(w, http.StatusOK, append(b, "}\n"...))
}

func (h *Handler) getFile(w http.ResponseWriter, r *http.Request, user string) {
	store, id, name, ok := h.fileRequest(w, r, user, true, false)
	if !ok {
		return
	}
	var data []byte
	found := false
	if id != "" {
		var err error
		if data, found, err = h.store.getFile(r.Context(), id, name); err != nil {
			h.fileFailed(w, r, err)
			return
		}
	}
	if !found {
		problem(w, r, http.StatusNotFound, "no-file", "No such file", fmt.Sprintf("store %q has no file %q", store, name))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Write(data)
}

func (h *Handler) putFile(w http.ResponseWriter, r *http.Request, user string) {
	if _, _, _, ok := h.fileRequest(w, r, user, true, false); !ok {
		return // a bad name, or a store of records: refused before the body is read
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxFileBytes))
	if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
		problem(w, r, http.StatusRequestEntityTooLarge, "file-too-large", "File too large",
			fmt.Sprintf("the file is over the server's limit of %d bytes: set the devices' Limits.MaxFileSize below it, or raise the server's", mb.Limit))
		return
	}
	if err != nil {
		info(r).err = err
		problem(w, r, http.StatusBadRequest, "body-unreadable", "Body unreadable", "the body could not be read; nothing was stored: send it again")
		return
	}
	store, id, name, ok := h.fileRequest(w, r, user, true, true)
	if !ok {
		return
	}
	created, err := h.store.putFile(r.Context(), id, name, data, h.opts.Now().UnixMicro())
	if errors.Is(err, errFileExists) {
		problem(w, r, http.StatusPreconditionFailed, "file-exists", "File exists",
			fmt.Sprintf("store %q has another file named %q: files are never replaced; write this one under another name", store, name))
		return
	}
	if err != nil {
		h.fileFailed(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fmt.Appendf(nil, `{"created":%t}`+"\n", created))
}

func (h *Handler) deleteFile(w http.ResponseWriter, r *http.Request, user string) {
	_, id, name, ok := h.fileRequest(w, r, user, true, false)
	if !ok {
		return
	}
	deleted := false
	if id != "" {
		var err error
		if deleted, err = h.store.deleteFile(r.Context(), id, name); err != nil {
			h.fileFailed(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, fmt.Appendf(nil, `{"deleted":%t}`+"\n", deleted))
}

// serverTime answers with the server's clock, which names a device's
// files: devices whose clocks disagree still order them as the server
// saw them.
func (h *Handler) serverTime(w http.ResponseWriter, r *http.Request, user string) {
	writeJSON(w, http.StatusOK, []byte(`{"server_time":"`+formatMicros(h.opts.Now().UnixMicro())+`"}`+"\n"))
}

func writeJSON(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}
