package drivefake

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/api/drive/v3"
)

// quotaLimit is the storage limit about.get reports: the 15 GiB of a free
// account.
const quotaLimit = 15 << 30

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /drive/v3/about", s.handleAbout)
	mux.HandleFunc("GET /drive/v3/files", s.handleList)
	mux.HandleFunc("POST /drive/v3/files", s.handleCreate)
	mux.HandleFunc("GET /drive/v3/files/{fileId}", s.handleGet)
	mux.HandleFunc("PATCH /drive/v3/files/{fileId}", s.handleUpdate)
	mux.HandleFunc("DELETE /drive/v3/files/{fileId}", s.handleDelete)

	// Uploads. A resumable session's chunks come back to the same paths
	// with an upload_id, by POST (this client) or PUT (others).
	mux.HandleFunc("POST /upload/drive/v3/files", s.handleUploadCreate)
	mux.HandleFunc("PUT /upload/drive/v3/files", s.handleUploadChunk)
	mux.HandleFunc("PATCH /upload/drive/v3/files/{fileId}", s.handleUploadUpdate)
	mux.HandleFunc("POST /upload/drive/v3/files/{fileId}", s.handleUploadChunk)
	mux.HandleFunc("PUT /upload/drive/v3/files/{fileId}", s.handleUploadChunk)

	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.t.Logf("drivefake: %s %s is not part of the fake", r.Method, r.URL.Path)
		writeError(w, newError(http.StatusNotFound, "notFound", "drivefake: no such method: "+r.Method+" "+r.URL.Path))
	})
	return mux
}

// handleAbout serves about.get. Like Drive it insists on a fields
// parameter; it always returns the user and the storage quota.
func (s *Server) handleAbout(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("fields") == "" {
		writeError(w, newError(http.StatusBadRequest, "required",
			"The 'fields' parameter is required for this method.").at("fields"))
		return
	}
	s.mu.Lock()
	user := s.user
	var usage, trash int64
	for _, f := range s.files {
		usage += int64(len(f.content))
		if s.isTrashed(f) {
			trash += int64(len(f.content))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, &drive.About{
		Kind: "drive#about",
		User: &user,
		StorageQuota: &drive.AboutStorageQuota{
			Limit:             quotaLimit,
			Usage:             usage,
			UsageInDrive:      usage,
			UsageInDriveTrash: trash,
		},
	})
}

// handleGet serves files.get, with alt=media for the content.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("fileId")
	s.mu.Lock()
	defer s.mu.Unlock()

	if folder, ok := specialFolder(id); ok {
		if r.URL.Query().Get("alt") == "media" {
			writeError(w, notDownloadable())
			return
		}
		writeJSON(w, http.StatusOK, folder)
		return
	}
	f := s.files[id]
	if f == nil {
		writeError(w, notFound(id))
		return
	}
	if r.URL.Query().Get("alt") != "media" {
		writeJSON(w, http.StatusOK, s.resource(f))
		return
	}
	if f.mimeType == FolderMimeType {
		writeError(w, notDownloadable())
		return
	}
	w.Header().Set("Content-Type", f.mimeType)
	w.Header().Set("Content-Length", strconv.Itoa(len(f.content)))
	w.WriteHeader(http.StatusOK)
	w.Write(f.content)
}

func notDownloadable() *apiError {
	return newError(http.StatusForbidden, "fileNotDownloadable",
		"Only files with binary content can be downloaded. Use Export with Docs Editors files.").at("alt")
}

// specialFolder returns the resource of My Drive's root or of the
// application data folder, by alias or id.
func specialFolder(id string) (*drive.File, bool) {
	switch resolveAlias(id) {
	case RootID:
		return &drive.File{Kind: "drive#file", Id: RootID, Name: "My Drive", MimeType: FolderMimeType, Spaces: []string{SpaceDrive}}, true
	case AppDataFolderID:
		return &drive.File{Kind: "drive#file", Id: AppDataFolderID, Name: "Application Data", MimeType: FolderMimeType, Spaces: []string{SpaceAppData}}, true
	}
	return nil, false
}

// handleDelete serves files.delete: the file, and a folder's descendants,
// are gone for good.
func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("fileId")
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := specialFolder(id); ok {
		writeError(w, newError(http.StatusForbidden, "insufficientFilePermissions",
			"The user does not have sufficient permissions for this file."))
		return
	}
	f := s.files[id]
	if f == nil {
		writeError(w, notFound(id))
		return
	}
	s.deleteTree(f.id)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) deleteTree(id string) {
	delete(s.files, id)
	for _, c := range s.files {
		if c.parent == id {
			s.deleteTree(c.id)
		}
	}
}

// metadata is the file metadata a client sends to files.create and
// files.update. Pointers tell a field that was left out from one set to
// its zero value (the client sends "trashed": false only when asked to).
type metadata struct {
	Name          *string            `json:"name"`
	MimeType      *string            `json:"mimeType"`
	Description   *string            `json:"description"`
	Parents       []string           `json:"parents"`
	Trashed       *bool              `json:"trashed"`
	ModifiedTime  *string            `json:"modifiedTime"`
	AppProperties map[string]*string `json:"appProperties"`
	Properties    map[string]*string `json:"properties"`
}

