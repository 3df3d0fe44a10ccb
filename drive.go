package drivesync

import (
	"bytes"
	"cmp"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/api/drive/v3"
	"google.golang.org/api/googleapi"

	"github.com/drivesync/drivesync/internal/pacer"
	"github.com/drivesync/drivesync/internal/remoteclock"
)

// DriveOptions configures a DriveRemote. The zero value keeps the files in
// the app's hidden app-data folder.
type DriveOptions struct {
	// Folder, if set, names a visible folder in the user's My Drive that
	// holds the files (OAuth scope ScopeFile). Empty means the app-data
	// folder, hidden from the user and other apps (scope ScopeAppData,
	// which needs no Google security review).
	Folder string
	// Logger receives retries and fallbacks; nil discards them.
	Logger *slog.Logger
	// MaxAttempts bounds the tries of one call (default 8); the wait
	// between tries doubles from MinSleep (default 250ms) to MaxSleep
	// (default 30s), and never exceeds the context's deadline.
	MaxAttempts        int
	MinSleep, MaxSleep time.Duration
}

const folderMime = "application/vnd.google-apps.folder"

// DriveRemote is a Remote in Google Drive, through the drive/v3 API.
//
// Files live in day folders (YYYY/MM/DD) under the app-data folder or
// DriveOptions.Folder. Drive allows several files and folders of one name:
// two devices creating the same day folder at once both succeed, and
// DriveRemote lists and uses both. Listing is one paginated files.list
// over the whole space, not one call per folder. Create checks that the
// name is free before uploading, but two devices creating the same name at
// the same moment can both succeed; the engine's names (remote time and
// device id) never collide, and a duplicate of one file is harmless.
//
// Every call is retried with exponential backoff and jitter on rate
// limits (403 userRateLimitExceeded and rateLimitExceeded, 429, honouring
// Retry-After), server errors and dropped connections, within the
// context's deadline. A refused sign-in fails at once with ErrAuth, a full
// drive with ErrQuota. A file Drive will not let this account download
// (403 insufficientFilePermissions, appNotAuthorizedToFile,
// cannotDownloadFile, downloadQuotaExceeded) makes Open fail with
// fs.ErrPermission: the engine skips that file and reads it again later.
//
// Neither the remote nor the process grows without bound. A List of
// everything (a zero since, which the engine makes when a snapshot falls
// due, about once a month, and when a device starts from one) removes the
// day folders that are empty and more than a week past their day, and
// the month and year folders that leaves empty: the week keeps a removal
// from meeting a device creating a file there. The folder and file ids
// DriveRemote remembers are then those that listing showed, plus the last
// week's folders. A Create whose folder was removed meanwhile makes it
// again.
type DriveRemote struct {
	svc    *drive.Service
	space  string // "appDataFolder" or "drive"
	folder string // DriveOptions.Folder
	pacer  *pacer.Pacer
	log    *slog.Logger

	// rootMu is held while the root folder is looked up, so that
	// concurrent first calls look it up once.
	rootMu    sync.Mutex
	rootFound bool

	mu      sync.Mutex
	roots   map[string]bool     // ids of the root folder (several if duplicated)
	folders map[string]string   // folder id -> path below the root ("" for a root)
	dirs    map[string]string   // path -> a folder id to create files in
	ids     map[string][]string // file name -> ids, from the listings since the last full one
	date    remoteclock.Clock   // Drive's time, from the Date headers of its responses
	account string              // the signed-in user's permission id, once about.get told it
	marker  markerCache
}

// markerCache keeps the store's marker, which the engine reads every sync
// and which is never rewritten (a new store is a new file), so that an
// idle sync costs one request, its listing. The copy is served only while
// the latest listing shows the same file (id) with the same content
// (md5Checksum): a marker deleted, replaced or edited is read again, and
// one the listing no longer shows is looked up as any other file.
type markerCache struct {
	listed map[string]string // id -> md5Checksum of the root's markers in the latest listing
	id     string            // the file kept, and its checksum
	sum    string
	data   []byte
}

var _ IdentifiedRemote = (*DriveRemote)(nil)

