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
	"time"
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

// DefaultMaxFileBytes bounds a file's size by default: the engine's
// default bound on a snapshot or merge file (Limits.MaxSnapshotSize). A
// file is kept in chunks, and streamed in and out: a large one costs the
// server no memory.
const DefaultMaxFileBytes = 16 << 30

// chunkBytes is the size of a stored chunk of a file.
const chunkBytes = 4 << 20

// abandonedAfter is how old the chunks of an upload that never completed
// (the server stopped during it) are when they are deleted.
const abandonedAfter = 24 * time.Hour

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

// storedFile is a row of sync_server_files.
type storedFile struct {
	upload string // its chunks' upload id
	size   int64
	sha256 string
}

// file returns a file of store id.
func (s *Store) file(ctx context.Context, id, name string) (storedFile, bool, error) {
	var f storedFile
	err := s.read.QueryRowContext(ctx, s.q(`SELECT upload_id, size, sha256 FROM sync_server_files WHERE store_id = $1 AND name = $2`), id, name).Scan(&f.upload, &f.size, &f.sha256)
	if errors.Is(err, sql.ErrNoRows) {
		return f, false, nil
	}
	return f, err == nil, err
}

// chunk returns the chunk seq of an upload, or nil if there is none (the
// file was deleted while it was read).
func (s *Store) chunk(ctx context.Context, upload string, seq int) ([]byte, error) {
	var data []byte
	err := s.read.QueryRowContext(ctx, s.q(`SELECT data FROM sync_server_chunks WHERE upload_id = $1 AND seq = $2`), upload, seq).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return data, err
}

// upload stores the content r yields as the chunks of a new upload,
// each in a write of its own (a long upload holds no lock), stamped with
// the time now gives as it is written, and returns the upload's id, size
// and hash and how many chunks it has. What it stored is deleted if it
// fails.
func (s *Store) upload(ctx context.Context, r io.Reader, now func() int64) (upload string, size int64, hash string, chunks int, err error) {
	upload = uuid.NewString()
	sum := sha256.New()
	buf := make([]byte, chunkBytes)
	for seq := 0; ; seq++ {
		n, rerr := fill(r, buf)
		if n > 0 {
			sum.Write(buf[:n])
			size += int64(n)
			if _, err := s.db.ExecContext(ctx, s.q(`INSERT INTO sync_server_chunks (upload_id, seq, data, created_us) VALUES ($1, $2, $3, $4)`), upload, seq, buf[:n], now()); err != nil {
				s.dropUpload(upload)
				return "", 0, "", 0, err
			}
			chunks++
		}
		if rerr == io.EOF {
			return upload, size, hex.EncodeToString(sum.Sum(nil)), chunks, nil
		}
		if rerr != nil {
			s.dropUpload(upload)
			return "", 0, "", 0, &bodyError{rerr}
		}
	}
}

// fill reads into buf until it is full or r ends. Unlike io.ReadFull it
// keeps r's own error: a body cut short (io.ErrUnexpectedEOF) is not its
// end (io.EOF).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// A bodyError is a request body that could not be read.
type bodyError struct{ err error }

func (e *bodyError) Error() string { return "reading the body: " + e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// dropUpload deletes the chunks of an upload that is no file's, even
// after the request's context ended.
func (s *Store) dropUpload(upload string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.db.ExecContext(ctx, s.q(`DELETE FROM sync_server_chunks WHERE upload_id = $1`), upload)
}

// errFileExists says that another file has the name.
var errFileExists = errors.New("file exists")

// errUploadSwept says that chunks of an upload were deleted before it
// was made a file (idle past abandonedAfter).
var errUploadSwept = errors.New("the upload's chunks were deleted as abandoned before it completed")

// putFile makes an upload of chunks chunks file name of store id, created
// at now (once its content is all stored: a device that lists the store
// while the upload runs lists it later, from no earlier than then),
// unless a file of that name exists. A file of that name with the same
// content is taken as this one, sent again after its answer was lost:
// created is then false. The upload is the file's only when created.
func (s *Store) putFile(ctx context.Context, id, name, upload string, size int64, hash string, chunks int, now int64) (created bool, err error) {
	var have int
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT count(*) FROM sync_server_chunks WHERE upload_id = $1`), upload).Scan(&have); err != nil {
		return false, err
	}
	if have != chunks {
		return false, errUploadSwept
	}
	res, err := s.db.ExecContext(ctx, s.q(`INSERT INTO sync_server_files (store_id, name, upload_id, size, sha256, created_us)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (store_id, name) DO NOTHING`), id, name, upload, size, hash, now)
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

// deleteFile deletes a file of store id and its chunks.
func (s *Store) deleteFile(ctx context.Context, id, name string) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var upload string
	err = tx.QueryRowContext(ctx, s.q(`DELETE FROM sync_server_files WHERE store_id = $1 AND name = $2 RETURNING upload_id`), id, name).Scan(&upload)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM sync_server_chunks WHERE upload_id = $1`), upload); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// sweepChunks deletes, at most once an hour per process, the chunks of
