package drivefake

import (
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Uploads. The client picks the protocol from the size of the media:
//
//   - media that fits in one chunk (googleapi.ChunkSize, 16 MiB by
//     default) goes in a single multipart/related request, uploadType=
//     multipart: a JSON metadata part, then the media part;
//   - bigger media starts a resumable session, uploadType=resumable: the
//     first request carries the metadata as JSON and the media type in
//     X-Upload-Content-Type, the answer's Location header names the
//     session, and the client then POSTs the media there chunk by chunk,
//     each with a Content-Range. It sends X-GUploader-No-308, asking for
//     "308 Resume Incomplete" to come as 200 with the header
//     X-Http-Status-Code-Override: 308.
//
// Simple uploads (uploadType=media) are not used by the client for files
// with metadata and are refused.

// An uploadSession is a resumable upload in progress.
type uploadSession struct {
	fileID    string     // the file to update, or "" to create one
	params    url.Values // the query of the request that opened it
	meta      *metadata
	mediaType string
	data      []byte
}

// handleUploadCreate serves files.create with media.
func (s *Server) handleUploadCreate(w http.ResponseWriter, r *http.Request) {
	s.handleUpload(w, r, "")
}

// handleUploadUpdate serves files.update with media.
func (s *Server) handleUploadUpdate(w http.ResponseWriter, r *http.Request) {
	s.handleUpload(w, r, r.PathValue("fileId"))
}

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request, fileID string) {
	params := r.URL.Query()
	if params.Get("upload_id") != "" {
		s.handleUploadChunk(w, r)
		return
	}
	switch params.Get("uploadType") {
	case "multipart":
		m, media, mediaType, e := readMultipart(r)
		if e != nil {
			writeError(w, e)
			return
		}
		if fileID == "" {
			s.create(w, m, media, mediaType)
		} else {
			s.update(w, fileID, params, m, media, mediaType)
		}

	case "resumable":
		m, e := readMetadata(r.Body)
		if e != nil {
			writeError(w, e)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.files[fileID]; fileID != "" && !ok {
			writeError(w, notFound(fileID))
			return
		}
		id := newID()
		s.uploads[id] = &uploadSession{
			fileID:    fileID,
			params:    params,
			meta:      m,
			mediaType: r.Header.Get("X-Upload-Content-Type"),
		}
		w.Header().Set("Location", s.URL+r.URL.Path+"?uploadType=resumable&upload_id="+id)
		w.WriteHeader(http.StatusOK)

	default:
		writeError(w, invalid("uploadType"))
	}
}

// readMultipart splits a multipart/related upload into its metadata and its
// media.
func readMultipart(r *http.Request) (m *metadata, media []byte, mediaType string, e *apiError) {
	ct, ctParams, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || ct != "multipart/related" || ctParams["boundary"] == "" {
		return nil, nil, "", badRequest("drivefake: a multipart upload needs a multipart/related body, got %q", r.Header.Get("Content-Type"))
	}
	mr := multipart.NewReader(r.Body, ctParams["boundary"])
	part, err := mr.NextPart()
	if err != nil {
		return nil, nil, "", badRequest("drivefake: multipart upload without a metadata part: %v", err)
	}
	if m, e = readMetadata(part); e != nil {
		return nil, nil, "", e
	}
	part, err = mr.NextPart()
	if err != nil {
		return nil, nil, "", badRequest("drivefake: multipart upload without a media part: %v", err)
	}
	if media, err = io.ReadAll(part); err != nil {
		return nil, nil, "", badRequest("drivefake: reading the media part: %v", err)
	}
	return m, media, part.Header.Get("Content-Type"), nil
}

// handleUploadChunk receives one chunk of a resumable upload and, after the
// last one, creates or updates the file.
func (s *Server) handleUploadChunk(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("upload_id")
	first, total, err := parseContentRange(r.Header.Get("Content-Range"))
	if err != nil {
		writeError(w, badRequest("drivefake: %v", err))
		return
	}
	chunk, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, badRequest("drivefake: reading a chunk: %v", err))
		return
	}

	s.mu.Lock()
	up := s.uploads[id]
	if up == nil {
		s.mu.Unlock()
		writeError(w, newError(http.StatusNotFound, "notFound", "drivefake: no upload session "+id))
		return
	}
	if first >= 0 && first != int64(len(up.data)) {
		s.mu.Unlock()
		writeError(w, badRequest("drivefake: chunk starts at byte %d, expected %d", first, len(up.data)))
		return
	}
	up.data = append(up.data, chunk...)
	received := int64(len(up.data))
	if total < 0 || received < total {
		s.mu.Unlock()
		if received > 0 {
			w.Header().Set("Range", fmt.Sprintf("bytes=0-%d", received-1))
		}
		if r.Header.Get("X-GUploader-No-308") == "yes" {
			w.Header().Set("X-Http-Status-Code-Override", "308")
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusPermanentRedirect)
		}
		return
	}
	delete(s.uploads, id)
	s.mu.Unlock()

	if received > total {
		writeError(w, badRequest("drivefake: got %d bytes for an upload of %d", received, total))
		return
	}
	if up.fileID == "" {
		s.create(w, up.meta, up.data, up.mediaType)
	} else {
		s.update(w, up.fileID, up.params, up.meta, up.data, up.mediaType)
	}
}

// parseContentRange parses "bytes a-b/total", "bytes a-b/*" and
// "bytes */total". first is -1 when the header names no bytes, total is
// -1 when it is unknown.
func parseContentRange(h string) (first, total int64, err error) {
	spec, ok := strings.CutPrefix(h, "bytes ")
	rng, size, ok2 := strings.Cut(spec, "/")
	if !ok || !ok2 {
		return 0, 0, fmt.Errorf("bad Content-Range %q", h)
	}
	total = -1
	if size != "*" {
		if total, err = strconv.ParseInt(size, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("bad Content-Range %q", h)
		}
	}
	if rng == "*" {
		return -1, total, nil
	}
	a, _, ok := strings.Cut(rng, "-")
	if first, err = strconv.ParseInt(a, 10, 64); !ok || err != nil {
		return 0, 0, fmt.Errorf("bad Content-Range %q", h)
	}
	return first, total, nil
}