// NewDriveRemote returns a Remote in the Drive that svc signs into. It
// makes no request, so that an app can open its engine and use its own
// data offline: the first call that needs the root folder finds it (or,
// for DriveOptions.Folder, creates it), which also checks the sign-in, and
// fails with that step's error, a later call trying again. ctx is not
// used.
func NewDriveRemote(ctx context.Context, svc *drive.Service, opts DriveOptions) (*DriveRemote, error) {
	if svc == nil {
		return nil, errors.New("drive remote: svc is nil")
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 8
	}
	if opts.MinSleep <= 0 {
		opts.MinSleep = 250 * time.Millisecond
	}
	if opts.MaxSleep <= 0 {
		opts.MaxSleep = 30 * time.Second
	}
	r := &DriveRemote{
		svc:     svc,
		space:   "appDataFolder",
		folder:  opts.Folder,
		pacer:   pacer.New(opts.MinSleep, opts.MaxSleep, opts.MaxAttempts),
		log:     opts.Logger,
		roots:   map[string]bool{},
		folders: map[string]string{},
		dirs:    map[string]string{},
		ids:     map[string][]string{},
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if opts.Folder != "" {
		r.space = "drive"
	}
	return r, nil
}

// findRoot looks up the root folder, once: the app-data folder, or
// DriveOptions.Folder in My Drive, created if missing.
func (r *DriveRemote) findRoot(ctx context.Context) error {
	r.rootMu.Lock()
	defer r.rootMu.Unlock()
	if r.rootFound {
		return nil
	}
	if r.folder == "" {
		var root *drive.File
		err := r.call(ctx, func() (err error) {
			root, err = r.svc.Files.Get("appDataFolder").Fields("id").Context(ctx).Do()
			return err
		})
		if err != nil {
			return fmt.Errorf("open the app-data folder: %w", err)
		}
		r.date.Note(root.Header)
		r.addRoot(root.Id)
		r.rootFound = true
		return nil
	}
	q := fmt.Sprintf("name = %s and 'root' in parents and mimeType = '%s' and trashed = false", quoteQ(r.folder), folderMime)
	found, err := r.query(ctx, q, "files(id)")
	if err != nil {
		return fmt.Errorf("find folder %s: %w", r.folder, err)
	}
	for _, f := range found {
		r.addRoot(f.Id)
	}
	if len(found) == 0 {
		var f *drive.File
		err := r.call(ctx, func() (err error) {
			f, err = r.svc.Files.Create(&drive.File{Name: r.folder, MimeType: folderMime, Parents: []string{"root"}}).Fields("id").Context(ctx).Do()
			return err
		})
		if err != nil {
			return fmt.Errorf("create folder %s: %w", r.folder, err)
		}
		r.addRoot(f.Id)
	}
	r.rootFound = true
	return nil
}

func (r *DriveRemote) addRoot(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.roots[id] = true
	r.folders[id] = ""
	if _, ok := r.dirs[""]; !ok {
		r.dirs[""] = id
	}
}

// List returns the files created at or after since, in one paginated
// listing of the space. A zero since lists everything, folders included,
// and tidies up (see listAll).
func (r *DriveRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	if err := r.findRoot(ctx); err != nil {
		return nil, driveErr("list", "", err)
	}
	if since.IsZero() {
		return r.listAll(ctx)
	}
	// The store's marker is always listed: the engine reads it every
	// sync, and Drive may hold two of them (see bind in marker.go), so
	// its ids must be as fresh as the listing.
	q := fmt.Sprintf("trashed = false and mimeType != '%s' and (createdTime >= '%s' or name = %s)",
		folderMime, since.UTC().Format(time.RFC3339), quoteQ(markerName))
	files, err := r.query(ctx, q, "files(id, name, parents, size, md5Checksum)")
	if err != nil {
		return nil, driveErr("list", "", err)
	}
	out, ids, err := r.nameFiles(ctx, files, true)
	if err != nil {
		return nil, driveErr("list folders", "", err)
	}
	r.mu.Lock()
	maps.Copy(r.ids, ids) // this listing's ids replace older ones
	r.listedMarkers(files, ids[markerName])
	r.mu.Unlock()
	return out, nil
}

// listAll lists every file and folder of the space in one paginated query,
// which costs no more requests than listing the files alone. It then
// rebuilds the folder caches from the listed folders (see learnFolders),
// keeps the ids of exactly the listed files, and removes old empty
// folders (see removeOldFolders).
//
// Tidying up here rather than in Delete costs the fewest requests: this
// listing shows every folder and what is in it, so finding the empty ones
// is free and each removal costs its one files.delete, where Delete would
// have to ask Drive whether a folder was left empty. Ordinary syncs list
// only what is new and pay nothing. The engine lists everything when a
// snapshot falls due, before compacting, so the folders one compaction
// empties are removed at the next month's; at most about a month of empty
// folders, plus the last week's, is ever left.
func (r *DriveRemote) listAll(ctx context.Context) ([]RemoteFile, error) {
	all, err := r.query(ctx, "trashed = false", "files(id, name, mimeType, parents, size, md5Checksum)")
	if err != nil {
		return nil, driveErr("list", "", err)
	}
	var folders, files []*drive.File
	for _, f := range all {
		if f.MimeType == folderMime {
			folders = append(folders, f)
		} else {
			files = append(files, f)
		}
	}
	now, haveClock := r.date.Now()
	r.learnFolders(folders, now)
	// Every folder is known now: a file whose parent is not lives
	// outside the root, and learning the folders again would not help.
	out, ids, err := r.nameFiles(ctx, files, false)
	if err != nil {
		return nil, driveErr("list", "", err)
	}
	r.mu.Lock()
	r.ids = ids
	r.listedMarkers(files, ids[markerName])
	r.mu.Unlock()
	if haveClock { // the query's Date header gave it; without a clock, no folder is old
		if err := r.removeOldFolders(ctx, all, folders, now); err != nil {
			return nil, driveErr("list", "", err)
		}
	}
	return out, nil
}

// nameFiles returns the listed files below the root, with their paths, and
// the ids of each name: Drive allows two files of one name, and the engine
// must see both. With reload, a parent it does not know (a day folder
// another device made) makes it learn the folders, once.
func (r *DriveRemote) nameFiles(ctx context.Context, files []*drive.File, reload bool) ([]RemoteFile, map[string][]string, error) {
	var out []RemoteFile
	ids := map[string][]string{}
	for _, f := range files {
		dir, ok := r.folderPath(f.Parents)
		if !ok && reload {
			if err := r.loadFolders(ctx); err != nil {
				return nil, nil, err
			}
			reload = false
			dir, ok = r.folderPath(f.Parents)
		}
		if !ok {
			continue // not under our root
		}
		name := path.Join(dir, f.Name)
		if _, seen := ids[name]; !seen {
			out = append(out, RemoteFile{Name: name, Size: f.Size})
		}
		if !slices.Contains(ids[name], f.Id) {
			ids[name] = append(ids[name], f.Id)
		}
	}
	return out, ids, nil
}

// listedMarkers records the checksums of the markers a listing showed
// (ids: the root's files of that name), forgetting those of earlier
// listings. r.mu is held.
func (r *DriveRemote) listedMarkers(files []*drive.File, ids []string) {
	r.marker.listed = map[string]string{}
	for _, f := range files {
		if slices.Contains(ids, f.Id) {
			r.marker.listed[f.Id] = f.Md5Checksum
		}
	}
}

// keptMarker returns the kept marker if it is the file id and the latest
// listing showed that file with the same checksum.
func (r *DriveRemote) keptMarker(id string) ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := &r.marker
	if sum := m.listed[id]; sum == "" || m.id != id || m.sum != sum {
		return nil, false
	}
	return m.data, true
}