// readMetadata decodes a JSON metadata body; an empty body is no metadata.
func readMetadata(r io.Reader) (*metadata, *apiError) {
	var m metadata
	if err := json.NewDecoder(r).Decode(&m); err != nil && err != io.EOF {
		return nil, badRequest("drivefake: bad metadata: %v", err)
	}
	return &m, nil
}

// handleCreate serves files.create without media: folders and empty files.
func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "" && ct != "application/json" {
		writeError(w, badRequest("drivefake: files.create without upload takes a JSON body, not %s", ct))
		return
	}
	m, e := readMetadata(r.Body)
	if e != nil {
		writeError(w, e)
		return
	}
	s.create(w, m, nil, "")
}

// create stores a new file and answers with its resource. media is nil for
// a metadata-only create; mediaType is the media's Content-Type.
func (s *Server) create(w http.ResponseWriter, m *metadata, media []byte, mediaType string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, e := s.createLocked(m, media, mediaType)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.resource(f))
}

func (s *Server) createLocked(m *metadata, media []byte, mediaType string) (*file, *apiError) {
	parent := RootID
	switch len(m.Parents) {
	case 0:
	case 1:
		parent = resolveAlias(m.Parents[0])
	default:
		return nil, newError(http.StatusForbidden, "cannotAddParent", "Increasing the number of parents is not allowed.")
	}
	space, e := s.spaceOf(parent)
	if e != nil {
		return nil, e
	}
	now := s.clockLocked()
	s.seq++
	f := &file{
		id:          newID(),
		name:        "Untitled",
		mimeType:    "application/octet-stream",
		parent:      parent,
		space:       space,
		created:     now,
		modified:    now,
		version:     1,
		seq:         s.seq,
		hiddenLists: s.lag,
	}
	if mt, _, err := mime.ParseMediaType(mediaType); err == nil {
		f.mimeType = mt
	}
	if e := s.applyLocked(f, m, now); e != nil {
		return nil, e
	}
	if f.trashed && f.space == SpaceAppData {
		return nil, appDataNotSupported()
	}
	if f.mimeType == FolderMimeType {
		if media != nil {
			return nil, badRequest("drivefake: a folder cannot have content")
		}
	} else {
		setContent(f, media)
	}
	s.files[f.id] = f
	return f, nil
}

// spaceOf returns the space of the folder id, which must exist. As on
// Drive, a parent that was deleted is not found (404 notFound), so nothing
// can be created or moved into it, while a trashed folder is a parent like
// any other: what is created in it is trashed with it.
func (s *Server) spaceOf(folderID string) (string, *apiError) {
	switch folderID {
	case RootID:
		return SpaceDrive, nil
	case AppDataFolderID:
		return SpaceAppData, nil
	}
	p := s.files[folderID]
	if p == nil {
		return "", notFound(folderID)
	}
	if p.mimeType != FolderMimeType {
		return "", badRequest("The specified parent is not a folder.")
	}
	return p.space, nil
}

func setContent(f *file, content []byte) {
	if content == nil {
		content = []byte{}
	}
	sum := md5.Sum(content)
	f.content = content
	f.md5 = hex.EncodeToString(sum[:])
}

// applyLocked applies the metadata fields a client may set (except
// parents, which only create takes) to f.
func (s *Server) applyLocked(f *file, m *metadata, now time.Time) *apiError {
	if m.Name != nil {
		f.name = *m.Name
	}
	if m.MimeType != nil && *m.MimeType != "" {
		f.mimeType = *m.MimeType
	}
	if m.Description != nil {
		f.description = *m.Description
	}
	if m.Trashed != nil {
		f.trashed = *m.Trashed
	}
	f.appProperties = mergeProperties(f.appProperties, m.AppProperties)
	f.properties = mergeProperties(f.properties, m.Properties)
	if m.ModifiedTime != nil {
		t, err := time.Parse(time.RFC3339Nano, *m.ModifiedTime)
		if err != nil {
			return invalid("modifiedTime")
		}
		f.modified = t.UTC().Truncate(time.Millisecond)
	}
	return nil
}

// mergeProperties applies a properties patch the way Drive does: keys are
// set one by one and a null value removes a key.
func mergeProperties(old map[string]string, patch map[string]*string) map[string]string {
	if len(patch) == 0 {
		return old
	}
	m := maps.Clone(old)
	if m == nil {
		m = make(map[string]string)
	}
	for k, v := range patch {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = *v
		}
	}
	return m
}

// appDataNotSupported is Drive's refusal of an operation that files in the
// application data folder do not support, such as trashing them: they can
// only be deleted. The body is the one Drive sends for other such
// operations (e.g. creating a Google Sheet there).
func appDataNotSupported() *apiError {
	return newError(http.StatusForbidden, "notSupportedForAppDataFolderFiles",
		"Method not supported for files within the Application Data folder.")
}

// handleUpdate serves files.update without media.
func (s *Server) handleUpdate(w http.ResponseWriter, r *http.Request) {
	m, e := readMetadata(r.Body)
	if e != nil {
		writeError(w, e)
		return
	}
	s.update(w, r.PathValue("fileId"), r.URL.Query(), m, nil, "")
}

