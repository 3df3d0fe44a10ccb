package drivesync

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// folderTempPrefix starts the name of every temp file FolderRemote writes.
// The leading "." hides it from List on every machine, and the fixed prefix
// lets List tell our leftovers from other tools' dot files.
const folderTempPrefix = ".drivesync-tmp-"

// folderTempMaxAge is how old a temp file must be before List removes it.
// A Create that has not finished within a day has crashed; a younger file
// may belong to a Create still running in another process.
const folderTempMaxAge = 24 * time.Hour

// emptyFolderMargin is how long after its day ends an empty day folder
// is kept; the same goes for a month's and a year's folder after their
// month and year. FolderRemote and DriveRemote remove only empty folders of
// the YYYY/MM/DD layout older than that, so that the folders a remote
// holds stay bounded by its files: the retention's worth, plus a week,
// plus what was emptied since the last removal.
//
// The margin is what keeps a removal from meeting a device that is
// creating a file in the same folder at that moment. The engine names a
// new file with the remote's time, read moments before the upload (an
// upload recovered from the outbox keeps its old name only for a quarter
// of ListOverlap), so the file goes into today's folder. On Drive every
// device reads Drive's clock; on a shared folder each device reads its
// own, which may be hours or, misconfigured, days off. A week covers
// such a clock and an upload stalled for days (a laptop put to sleep in
// the middle of one); a folder younger than that is never removed,
// however empty. Should a Create still meet a folder just removed, it
// makes the folder again (both remotes do). Compaction empties a day
// only once the retention (by default two months) has passed, so the
// margin matters only with a short Config.Retention.
const emptyFolderMargin = 7 * 24 * time.Hour

// folderLayouts are the layouts of the folders the engine's file names
// make, by depth: the year, the month, the day.
var folderLayouts = [...]string{"2006", "2006/01", "2006/01/02"}

// folderPeriodEnd returns when the period a folder of the YYYY/MM/DD
// layout stands for ends: the next day for "2026/11/22", the first of
// December for "2026/11", New Year 2027 for "2026". ok is false for every
// other path, such as "notes" or "2026/11/22/x": those are never removed.
func folderPeriodEnd(dir string) (end time.Time, ok bool) {
	depth := strings.Count(dir, "/")
	if depth >= len(folderLayouts) {
		return time.Time{}, false
	}
	layout := folderLayouts[depth]
	start, err := time.Parse(layout, dir)
	if err != nil || start.Format(layout) != dir {
		return time.Time{}, false
	}
	switch depth {
	case 0:
		return start.AddDate(1, 0, 0), true
	case 1:
		return start.AddDate(0, 1, 0), true
	}
	return start.AddDate(0, 0, 1), true
}

// removableFolder reports whether dir, a slash-separated path below the
// root, is a folder of the YYYY/MM/DD layout that may be removed once
// empty: its period ended at least emptyFolderMargin before now, by the
// remote's clock.
func removableFolder(dir string, now time.Time) bool {
	end, ok := folderPeriodEnd(dir)
	return ok && !now.Before(end.Add(emptyFolderMargin))
}

// recentFolder reports whether dir is a folder of the YYYY/MM/DD layout
// too young to be removed: a device may be creating files in it.
func recentFolder(dir string, now time.Time) bool {
	end, ok := folderPeriodEnd(dir)
	return ok && now.Before(end.Add(emptyFolderMargin))
}

// A FolderRemote is a Remote over a local directory that something else
// shares between machines: Dropbox, iCloud Drive, Syncthing, a network share
// or a USB stick. Several processes on one machine may use the same directory
// at once; they coordinate only through the file system, so a FolderRemote
// holds no state beyond the directory's path.
//
// Files are written to a hidden temp file and then published under their
// final name without overwriting, so neither another process nor a sync tool
// ever sees a half-written file, and two devices creating the same name
// cannot clobber each other.
//
// Day folders do not pile up: Delete and List remove the folders of the
// YYYY/MM/DD layout that are empty and whose day (or month, or year)
// ended more than a week ago by the local clock, with os.Remove, which
// fails on a folder that is not empty; List only those untouched for a
// day. The week keeps a removal from meeting another device creating a
// file in that folder, even one whose clock is days off or whose upload
// stalled for days; a Create whose folder was removed all the same makes
// it again. Nothing else is removed: not the root, not a
// folder that holds anything, even a dot file, and not a folder outside
// the layout, which other apps may own.
type FolderRemote struct {
	dir string // absolute path of the root
}