// keepMarker reads the marker file id from body and keeps it if its
// content matches the checksum the latest listing showed. A body over
// maxMarker is returned as it is (the engine refuses it).
func (r *DriveRemote) keepMarker(id string, body io.ReadCloser) (io.ReadCloser, error) {
	data, err := io.ReadAll(io.LimitReader(body, maxMarker+1))
	if err != nil {
		body.Close()
		return nil, err
	}
	if len(data) > maxMarker {
		return struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(data), body), body}, nil
	}
	body.Close()
	sum := md5.Sum(data)
	r.mu.Lock()
	if listed := r.marker.listed[id]; listed != "" && listed == hex.EncodeToString(sum[:]) {
		r.marker.id, r.marker.sum, r.marker.data = id, listed, data
	}
	r.mu.Unlock()
	return io.NopCloser(bytes.NewReader(data)), nil
}

// Open downloads the named file (alt=media). The marker is served from
// memory while the listings show it unchanged (see markerCache).
func (r *DriveRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	ids, err := r.lookup(ctx, name)
	if err != nil {
		return nil, driveErr("open", name, err)
	}
	// Drive allows two files of one name (two devices creating the
	// marker at once): every device reads the same one.
	id := slices.Min(ids)
	if name == markerName {
		if data, ok := r.keptMarker(id); ok {
			return io.NopCloser(bytes.NewReader(data)), nil
		}
	}
	var resp *http.Response
	err = r.call(ctx, func() (err error) {
		resp, err = r.svc.Files.Get(id).Context(ctx).Download()
		return err
	})
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Code == http.StatusForbidden && hasReason(ge, fileRefusals...) {
		// Drive lets this account list the file but not read it: the
		// file's fault, not the sign-in's (see Remote.Open).
		return nil, fmt.Errorf("drive remote: open %s: Drive refuses to let this account read the file (%s): %w", name, ge.Errors[0].Reason, fs.ErrPermission)
	}
	if err != nil {
		return nil, driveErr("open", name, err)
	}
	r.date.Note(resp.Header)
	if name == markerName {
		rc, err := r.keepMarker(id, resp.Body)
		if err != nil {
			return nil, driveErr("open", name, err)
		}
		return rc, nil
	}
	return resp.Body, nil
}