// update changes file id and answers with its resource. params is the
// query of the request, for addParents and removeParents; media is the new
// content, or nil to keep the old one.
func (s *Server) update(w http.ResponseWriter, id string, params url.Values, m *metadata, media []byte, mediaType string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, e := s.updateLocked(id, params, m, media, mediaType)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.resource(f))
}

func (s *Server) updateLocked(id string, params url.Values, m *metadata, media []byte, mediaType string) (*file, *apiError) {
	if _, ok := specialFolder(id); ok {
		return nil, newError(http.StatusForbidden, "insufficientFilePermissions",
			"The user does not have sufficient permissions for this file.")
	}
	old := s.files[id]
	if old == nil {
		return nil, notFound(id)
	}
	if len(m.Parents) > 0 {
		return nil, newError(http.StatusForbidden, "fieldNotWritable",
			"The parents field is not directly writable in update requests. Use the addParents and removeParents parameters instead.")
	}
	if m.Trashed != nil && *m.Trashed && old.space == SpaceAppData {
		return nil, appDataNotSupported()
	}

	// Work on a copy, so that a failed update changes nothing.
	f := *old
	now := s.clockLocked()
	if e := s.move(&f, params); e != nil {
		return nil, e
	}
	if e := s.applyLocked(&f, m, now); e != nil {
		return nil, e
	}
	if media != nil {
		if f.mimeType == FolderMimeType {
			return nil, badRequest("drivefake: a folder cannot have content")
		}
		setContent(&f, media)
		if mt, _, err := mime.ParseMediaType(mediaType); err == nil && m.MimeType == nil {
			f.mimeType = mt
		}
	}
	if m.ModifiedTime == nil && (media != nil || f.name != old.name || f.parent != old.parent) {
		f.modified = now
	}
	f.version++
	*old = f
	return old, nil
}

// move applies the addParents and removeParents parameters of files.update.
func (s *Server) move(f *file, params url.Values) *apiError {
	add, remove := params.Get("addParents"), params.Get("removeParents")
	if add == "" && remove == "" {
		return nil
	}
	if remove != "" && resolveAlias(remove) != f.parent {
		return badRequest("drivefake: removeParents %q is not a parent of %s", remove, f.id)
	}
	if add == "" {
		return newError(http.StatusForbidden, "cannotRemoveParent", "drivefake: a file must keep one parent")
	}
	if remove == "" {
		return newError(http.StatusForbidden, "cannotAddParent", "Increasing the number of parents is not allowed.")
	}
	to := resolveAlias(add)
	space, e := s.spaceOf(to)
	if e != nil {
		return e
	}
	if space != f.space {
		return newError(http.StatusForbidden, "cannotMoveAcrossSpaces",
			fmt.Sprintf("drivefake: cannot move %s from space %s to %s", f.id, f.space, space))
	}
	for p := to; p != RootID && p != AppDataFolderID; p = s.files[p].parent {
		if p == f.id {
			return badRequest("drivefake: moving %s into %s would make a cycle", f.id, to)
		}
	}
	f.parent = to
	return nil
}

// isTrashed reports whether f or one of its ancestors was trashed.
func (s *Server) isTrashed(f *file) bool {
	for ; f != nil; f = s.files[f.parent] {
		if f.trashed {
			return true
		}
	}
	return false
}

// resource returns the Drive resource of f, with every field this fake
// knows about; the fields parameter is not applied.
func (s *Server) resource(f *file) *drive.File {
	d := &drive.File{
		Kind:              "drive#file",
		Id:                f.id,
		Name:              f.name,
		MimeType:          f.mimeType,
		Description:       f.description,
		Parents:           []string{f.parent},
		Spaces:            []string{f.space},
		CreatedTime:       formatTime(f.created),
		ModifiedTime:      formatTime(f.modified),
		Trashed:           s.isTrashed(f),
		ExplicitlyTrashed: f.trashed,
		AppProperties:     maps.Clone(f.appProperties),
		Properties:        maps.Clone(f.properties),
		Version:           f.version,
		OwnedByMe:         true,
	}
	if f.mimeType != FolderMimeType {
		d.Size = int64(len(f.content))
		d.Md5Checksum = f.md5
		d.QuotaBytesUsed = int64(len(f.content))
	}
	return d
}

// formatTime formats t the way Drive does: RFC 3339 in UTC with
// milliseconds, e.g. "2026-01-02T15:04:05.000Z".
func formatTime(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// queryFileOf returns what a search query sees of f.
func (s *Server) queryFileOf(f *file) *queryFile {
	return &queryFile{
		name:     f.name,
		mimeType: f.mimeType,
		parents:  []string{f.parent},
		trashed:  s.isTrashed(f),
		created:  f.created,
		modified: f.modified,
	}
}

// isSpace reports whether name is a space a list may search.
func isSpace(name string) bool {
	return name == SpaceDrive || name == SpaceAppData
}

// splitList splits a comma-separated parameter, dropping blanks.
func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