// uploads that are no file's and received no chunk for abandonedAfter:
// the server stopped while it received them, or the client went away. An
// upload that resumes after that finds chunks gone, and is refused (see
// putFile).
func (s *Store) sweepChunks(ctx context.Context, now int64) {
	if s.due(&s.chunks, time.Hour) {
		s.db.ExecContext(ctx, s.q(`DELETE FROM sync_server_chunks WHERE upload_id IN (
			SELECT c.upload_id FROM sync_server_chunks c GROUP BY c.upload_id HAVING max(c.created_us) < $1)
			AND NOT EXISTS (SELECT 1 FROM sync_server_files f WHERE f.upload_id = sync_server_chunks.upload_id)`), now-abandonedAfter.Microseconds())
	}
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
	var f storedFile
	found := false
	if id != "" {
		var err error
		if f, found, err = h.store.file(r.Context(), id, name); err != nil {
			h.fileFailed(w, r, err)
			return
		}
	}
	if !found {
		problem(w, r, http.StatusNotFound, "no-file", "No such file", fmt.Sprintf("store %q has no file %q", store, name))
		return
	}
	// The chunks stream one at a time. A file deleted meanwhile ends the
	// body short of its Content-Length, which the client sees.
	first, err := h.store.chunk(r.Context(), f.upload, 0)
	if err != nil {
		h.fileFailed(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.size, 10))
	w.Write(first)
	for seq, sent := 1, int64(len(first)); sent < f.size; seq++ {
		data, err := h.store.chunk(r.Context(), f.upload, seq)
		if err != nil || data == nil {
			info(r).err = fmt.Errorf("file %s deleted or unreadable while sent: %v", name, err)
			return
		}
		if _, err := w.Write(data); err != nil {
			return
		}
		sent += int64(len(data))
	}
}

func (h *Handler) putFile(w http.ResponseWriter, r *http.Request, user string) {
	if _, _, _, ok := h.fileRequest(w, r, user, true, false); !ok {
		return // a bad name, or a store of records: refused before the body is read
	}
	h.store.sweepChunks(r.Context(), h.opts.Now().UnixMicro())
	clock := func() int64 { return h.opts.Now().UnixMicro() }
	upload, size, hash, chunks, err := h.store.upload(r.Context(), http.MaxBytesReader(w, r.Body, h.opts.MaxFileBytes), clock)
	if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
		problem(w, r, http.StatusRequestEntityTooLarge, "file-too-large", "File too large",
			fmt.Sprintf("the file is over the server's limit of %d bytes (MaxFileBytes): raise it to at least the devices' Limits.MaxSnapshotSize (16 GiB by default), or lower theirs", mb.Limit))
		return
	}
	if be := (*bodyError)(nil); errors.As(err, &be) {
		info(r).err = err
		problem(w, r, http.StatusBadRequest, "body-unreadable", "Body unreadable", "the body could not be read; nothing was stored: send it again")
		return
	}
	if err != nil {
		h.fileFailed(w, r, err)
		return
	}
	store, id, name, ok := h.fileRequest(w, r, user, true, true)
	if !ok {
		h.store.dropUpload(upload)
		return
	}
	created, err := h.store.putFile(r.Context(), id, name, upload, size, hash, chunks, clock())
	if err == nil && !created || errors.Is(err, errFileExists) {
		// Not this upload's file. After another failure the insert may
		// have committed all the same: the chunks are left to the
		// sweep, which takes them only if they are no file's.
		h.store.dropUpload(upload)
	}
	if errors.Is(err, errUploadSwept) {
		problem(w, r, http.StatusServiceUnavailable, "upload-abandoned", "Upload abandoned",
			fmt.Sprintf("the upload was idle for over %v and its content was deleted; nothing was stored: send it again", abandonedAfter))
		return
	}
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