// Create uploads content as one multipart request and checks the
// checksum and size Drive reports against what was sent.
//
// The folder DriveRemote remembers for the file may be gone: another
// device removed it as old and empty (see removeOldFolders), or someone
// deleted or trashed it. Drive refuses a file whose parent was deleted
// (404), and accepts one into a trashed folder, where it is trashed too
// and no listing shows it; the response says so, and that file is
// deleted. Either way Create forgets the folder, finds or makes it again,
// and tries again, so that the file ends up where listings see it.
func (r *DriveRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if err := checkRemoteName(name); err != nil {
		return fmt.Errorf("drive remote: create: %w", err)
	}
	if err := r.findRoot(ctx); err != nil {
		return driveErr("create", name, err)
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	body := &rereader{r: content}
	for attempt := 1; ; attempt++ {
		err := r.createIn(ctx, dir, base, body)
		var gone *folderGone
		if !errors.As(err, &gone) {
			return driveErr("create", name, err)
		}
		if attempt == 3 || !body.canReread() {
			return fmt.Errorf("drive remote: create %s: %v", name, gone)
		}
		r.log.Info("drive remote: the folder is gone; finding or making it again", "folder", dir, "err", gone)
		r.forgetDir(dir)
	}
}

// A folderGone is a Create's discovery that the folder it used was deleted
// or trashed. It does not unwrap: the file is not missing, its folder is.
type folderGone struct{ err error }

func (e *folderGone) Error() string {
	return "its folder was deleted or trashed on Drive: " + e.err.Error()
}

// createIn uploads one file into dir, unless a file of that name is there.
func (r *DriveRemote) createIn(ctx context.Context, dir, base string, content *rereader) error {
	parent, err := r.ensureDir(ctx, dir)
	if isNotFound(err) { // a folder above dir is gone
		return &folderGone{err}
	}
	if err != nil {
		return err
	}
	existing, err := r.query(ctx, fmt.Sprintf("name = %s and '%s' in parents and trashed = false", quoteQ(base), parent), "files(id)")
	if err != nil {
		return err
	}
	if len(existing) > 0 {
		return fs.ErrExist
	}
	var sum hash.Hash
	var body *countingReader
	var created *drive.File
	err = r.call(ctx, func() (err error) {
		if err := content.rewind(); err != nil {
			return err
		}
		chunk, err := uploadChunk(content.r)
		if err != nil {
			return &notRetried{err}
		}
		sum = md5.New()
		body = &countingReader{r: io.TeeReader(content.r, sum)}
		created, err = r.svc.Files.Create(&drive.File{Name: base, Parents: []string{parent}}).
			Media(body, googleapi.ContentType("application/octet-stream"), googleapi.ChunkSize(chunk)).
			Fields("id, size, md5Checksum, trashed").Context(ctx).Do()
		if err != nil && !content.canReread() {
			// Another try would send what is left of the content.
			err = &notRetried{err}
		}
		return err
	})
	if isNotFound(err) {
		return &folderGone{err}
	}
	if err != nil {
		return err
	}
	r.date.Note(created.Header)
	if created.Trashed {
		r.deleteID(context.WithoutCancel(ctx), created.Id)
		return &folderGone{errors.New("Drive put the file in the trash with its folder")}
	}
	n := body.n
	if want := hex.EncodeToString(sum.Sum(nil)); created.Md5Checksum != want || created.Size != n {
		r.deleteID(context.WithoutCancel(ctx), created.Id)
		return fmt.Errorf("Drive stored %d bytes with md5 %s, sent %d bytes with md5 %s: %w", created.Size, created.Md5Checksum, n, want, ErrRemote)
	}
	// The id is not remembered: a later Open must see every file of
	// the name, as other devices do.
	return nil
}

// uploadChunk returns the chunk size of an upload of content. The Drive
// client reads a chunk into memory before it sends it, so a content that
// fails to read fails before anything is sent; streamed unbuffered, a
// failing content would end the request body cleanly, and Drive would
// store the part sent as a whole file. A content that fits one chunk goes
// in one request; a larger one in a resumable upload, which creates no
// file unless every chunk arrives. The chunk is as small as the content
// allows (the client rounds it up to 256 KiB), so that a small patch file
// does not cost the client's default 16 MiB buffer.
func uploadChunk(content io.Reader) (int, error) {
	s, ok := content.(io.Seeker)
	if !ok {
		return googleapi.DefaultUploadChunkSize, nil
	}
	cur, err := s.Seek(0, io.SeekCurrent)
	if err != nil {
		return googleapi.DefaultUploadChunkSize, nil
	}
	end, err := s.Seek(0, io.SeekEnd)
	if _, err2 := s.Seek(cur, io.SeekStart); err2 != nil {
		return 0, err2 // the content is no longer where the upload starts
	}
	if err != nil {
		return googleapi.DefaultUploadChunkSize, nil
	}
	// One byte more than what is left, so that the first chunk reaches
	// the end and the upload is a single request.
	return int(min(end-cur+1, googleapi.DefaultUploadChunkSize)), nil
}

// A rereader is the content of a Create, read once per try: from the
// start again if it can seek, else only once.
type rereader struct {
	r    io.Reader
	read bool
}

// rewind readies the content for a try.
func (c *rereader) rewind() error {
	if !c.read {
		c.read = true
		return nil
	}
	s, ok := c.r.(io.Seeker)
	if !ok {
		return errors.New("the content cannot be read again")
	}
	_, err := s.Seek(0, io.SeekStart)
	return err
}

// canReread reports whether another try can send the whole content.
func (c *rereader) canReread() bool {
	_, ok := c.r.(io.Seeker)
	return ok || !c.read
}

// notRetried marks a failure that must not be retried although its kind
// usually is. It keeps the failure, so that Drive's status and reason
// still decide what the caller is told.
type notRetried struct{ err error }

func (e *notRetried) Error() string {
	return e.err.Error() + " (not retried: the content cannot be read again)"
}

func (e *notRetried) Unwrap() error { return e.err }

// Delete removes every file of that name permanently, falling back to the
// trash where Drive refuses a permanent delete.
func (r *DriveRemote) Delete(ctx context.Context, name string) error {
	ids, err := r.lookup(ctx, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return driveErr("delete", name, err)
	}
	for _, id := range ids {
		if err := r.deleteID(ctx, id); err != nil {
			return driveErr("delete", name, err)
		}
	}
	r.mu.Lock()
	delete(r.ids, name)
	if name == markerName {
		r.marker = markerCache{}
	}
	r.mu.Unlock()
	return nil
}

func (r *DriveRemote) deleteID(ctx context.Context, id string) error {
	err := r.call(ctx, func() error { return r.svc.Files.Delete(id).Context(ctx).Do() })
	var ge *googleapi.Error
	switch {
	case err == nil || isNotFound(err):
		return nil
	case errors.As(err, &ge) && ge.Code == http.StatusForbidden && !isQuota(ge):
		r.log.Info("drive remote: permanent delete refused, trashing instead", "id", id, "err", err)
		err = r.call(ctx, func() error {
			_, err := r.svc.Files.Update(id, &drive.File{Trashed: true}).Context(ctx).Do()
			return err
		})
		if isNotFound(err) {
			return nil
		}
	}
	return err
}

// Now returns Drive's time, estimated from the Date headers of its
// responses (an about.get if there was none yet).
func (r *DriveRemote) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if now, have := r.date.Now(); have {
		return now, nil
	}
	about, err := r.about(ctx)
	if err != nil {
		return time.Time{}, driveErr("read clock", "", err)
	}
	r.date.Note(about.Header)
	now, have := r.date.Now()
	if !have {
		return time.Time{}, errors.New("drive remote: Drive's response has no Date header")
	}
	return now, nil
}

