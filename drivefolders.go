package drivesync

import (
	"cmp"
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"google.golang.org/api/drive/v3"
)

// The folders of a DriveRemote: finding and creating the day folders files
// go in, remembering their ids, and removing the old empty ones.

// maxFolderRemovals bounds the folders one listing removes, so that the
// first full listing of a remote that holds years of empty folders (from
// before DriveRemote removed them) is not held up by hundreds of deletes;
// the next full listing goes on.
const maxFolderRemovals = 100

// removeOldFolders deletes the listed folders that are removable (see
// emptyFolderMargin) and hold nothing the listing showed: days first, so
// that a month whose days all go goes too, and its year after it. all is
// the whole listing, folders its folders, already learned.
//
// How a folder goes is removeFolder's. Drive accepts new files into a
// trashed folder, where no listing shows them: a Create that lands in one
// deletes its file and makes the folder again (see Create). Files in the
// trash (where Delete puts a file Drive will not delete) do not keep a
// folder; they go with it, as was meant. A failure ends the tidying until
// the next full listing; the listing itself stands.
func (r *DriveRemote) removeOldFolders(ctx context.Context, all, folders []*drive.File, now time.Time) error {
	inside := map[string]int{} // folder id -> listed files and folders in it
	for _, f := range all {
		for _, p := range f.Parents {
			inside[p]++
		}
	}
	type oldFolder struct {
		id, dir string
		parents []string
	}
	var old []oldFolder
	r.mu.Lock()
	for _, f := range folders {
		if dir, ok := r.folders[f.Id]; ok && removableFolder(dir, now) {
			old = append(old, oldFolder{f.Id, dir, f.Parents})
		}
	}
	r.mu.Unlock()
	slices.SortFunc(old, func(a, b oldFolder) int { // deepest first
		return cmp.Compare(strings.Count(b.dir, "/"), strings.Count(a.dir, "/"))
	})
	removed := 0
	for _, f := range old {
		if inside[f.id] > 0 {
			continue
		}
		if removed == maxFolderRemovals {
			break
		}
		err := r.call(ctx, func() error { return r.removeFolder(ctx, f.id) })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !isNotFound(err) { // not found: another device removed it first
			r.log.Info("drive remote: could not remove an old empty folder; the next full listing tries again", "folder", f.dir, "err", err)
			return nil
		}
		removed++
		for _, p := range f.parents {
			inside[p]--
		}
		r.mu.Lock()
		delete(r.folders, f.id)
		if r.dirs[f.dir] == f.id {
			delete(r.dirs, f.dir) // a Create there learns the folders again
		}
		r.mu.Unlock()
	}
	return nil
}

// removeFolder removes a folder that the listing shows empty. In the app
// data folder only this app writes, and the folder is deleted for good.
// A visible folder may hold files the user put there, which this app,
// seeing only the files it created, does not list: Drive's delete of a
// folder would take them with it, so a visible folder goes to the trash,
// from where the user can still take them back.
func (r *DriveRemote) removeFolder(ctx context.Context, id string) error {
	if r.space == "appDataFolder" {
		return r.svc.Files.Delete(id).Context(ctx).Do()
	}
	_, err := r.svc.Files.Update(id, &drive.File{Trashed: true}).Fields("id").Context(ctx).Do()
	return err
}

// loadFolders learns every folder of the space and its path below a root.
func (r *DriveRemote) loadFolders(ctx context.Context) error {
	all, err := r.query(ctx, fmt.Sprintf("mimeType = '%s' and trashed = false", folderMime), "files(id, name, parents)")
	if err != nil {
		return err
	}
	now, _ := r.date.Now()
	r.learnFolders(all, now)
	return nil
}

// learnFolders replaces the folder caches with the listed folders, every
// folder of the space, so that they hold the folders that exist rather
// than every folder the process ever saw. A remembered folder the listing
// does not show is forgotten, unless it is a recent one of the YYYY/MM/DD
// layout: Drive's index may not list a folder made a moment ago, and
// forgetting it would make a duplicate. Such a folder is kept only until
// it is old (see emptyFolderMargin), and a Create that finds it gone
// makes it again.
func (r *DriveRemote) learnFolders(listed []*drive.File, now time.Time) {
	byID := make(map[string]*drive.File, len(listed))
	for _, f := range listed {
		byID[f.Id] = f
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	folders := map[string]string{}
	for id := range r.roots {
		folders[id] = ""
	}
	for id, p := range r.folders {
		if byID[id] == nil && recentFolder(p, now) {
			folders[id] = p
		}
	}
	var resolve func(id string, depth int) (string, bool)
	resolve = func(id string, depth int) (string, bool) {
		if p, ok := folders[id]; ok {
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
		folders[id] = p
		return p, true
	}
	for id := range byID {
		resolve(id, 0)
	}
	// Files go where they went before, if that folder is still there:
	// a device keeps to one of two duplicate day folders.
	dirs := map[string]string{}
	for id, p := range folders {
		if cur, ok := dirs[p]; !ok || (cur != r.dirs[p] && (id == r.dirs[p] || id < cur)) {
			dirs[p] = id
		}
	}
	r.folders, r.dirs = folders, dirs
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

// forgetDir drops dir and the folders above it, duplicates included, from
// the caches, after a Create found one of them gone: the next ensureDir
// learns from Drive which are still there.
func (r *DriveRemote) forgetDir(dir string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, p := range r.folders {
		if p != "" && (p == dir || strings.HasPrefix(dir, p+"/")) {
			delete(r.folders, id)
			delete(r.dirs, p)
		}
	}
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