var _ IdentifiedRemote = (*FolderRemote)(nil)

// NewFolderRemote returns a FolderRemote rooted at dir, made absolute so that
// a later change of working directory does not move it.
//
// The folder need not be there yet: a USB stick or network share may be
// unmounted while the app opens its database, which works offline. Every
// operation then fails with an error that says the folder is missing and
// does not match fs.ErrNotExist (the remote is unreachable, not empty),
// so Sync fails with ErrRemote and changes nothing. FolderRemote never
// creates the folder itself: creating it on an unmounted mount point would
// silently sync into a folder on the local disk that no other device sees.
// A path that exists but is not a folder is refused at once.
func NewFolderRemote(dir string) (*FolderRemote, error) {
	if dir == "" {
		return nil, errors.New("folder remote: empty folder path")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("folder remote: %w", err)
	}
	r := &FolderRemote{dir: abs}
	if err := r.checkRoot(); err != nil && !errors.Is(err, errFolderMissing) {
		return nil, err
	}
	return r, nil
}

// errFolderMissing marks a root folder that is not there.
var errFolderMissing = errors.New("folder is missing")

// missingFolderError says which folder is missing and what to do.
type missingFolderError struct{ dir string }

func (e *missingFolderError) Error() string {
	return "folder remote: folder " + e.dir + " does not exist; create it, or check that the drive holding it is mounted"
}

func (e *missingFolderError) Unwrap() error { return errFolderMissing }

// checkRoot reports a root that is missing or not a folder.
func (r *FolderRemote) checkRoot() error {
	info, err := os.Stat(r.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &missingFolderError{r.dir}
	case err != nil:
		return fmt.Errorf("folder remote: %w", err)
	case !info.IsDir():
		return fmt.Errorf("folder remote: %s is not a folder", r.dir)
	}
	return nil
}

// path maps a checked name to its place on disk.
func (r *FolderRemote) path(name string) string {
	return filepath.Join(r.dir, filepath.FromSlash(name))
}