// Identity names the signed-in account (its permission id, which stays
// the same when the user changes the address) and the folder: the
// app-data folder, or DriveOptions.Folder in My Drive.
func (r *DriveRemote) Identity(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("drive remote: identity: %w", err)
	}
	r.mu.Lock()
	account := r.account
	r.mu.Unlock()
	if account == "" {
		about, err := r.about(ctx)
		if err != nil {
			return "", driveErr("identify the account", "", err)
		}
		r.date.Note(about.Header)
		if account = about.User.PermissionId; account == "" {
			return "", errors.New("drive remote: Drive did not say which account is signed in")
		}
	}
	id := "drive:" + account + ":" + r.space
	if r.folder != "" {
		id += ":" + r.folder
	}
	return id, nil
}

// about reads the signed-in user, remembering the account for Identity.
func (r *DriveRemote) about(ctx context.Context) (*drive.About, error) {
	var about *drive.About
	err := r.call(ctx, func() (err error) {
		about, err = r.svc.About.Get().Fields("user(permissionId)").Context(ctx).Do()
		return err
	})
	if err != nil {
		return nil, err
	}
	if about.User == nil {
		about.User = &drive.User{}
	}
	r.mu.Lock()
	r.account = cmp.Or(about.User.PermissionId, r.account)
	r.mu.Unlock()
	return about, nil
}

