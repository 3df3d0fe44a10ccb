package drivesync

import (
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
	"net"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/drive/v3"
	"google.golang.org/api/googleapi"

	"github.com/drivesync/drivesync/internal/pacer"
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
	roots   map[string]bool   // ids of the root folder (several if duplicated)
	folders map[string]string // folder id -> path below the root ("" for a root)
	dirs    map[string]string // path -> a folder id to create files in
	ids     map[string][]string
	// offset estimates Drive's time minus the local clock. Date headers
	// have whole seconds: each one narrows the estimate, never resets it,
	// so the clock keeps millisecond steps and does not jump back.
	offset    time.Duration
	haveClock bool
	account   string // the signed-in user's permission id, once about.get told it
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
		r.noteDate(root.Header)
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
// listing of the space.
func (r *DriveRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	if err := r.findRoot(ctx); err != nil {
		return nil, driveErr("list", "", err)
	}
	q := fmt.Sprintf("trashed = false and mimeType != '%s'", folderMime)
	if !since.IsZero() {
		// The store's marker is always listed: the engine reads it every
		// sync, and Drive may hold two of them (see bind in snapshot.go),
		// so its ids must be as fresh as the listing.
		q += fmt.Sprintf(" and (createdTime >= '%s' or name = %s)", since.UTC().Format(time.RFC3339), quoteQ(markerName))
	}
	files, err := r.query(ctx, q, "files(id, name, parents, size)")
	if err != nil {
		return nil, driveErr("list", "", err)
	}
	reloaded := false
	var out []RemoteFile
	seen := map[string]bool{}
	for _, f := range files {
		dir, ok := r.folderPath(f.Parents)
		if !ok && !reloaded {
			// A day folder another device created: learn the folders
			// once per listing.
			if err := r.loadFolders(ctx); err != nil {
				return nil, driveErr("list folders", "", err)
			}
			reloaded = true
			dir, ok = r.folderPath(f.Parents)
		}
		if !ok {
			continue // not under our root
		}
		name := path.Join(dir, f.Name)
		r.mu.Lock()
		if !seen[name] {
			r.ids[name] = nil // this listing's ids replace older ones
		}
		if !slices.Contains(r.ids[name], f.Id) {
			r.ids[name] = append(r.ids[name], f.Id)
		}
		r.mu.Unlock()
		if !seen[name] {
			seen[name] = true
			out = append(out, RemoteFile{Name: name, Size: f.Size})
		}
	}
	return out, nil
}

// Open downloads the named file (alt=media).
func (r *DriveRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	ids, err := r.lookup(ctx, name)
	if err != nil {
		return nil, driveErr("open", name, err)
	}
	var resp *http.Response
	err = r.call(ctx, func() (err error) {
		// Drive allows two files of one name (two devices creating the
		// marker at once): every device reads the same one.
		resp, err = r.svc.Files.Get(slices.Min(ids)).Context(ctx).Download()
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
	r.noteDate(resp.Header)
	return resp.Body, nil
}

// Create uploads content as one multipart request and checks the
// checksum and size Drive reports against what was sent.
func (r *DriveRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if err := checkRemoteName(name); err != nil {
		return fmt.Errorf("drive remote: create: %w", err)
	}
	if err := r.findRoot(ctx); err != nil {
		return driveErr("create", name, err)
	}
	dir, base := path.Split(name)
	parent, err := r.ensureDir(ctx, strings.TrimSuffix(dir, "/"))
	if err != nil {
		return driveErr("create", name, err)
	}
	existing, err := r.query(ctx, fmt.Sprintf("name = %s and '%s' in parents and trashed = false", quoteQ(base), parent), "files(id)")
	if err != nil {
		return driveErr("create", name, err)
	}
	if len(existing) > 0 {
		return fmt.Errorf("drive remote: create %s: %w", name, fs.ErrExist)
	}
	seeker, canRetry := content.(io.Seeker)
	var sum hash.Hash
	var body *countingReader
	var created *drive.File
	attempt := 0
	err = r.call(ctx, func() (err error) {
		if attempt++; attempt > 1 {
			if _, err := seeker.Seek(0, io.SeekStart); err != nil {
				return err
			}
		}
		sum = md5.New()
		body = &countingReader{r: io.TeeReader(content, sum)}
		created, err = r.svc.Files.Create(&drive.File{Name: base, Parents: []string{parent}}).
			Media(body, googleapi.ContentType("application/octet-stream"), googleapi.ChunkSize(0)).
			Fields("id, size, md5Checksum").Context(ctx).Do()
		if err != nil && !canRetry {
			// Another try would send what is left of the content.
			err = &notRetried{err}
		}
		return err
	})
	if err != nil {
		return driveErr("create", name, err)
	}
	r.noteDate(created.Header)
	n := body.n
	if want := hex.EncodeToString(sum.Sum(nil)); created.Md5Checksum != want || created.Size != n {
		r.deleteID(context.WithoutCancel(ctx), created.Id)
		return fmt.Errorf("drive remote: create %s: Drive stored %d bytes with md5 %s, sent %d bytes with md5 %s: %w", name, created.Size, created.Md5Checksum, n, want, ErrRemote)
	}
	// The id is not remembered: a later Open must see every file of
	// the name, as other devices do.
	return nil
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
	r.mu.Lock()
	have, offset := r.haveClock, r.offset
	r.mu.Unlock()
	if have {
		return time.Now().Add(offset).UTC(), nil
	}
	about, err := r.about(ctx)
	if err != nil {
		return time.Time{}, driveErr("read clock", "", err)
	}
	r.noteDate(about.Header)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.haveClock {
		return time.Time{}, errors.New("drive remote: Drive's response has no Date header")
	}
	return time.Now().Add(r.offset).UTC(), nil
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
		r.noteDate(about.Header)
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

// noteDate narrows the clock estimate: when a response says D, Drive's
// time on arrival was within [D, D+1s).
func (r *DriveRemote) noteDate(h http.Header) {
	d, err := http.ParseTime(h.Get("Date"))
	if err != nil {
		return
	}
	now := time.Now()
	low, high := d.Sub(now), d.Add(time.Second).Sub(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.haveClock:
		r.offset, r.haveClock = low, true
	case r.offset < low:
		r.offset = low
	case r.offset >= high:
		r.offset = high - time.Millisecond
	}
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
		r.noteDate(page.Header)
		out = append(out, page.Files...)
		if token = page.NextPageToken; token == "" {
			return out, nil
		}
	}
}

// loadFolders learns every folder of the space and its path below a root.
func (r *DriveRemote) loadFolders(ctx context.Context) error {
	all, err := r.query(ctx, fmt.Sprintf("mimeType = '%s' and trashed = false", folderMime), "files(id, name, parents)")
	if err != nil {
		return err
	}
	byID := map[string]*drive.File{}
	for _, f := range all {
		byID[f.Id] = f
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var resolve func(id string, depth int) (string, bool)
	resolve = func(id string, depth int) (string, bool) {
		if p, ok := r.folders[id]; ok {
			return p, true
		}
		f := byID[id]
		if f == nil || len(f.Parents) == 0 || depth > 8 {
			return "", false
		}
		parent, ok := resolve(f.Parents[0], depth+1)
		if !ok {
			return "", false
		}
		p := path.Join(parent, f.Name)
		r.folders[id] = p
		if _, ok := r.dirs[p]; !ok {
			r.dirs[p] = id
		}
		return p, true
	}
	for id := range byID {
		resolve(id, 0)
	}
	return nil
}

func (r *DriveRemote) folderPath(parents []string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range parents {
		if dir, ok := r.folders[p]; ok {
			return dir, true
		}
	}
	return "", false
}

// ensureDir returns a folder id for dir, creating the missing levels.
func (r *DriveRemote) ensureDir(ctx context.Context, dir string) (string, error) {
	r.mu.Lock()
	id, ok := r.dirs[dir]
	r.mu.Unlock()
	if ok {
		return id, nil
	}
	if err := r.loadFolders(ctx); err != nil {
		return "", err
	}
	parent := ""
	for _, part := range strings.Split(dir, "/") {
		p := path.Join(parent, part)
		r.mu.Lock()
		_, exists := r.dirs[p]
		parentID := r.dirs[parent]
		r.mu.Unlock()
		if !exists {
			var f *drive.File
			err := r.call(ctx, func() (err error) {
				f, err = r.svc.Files.Create(&drive.File{Name: part, MimeType: folderMime, Parents: []string{parentID}}).Fields("id").Context(ctx).Do()
				return err
			})
			if err != nil {
				return "", err
			}
			r.mu.Lock()
			r.folders[f.Id], r.dirs[p] = p, f.Id
			r.mu.Unlock()
		}
		parent = p
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dirs[dir], nil
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

// call runs one Drive request under the pacer. When the tries run out, the
// error is the last one Drive gave, so that its status and reason reach
// the caller.
func (r *DriveRemote) call(ctx context.Context, fn func() error) error {
	tries, transient := 0, false
	err := r.pacer.Call(ctx, func() error { tries++; return fn() }, func(err error) pacer.Retry {
		retry := classifyDrive(err)
		if transient = retry.Again; transient {
			r.log.Info("drive remote: retrying", "err", err, "after", retry.After)
		}
		return retry
	})
	if err != nil && transient && ctx.Err() == nil {
		err = fmt.Errorf("%w (gave up after %d tries)", err, tries)
	}
	return err
}

// classifyDrive decides which failures are worth another try: rate
// limits, server errors and dropped connections. The Go client does not
// retry drive/v3 calls itself.
func classifyDrive(err error) pacer.Retry {
	if errors.As(err, new(*notRetried)) {
		return pacer.Retry{}
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		after := retryAfter(ge.Header)
		switch {
		case ge.Code == http.StatusTooManyRequests, ge.Code >= 500:
			return pacer.Retry{Again: true, After: after}
		case ge.Code == http.StatusForbidden && hasReason(ge, "userRateLimitExceeded", "rateLimitExceeded"):
			return pacer.Retry{Again: true, After: after}
		}
		return pacer.Retry{}
	}
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		return pacer.Retry{Again: re.Response != nil && re.Response.StatusCode >= 500}
	}
	var ne net.Error
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &ne) && ne.Timeout()) {
		return pacer.Retry{Again: true}
	}
	return pacer.Retry{}
}

func retryAfter(h http.Header) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}

func hasReason(ge *googleapi.Error, reasons ...string) bool {
	for _, item := range ge.Errors {
		for _, r := range reasons {
			if item.Reason == r {
				return true
			}
		}
	}
	return false
}

// fileRefusals are the reasons of a 403 that concern one file, not the
// account or the app's access to the space.
var fileRefusals = []string{"insufficientFilePermissions", "appNotAuthorizedToFile", "cannotDownloadFile", "downloadQuotaExceeded"}

func isNotFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusNotFound
}

func isQuota(ge *googleapi.Error) bool {
	return hasReason(ge, "storageQuotaExceeded", "quotaExceeded", "teamDriveFileLimitExceeded")
}

// driveErr turns a Drive failure into the errors the engine and the app
// understand. Messages never include tokens: googleapi errors carry none,
// and oauth2 errors are reduced to their error code.
func driveErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	what := "drive remote: " + op
	if name != "" {
		what += " " + name
	}
	var ge *googleapi.Error
	var re *oauth2.RetrieveError
	var ne *net.OpError
	var dns *net.DNSError
	switch {
	case errors.As(err, &ne) && ne.Op == "dial" || errors.As(err, &dns):
		// Offline, most likely: say so before the transport's details.
		return fmt.Errorf("%s: cannot reach Google Drive; check the network connection: %w", what, err)
	case errors.Is(err, fs.ErrNotExist) || isNotFound(err):
		return fmt.Errorf("%s: %w", what, fs.ErrNotExist)
	case errors.As(err, &re):
		return fmt.Errorf("%s: Google refused the sign-in (%s): %w", what, re.ErrorCode, ErrAuth)
	case errors.As(err, &ge) && ge.Code == http.StatusUnauthorized:
		return fmt.Errorf("%s: Google Drive refused the credentials (401): %w", what, ErrAuth)
	case errors.As(err, &ge) && ge.Code == http.StatusForbidden && isQuota(ge):
		return fmt.Errorf("%s: %w", what, ErrQuota)
	case errors.As(err, &ge) && ge.Code == http.StatusForbidden && hasReason(ge, "insufficientPermissions", "insufficientFilePermissions", "appNotAuthorizedToFile", "forbidden"):
		return fmt.Errorf("%s: the app may not use this Drive folder (%s): %w", what, ge.Errors[0].Reason, ErrAuth)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// quoteQ quotes a string for a Drive query.
func quoteQ(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
