// Package drivefake is an in-memory fake of the part of the Google Drive v3
// REST API that a sync remote needs, served by net/http/httptest and meant
// to be spoken to by the real client, google.golang.org/api/drive/v3:
//
//	srv := drivefake.New(t)
//	svc := srv.Service(ctx, t) // a *drive.Service pointed at srv
//
// It implements about.get, files.create (metadata only, multipart upload and
// resumable upload), files.get (metadata and alt=media), files.list (with a
// real parser for the q language, spaces, orderBy and paging), files.update
// (rename, move, trash, appProperties, new content) and files.delete, for
// the two spaces "drive" (My Drive) and "appDataFolder". Errors carry
// Drive's JSON error body, so the client returns a *googleapi.Error with
// Drive's Code and Errors[0].Reason.
//
// On top of that a test can script trouble: faults (rate limits, quota,
// server errors, expired credentials, a connection reset halfway through a
// response), a server clock, and a listing lag that models Drive's
// eventually consistent search index. Requests are counted so that tests can
// hold code to a request budget.
//
// What the client sends, with the endpoint srv.URL+"/drive/v3/":
//
//	about.get                 GET    /drive/v3/about?fields=...
//	files.list                GET    /drive/v3/files?q=...&spaces=...&pageSize=...&pageToken=...
//	files.create (metadata)   POST   /drive/v3/files                (JSON body)
//	files.create + Media      POST   /upload/drive/v3/files?uploadType=multipart
//	                                 (multipart/related: JSON metadata, then the media)
//	                          or, when the media is bigger than one chunk
//	                          (googleapi.DefaultUploadChunkSize, 16 MiB),
//	                          POST   /upload/drive/v3/files?uploadType=resumable
//	                                 then POST <Location> per chunk, with Content-Range
//	files.get                 GET    /drive/v3/files/{id}[?alt=media]
//	files.update              PATCH  /drive/v3/files/{id}           (JSON body)
//	files.update + Media      PATCH  /upload/drive/v3/files/{id}?uploadType=multipart|resumable
//	files.delete              DELETE /drive/v3/files/{id}
//
// The upload path is absolute ("/upload/drive/v3/files") in the generated
// client, so it is resolved against the host of the endpoint, not below it.
// Every request also carries alt=json (or alt=media) and prettyPrint=false.
package drivefake

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/api/drive/v3"
	"google.golang.org/api/option"
)

// Well-known folder ids. The aliases "root" and "appDataFolder" are accepted
// wherever Drive accepts them (as a parent, as a fileId, in "'x' in parents"),
// but, as on Drive, the parents the server reports are these real ids.
const (
	RootID          = "0AfakeRootFolderMyDrive"
	AppDataFolderID = "0AfakeAppDataFolder"

	// FolderMimeType is the MIME type of Drive folders.
	FolderMimeType = "application/vnd.google-apps.folder"
)

// Names of the two spaces a file can live in.
const (
	SpaceDrive   = "drive"
	SpaceAppData = "appDataFolder"
)

// A Server is a fake Drive. Create one with New; it is safe for concurrent
// use by any number of clients.
type Server struct {
	// URL is the base URL of the server, without a trailing slash. The
	// Drive endpoint to give a client is URL+"/drive/v3/".
	URL string

	srv *httptest.Server
	mux *http.ServeMux
	t   testing.TB

	mu       sync.Mutex
	now      func() time.Time
	files    map[string]*file
	seq      int64 // creation counter, for a stable default order
	lag      int   // list calls a new file stays invisible for
	faults   []Fault
	requests int
	log      []string
	pages    map[string]pageState
	uploads  map[string]*uploadSession
	user     drive.User // the signed-in user about.get reports
}

// A file is the server's record of one stored file or folder.
type file struct {
	id            string
	name          string
	mimeType      string
	description   string
	parent        string // the real id of the one parent folder
	space         string
	content       []byte
	md5           string
	created       time.Time
	modified      time.Time
	trashed       bool // explicitly trashed; children of a trashed folder are trashed too
	appProperties map[string]string
	properties    map[string]string
	version       int64
	seq           int64
	hiddenLists   int // files.list calls that will still not see it
}