// List returns every regular file under the root, whatever since is. Files
// that other machines write reach this folder through sync tools late and in
// any order, so a file created remotely before since may appear here only
// after it; listing everything is the only way never to miss one, and the
// engine skips the files it has already applied.
//
// Files and folders whose names start with "." are skipped: they are our temp
// files or belong to the OS and sync tools (.DS_Store, .stfolder, .dropbox).
// Temp files of ours older than a day are left over from a crashed Create, and
// List removes them.
//
// Since every List walks the whole tree, it also sees which old day folders
// are empty, at no cost, and removes them (see removeEmptyFolders and
// folderTouched): those a Delete could not remove yet because they were too
// young, and those other machines emptied.
func (r *FolderRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("folder remote: list: %w", err)
	}
	if err := r.checkRoot(); err != nil {
		return nil, err
	}
	now := time.Now()
	staleBefore := now.Add(-folderTempMaxAge)
	var files []RemoteFile
	// The walk visits a folder before what is in it, so it knows which
	// folders are old enough to remove before counting their entries.
	var old []string            // removable folders, parents first
	entries := map[string]int{} // removable folder -> entries found in it
	// os.DirFS follows the root if it is a symlink (a moved Dropbox folder
	// often is) and yields slash-separated names, which is what we return.
	err := fs.WalkDir(os.DirFS(r.dir), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			// Another process or the sync tool may delete a file or folder
			// while we walk; it is simply not listed. A missing root is a
			// real error: an empty list would look like an empty remote.
			if name != "." && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		parent := path.Dir(name)
		if _, ok := entries[parent]; ok {
			entries[parent]++ // anything at all keeps the folder
		}
		if strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			if strings.HasPrefix(d.Name(), folderTempPrefix) {
				if info, err := d.Info(); err == nil && info.ModTime().Before(staleBefore) {
					// Best effort; the next List tries again.
					if os.Remove(r.path(name)) == nil {
						if _, ok := entries[parent]; ok {
							entries[parent]--
						}
					}
				}
			}
			return nil
		}
		if d.IsDir() && removableFolder(name, now) && !folderTouched(d, now) {
			old = append(old, name)
			entries[name] = 0
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		files = append(files, RemoteFile{Name: name, Size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("folder remote: list: %w", err)
	}
	r.removeEmptyFolders(old, entries)
	return files, nil
}

// listsEverything says that List shows the whole folder, whatever since
// is (see listsEverything).
func (r *FolderRemote) listsEverything() bool { return true }

// folderTouched reports whether the folder d was made or changed within
// folderTempMaxAge of now, by its modification time: a Create may have
// just made it, or a sync tool be filling it. List leaves such a folder
// for a later List, so that a Create never has to make its folder again
// more than once, however often other processes list. Delete has no such
// check: it removes only the folders its own file leaves empty, once.
func folderTouched(d fs.DirEntry, now time.Time) bool {
	info, err := d.Info()
	return err != nil || now.Sub(info.ModTime()).Abs() < folderTempMaxAge
}

// removeEmptyFolders removes the folders of old, which the walk found
// removable and listed parents first, that held nothing: children before
// parents, so that a month whose days all went goes too. os.Remove fails
// on a folder that something was put in since the walk, and it is kept.
func (r *FolderRemote) removeEmptyFolders(old []string, entries map[string]int) {
	for _, dir := range slices.Backward(old) {
		if entries[dir] > 0 || os.Remove(r.path(dir)) != nil {
			continue
		}
		if parent := path.Dir(dir); parent != "." {
			if _, ok := entries[parent]; ok {
				entries[parent]--
			}
		}
	}
}

// Open opens the named file for reading. The caller must close it.
func (r *FolderRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := checkRemoteName(name); err != nil {
		return nil, fmt.Errorf("folder remote: open: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("folder remote: open %s: %w", name, err)
	}
	f, err := os.Open(r.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		if rerr := r.checkRoot(); rerr != nil {
			return nil, rerr // the folder went away: not a missing file
		}
	}
	if err != nil {
		return nil, fmt.Errorf("folder remote: open %s: %w", name, err)
	}
	return f, nil
}

// Create writes content to a hidden temp file beside the final name, syncs
// it to disk, and only then publishes it with a hard link, which fails rather
// than overwrite an existing file, even one another process is publishing at
// the same moment.
//
// Some file systems have no hard links (FAT and exFAT USB sticks, some cloud
// drive and network mounts). There Create checks that the name is free and
// renames the temp file onto it. That leaves a small window in which two
// processes creating the same name at the same moment may both succeed, one
// file replacing the other.
func (r *FolderRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if err := checkRemoteName(name); err != nil {
		return fmt.Errorf("folder remote: create: %w", err)
	}
	if err := r.create(ctx, name, content); err != nil {
		return fmt.Errorf("folder remote: create %s: %w", name, err)
	}
	return nil
}

func (r *FolderRemote) create(ctx context.Context, name string, content io.Reader) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	final := r.path(name)
	dir := filepath.Dir(final)
	tmp, err := r.createTemp(dir)
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after publishing too: the link leaves the temp name behind
	err = copyWithContext(ctx, tmp, content)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}

	err = os.Link(tmp.Name(), final)
	if errors.Is(err, fs.ErrExist) {
		return fs.ErrExist
	}
	if err != nil {
		// Most likely the file system has no hard links (EPERM, ENOTSUP,
		// EXDEV, EMLINK, or Windows' equivalents), so fall back to rename,
		// which would overwrite: look first, and accept the race window
		// documented on Create.
		if _, serr := os.Lstat(final); serr == nil {
			return fs.ErrExist
		} else if !errors.Is(serr, fs.ErrNotExist) {
			return serr
		}
		if err := os.Rename(tmp.Name(), final); err != nil {
			return err
		}
	}
	syncDir(dir)
	return nil
}