// query runs a paginated files.list over the space.
func (r *DriveRemote) query(ctx context.Context, q, fields string) ([]*drive.File, error) {
	var out []*drive.File
	token := ""
	for {
		var page *drive.FileList
		err := r.call(ctx, func() (err error) {
			call := r.svc.Files.List().Q(q).Spaces(r.space).PageSize(1000).
				Fields(googleapi.Field("nextPageToken, " + fields)).Context(ctx)
			if token != "" {
				call = call.PageToken(token)
			}
			page, err = call.Do()
			return err
		})
		if err != nil {
			return nil, err
		}
		r.date.Note(page.Header)
		out = append(out, page.Files...)
		if token = page.NextPageToken; token == "" {
			return out, nil
		}
	}
}

// lookup returns the ids of a named file: from the latest listing, or by
// asking Drive.
func (r *DriveRemote) lookup(ctx context.Context, name string) ([]string, error) {
	if err := checkRemoteName(name); err != nil {
		return nil, err
	}
	if err := r.findRoot(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	ids := r.ids[name]
	r.mu.Unlock()
	if len(ids) > 0 {
		return ids, nil
	}
	dir, base := path.Split(name)
	found, err := r.query(ctx, fmt.Sprintf("name = %s and trashed = false", quoteQ(base)), "files(id, parents)")
	if err != nil {
		return nil, err
	}
	dir = strings.TrimSuffix(dir, "/")
	for _, f := range found {
		if d, ok := r.folderPath(f.Parents); ok && d == dir {
			ids = append(ids, f.Id)
		}
	}
	if len(ids) == 0 && len(found) > 0 {
		if err := r.loadFolders(ctx); err != nil {
			return nil, err
		}
		for _, f := range found {
			if d, ok := r.folderPath(f.Parents); ok && d == dir {
				ids = append(ids, f.Id)
			}
		}
	}
	if len(ids) == 0 {
		return nil, fs.ErrNotExist
	}
	return ids, nil
}

// quoteQ quotes a string for a Drive query.
func quoteQ(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