// File is a snapshot of a stored file, for assertions. Parents holds real
// folder ids (RootID, AppDataFolderID or the id of a folder), never aliases.
type File struct {
	ID            string
	Name          string
	Parents       []string
	MimeType      string
	Size          int64  // length of Content; 0 for folders
	MD5           string // hex md5 of Content; empty for folders
	Content       []byte
	CreatedTime   time.Time
	ModifiedTime  time.Time
	Trashed       bool   // explicitly or through a trashed ancestor
	Space         string // SpaceDrive or SpaceAppData
	AppProperties map[string]string
}

// New starts a fake Drive and arranges for it to be closed when the test
// ends. Its clock is time.Now until SetClock says otherwise.
func New(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		t:       t,
		now:     time.Now,
		files:   make(map[string]*file),
		pages:   make(map[string]pageState),
		uploads: make(map[string]*uploadSession),
		user: drive.User{
			Kind:         "drive#user",
			DisplayName:  "Fake User",
			EmailAddress: "fake.user@example.com",
			PermissionId: "00000000000000000001",
			Me:           true,
		},
	}
	s.mux = s.routes()
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	s.URL = s.srv.URL
	t.Cleanup(s.srv.Close)
	return s
}

// Service returns a real drive/v3 client that talks to s, without
// authentication. It fails the test if the client cannot be built.
func (s *Server) Service(ctx context.Context, t testing.TB) *drive.Service {
	t.Helper()
	svc, err := drive.NewService(ctx,
		option.WithEndpoint(s.URL+"/drive/v3/"),
		option.WithHTTPClient(s.srv.Client()),
		option.WithoutAuthentication(),
	)
	if err != nil {
		t.Fatalf("drivefake: building a drive client: %v", err)
	}
	return svc
}

// Client returns an HTTP client for talking to s directly.
func (s *Server) Client() *http.Client { return s.srv.Client() }

// Requests returns the number of HTTP requests served since the server
// started or ResetRequests was last called, faulted requests included.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// ResetRequests sets the request count back to zero and clears RequestLog.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = 0
	s.log = nil
}

// RequestLog returns one "METHOD path" line per request counted by
// Requests, oldest first. The query string is left out.
func (s *Server) RequestLog() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// SetClock sets the server clock, which stamps createdTime and
// modifiedTime and the Date header of every response. Times are kept in UTC
// with millisecond precision, like Drive's.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// SetListingLag makes every file created from now on invisible to the first
// n files.list calls that follow its creation (each list request, each page,
// counts as one call), the way Drive's search index trails its writes.
// files.get sees new files at once. n = 0 turns the lag off.
func (s *Server) SetListingLag(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lag = max(n, 0)
}

// SetUser changes the signed-in user that about.get reports, so that two
// servers can stand for two accounts. Every server starts with the same
// user, fake.user@example.com with permission id 00000000000000000001.
func (s *Server) SetUser(email, permissionID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.user.EmailAddress, s.user.PermissionId = email, permissionID
}

// Files returns a snapshot of every stored file and folder, in creation
// order.
func (s *Server) Files() []File {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make([]*file, 0, len(s.files))
	for _, f := range s.files {
		all = append(all, f)
	}
	slices.SortFunc(all, func(a, b *file) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]File, len(all))
	for i, f := range all {
		out[i] = File{
			ID:            f.id,
			Name:          f.name,
			Parents:       []string{f.parent},
			MimeType:      f.mimeType,
			Size:          int64(len(f.content)),
			MD5:           f.md5,
			Content:       slices.Clone(f.content),
			CreatedTime:   f.created,
			ModifiedTime:  f.modified,
			Trashed:       s.isTrashed(f),
			Space:         f.space,
			AppProperties: maps.Clone(f.appProperties),
		}
	}
	return out
}

// serveHTTP counts the request, stamps the Date header and either injects
// the next matching fault or routes the request.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.log = append(s.log, r.Method+" "+r.URL.Path)
	now := s.clockLocked()
	fault, faulted := s.takeFaultLocked(r)
	s.mu.Unlock()

	w.Header().Set("Date", now.Format(http.TimeFormat))
	switch {
	case faulted && fault.ResetMidBody:
		s.serveTruncated(w, r)
	case faulted:
		writeFault(w, fault)
	default:
		s.mux.ServeHTTP(w, r)
	}
}

// clockLocked reads the server clock. s.mu must be held.
func (s *Server) clockLocked() time.Time {
	return s.now().UTC().Truncate(time.Millisecond)
}

// newID returns a fresh id shaped like Drive's: 33 URL-safe characters.
func newID() string {
	b := make([]byte, 24)
	rand.Read(b)
	return "1" + base64.RawURLEncoding.EncodeToString(b)
}