// createTemp creates a new temp file in dir, creating the folders below
// the root as needed but never the root itself. Another process may remove
// dir or a folder above it, found empty and old, between our making it and
// our creating the file (see emptyFolderMargin), so a folder that is
// missing is made again. Once the temp file is in dir, no removal can
// take dir away before the file is published beside it.
func (r *FolderRemote) createTemp(dir string) (*os.File, error) {
	for attempt := 0; ; attempt++ {
		err := r.mkdirBelowRoot(dir)
		var f *os.File
		if err == nil {
			f, err = os.OpenFile(filepath.Join(dir, folderTempPrefix+rand.Text()), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		}
		// A missing root is errFolderMissing, not fs.ErrNotExist: it is
		// not made, so it is not tried again.
		if errors.Is(err, fs.ErrNotExist) && attempt < 3 {
			continue
		}
		return f, err
	}
}

// mkdirBelowRoot makes dir and its parents up to, not including, the root,
// which must exist: os.MkdirAll would make an unmounted root on the local
// disk.
func (r *FolderRemote) mkdirBelowRoot(dir string) error {
	if err := r.checkRoot(); err != nil {
		return err
	}
	rel, err := filepath.Rel(r.dir, dir)
	if err != nil || rel == "." {
		return err
	}
	path := r.dir
	for elem := range strings.SplitSeq(rel, string(filepath.Separator)) {
		path = filepath.Join(path, elem)
		if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			if errors.Is(err, fs.ErrNotExist) {
				if rerr := r.checkRoot(); rerr != nil {
					return rerr
				}
			}
			return err
		}
	}
	return nil
}

// syncDir makes a new directory entry in dir durable, so that a crash right
// after Create cannot lose a file that another device may already have seen.
// Errors are ignored: Windows and some file systems cannot sync a directory,
// and the file itself is already published.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}

// copyWithContext copies src to dst in chunks, checking ctx between them so
// that a large or slow copy stops promptly once ctx is done.
func copyWithContext(ctx context.Context, dst io.Writer, src io.Reader) error {
	buf := make([]byte, 64<<10)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Delete removes the named file, then the folders of the YYYY/MM/DD layout
// that removing it left empty, if they are old enough (see
// emptyFolderMargin); a younger one is removed by a List once it is old.
func (r *FolderRemote) Delete(ctx context.Context, name string) error {
	if err := checkRemoteName(name); err != nil {
		return fmt.Errorf("folder remote: delete: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("folder remote: delete %s: %w", name, err)
	}
	p := r.path(name)
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return r.checkRoot() // gone already, unless the folder is
		}
		return fmt.Errorf("folder remote: delete %s: %w", name, err)
	}
	// Removing a folder fails unless it is empty, so this never removes
	// another file, and stops at the first folder still in use. The root
	// is "." here, never removable.
	now := time.Now()
	for dir := path.Dir(name); removableFolder(dir, now); dir = path.Dir(dir) {
		if os.Remove(r.path(dir)) != nil {
			break
		}
	}
	return nil
}

// Identity returns the folder's absolute path, with symbolic links
// resolved: a link moved to another folder is another remote.
func (r *FolderRemote) Identity(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("folder remote: identity: %w", err)
	}
	dir, err := filepath.EvalSymlinks(r.dir)
	if err != nil {
		return "", fmt.Errorf("folder remote: identity: %w", err)
	}
	return "folder:" + dir, nil
}

// Now returns the local clock: the files of a shared folder carry no time the
// other devices agree on, so this machine's clock is the best there is.
func (r *FolderRemote) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, fmt.Errorf("folder remote: now: %w", err)
	}
	return time.Now().UTC(), nil
}
