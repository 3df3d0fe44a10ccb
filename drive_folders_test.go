package drivesync

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/api/drive/v3"
	"google.golang.org/api/option"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// The day folders' housekeeping over the fake Drive, through the real
// drive/v3 client: a full listing removes old empty folders and leaves the
// caches holding what exists; a Create whose folder went makes it again.

// folderTestNow is the fake Drive's clock in these tests.
var folderTestNow = time.Date(2026, 5, 20, 12, 0, 0, 0, time.UTC)

func newFolderTestDrive(t *testing.T, folder string) (*drivefake.Server, *DriveRemote) {
	t.Helper()
	srv := drivefake.New(t)
	srv.SetClock(func() time.Time { return folderTestNow })
	return srv, newTestDriveRemote(t, srv.Service(context.Background(), t), folder)
}

func newTestDriveRemote(t *testing.T, svc *drive.Service, folder string) *DriveRemote {
	t.Helper()
	r, err := NewDriveRemote(context.Background(), svc, DriveOptions{Folder: folder, MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func createOrFail(t *testing.T, r Remote, name string) {
	t.Helper()
	if err := r.Create(context.Background(), name, strings.NewReader("content of "+name)); err != nil {
		t.Fatalf("Create(%s): %v", name, err)
	}
}

func deleteOrFail(t *testing.T, r Remote, name string) {
	t.Helper()
	if err := r.Delete(context.Background(), name); err != nil {
		t.Fatalf("Delete(%s): %v", name, err)
	}
}

func listAllOrFail(t *testing.T, r Remote) []string {
	t.Helper()
	files, err := r.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	return names
}

// fakeFolders returns the untrashed folders stored below the root with
// the given id, id -> path.
func fakeFolders(srv *drivefake.Server, root string) map[string]string {
	stored := map[string]drivefake.File{}
	for _, f := range srv.Files() {
		stored[f.ID] = f
	}
	var pathOf func(id string) (string, bool)
	pathOf = func(id string) (string, bool) {
		if id == root {
			return "", true
		}
		f, ok := stored[id]
		if !ok {
			return "", false
		}
		parent, ok := pathOf(f.Parents[0])
		return path.Join(parent, f.Name), ok
	}
	out := map[string]string{}
	for id, f := range stored {
		if p, ok := pathOf(id); ok && id != root && f.MimeType == drivefake.FolderMimeType && !f.Trashed {
			out[id] = p
		}
	}
	return out
}

// rootOf returns the id of the root folder r uses.
func rootOf(r *DriveRemote) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dirs[""]
}

func sortedValues(m map[string]string) []string {
	return slices.Sorted(maps.Values(m))
}

// assertCachesHold checks that r remembers exactly the folders stored
// below its root, and the ids of exactly the files it listed.
func assertCachesHold(t *testing.T, srv *drivefake.Server, r *DriveRemote, listed []string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	root := r.dirs[""]
	want := fakeFolders(srv, root)
	want[root] = ""
	if !maps.Equal(r.folders, want) {
		t.Errorf("folder cache: got %v, want the stored folders %v", sortedValues(r.folders), sortedValues(want))
	}
	for p, id := range r.dirs {
		if want[id] != p {
			t.Errorf("dirs[%q] = %s, which is not a stored folder of that path", p, id)
		}
	}
	if got, want := len(r.dirs), len(slices.Compact(sortedValues(want))); got != want {
		t.Errorf("dirs holds %d paths, want one per stored path, %d", got, want)
	}
	if got := slices.Sorted(maps.Keys(r.ids)); !slices.Equal(got, listed) {
		t.Errorf("file id cache: got %v, want the listed files %v", got, listed)
	}
}

// TestDriveFullListRemovesOldEmptyFolders: after compaction-like deletes,
// a listing since a moment ago removes nothing; a full listing removes
// the old empty day folders and the month and year folders that leaves
// empty, at one request each, keeps the recent ones, those outside the
// layout and those outside the root, and leaves the caches holding what
// exists.
func TestDriveFullListRemovesOldEmptyFolders(t *testing.T) {
	for _, folder := range []string{"", "Visible Sync"} {
		t.Run("folder="+folder, func(t *testing.T) {
			srv, r := newFolderTestDrive(t, folder)
			ctx := context.Background()
			old := []string{ // emptied by compaction below
				"2025/12/31/patch_a", // and with it 2025/12 and 2025
				"2026/03/01/patch_b", // with 2026/03/02, and so 2026/03
				"2026/03/02/patch_c",
				"2026/04/30/patch_d", // 2026/04 keeps 2026/04/01
			}
			recent := "2026/05/14/patch_e" // within the margin: its folder stays
			kept := []string{
				"2026/04/01/patch_f", // an old folder still in use
				"2026/05/20/patch_g", // today
				markerName,
			}
			for _, name := range slices.Concat(old, []string{recent, "notes/x"}, kept) {
				createOrFail(t, r, name)
			}
			if folder != "" {
				// An old, empty day folder outside the root is not ours.
				svc := srv.Service(ctx, t)
				year, err := svc.Files.Create(&drive.File{Name: "2020", MimeType: drivefake.FolderMimeType, Parents: []string{"root"}}).Do()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := svc.Files.Create(&drive.File{Name: "01", MimeType: drivefake.FolderMimeType, Parents: []string{year.Id}}).Do(); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range slices.Concat(old, []string{recent, "notes/x"}) {
				deleteOrFail(t, r, name)
			}
			before := len(srv.Files())

			// An ordinary listing removes nothing and costs one request.
			srv.ResetRequests()
			if _, err := r.List(ctx, folderTestNow.Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
			if n := srv.Requests(); n != 1 || len(srv.Files()) != before {
				t.Fatalf("a listing since an hour ago: %d requests, %d of %d files left; want 1 request and nothing removed", n, len(srv.Files()), before)
			}

			srv.ResetRequests()
			listed := listAllOrFail(t, r)
			if want := slices.Sorted(slices.Values(kept)); !slices.Equal(listed, want) {
				t.Errorf("List: got %v, want %v", listed, want)
			}
			got := sortedValues(fakeFolders(srv, rootOf(r)))
			want := []string{"2026", "2026/04", "2026/04/01", "2026/05", "2026/05/14", "2026/05/20", "notes"}
			if !slices.Equal(got, want) {
				t.Errorf("folders after a full listing: got %v, want %v", got, want)
			}
			removed := 7 // 2025/12/31, 2025/12, 2025, 2026/03/01, 2026/03/02, 2026/03, 2026/04/30
			if n := srv.Requests(); n != 1+removed {
				t.Errorf("the full listing cost %d requests, want 1 and one per removed folder, %d: %v", n, 1+removed, srv.RequestLog())
			}
			if folder != "" {
				if got := sortedValues(fakeFolders(srv, drivefake.RootID)); !slices.Contains(got, "2020/01") {
					t.Errorf("folders in My Drive: got %v, want 2020/01 outside the root kept", got)
				}
			}
			assertCachesHold(t, srv, r, listed)

			// Nothing left to remove: the next full listing is one request.
			srv.ResetRequests()
			listAllOrFail(t, r)
			if n := srv.Requests(); n != 1 {
				t.Errorf("a second full listing cost %d requests, want 1: %v", n, srv.RequestLog())
			}

			// The device goes on writing today, into its folder.
			srv.ResetRequests()
			createOrFail(t, r, "2026/05/20/patch_h")
			if n := srv.Requests(); n != 2 {
				t.Errorf("a Create into today's folder cost %d requests, want 2 (name check, upload): %v", n, srv.RequestLog())
			}
		})
	}
}

// TestDriveCachesForgetFoldersOthersRemoved: a long-running device
// remembers the folders it made; once another device removed them, its
// next full listing leaves it remembering only what exists.
func TestDriveCachesForgetFoldersOthersRemoved(t *testing.T) {
	srv, a := newFolderTestDrive(t, "")
	b := newTestDriveRemote(t, srv.Service(context.Background(), t), "")
	var names []string
	for day := folderTestNow.AddDate(0, -3, 0); day.Before(folderTestNow); day = day.AddDate(0, 0, 1) {
		name := day.Format("2006/01/02") + "/patch_" + day.Format("20060102")
		createOrFail(t, a, name)
		names = append(names, name)
	}
	for _, name := range names[:len(names)-3] {
		deleteOrFail(t, b, name)
	}
	listAllOrFail(t, b) // b removes the emptied folders
	a.mu.Lock()
	remembered := len(a.folders)
	a.mu.Unlock()
	listed := listAllOrFail(t, a)
	if want := names[len(names)-3:]; !slices.Equal(listed, want) {
		t.Fatalf("List: got %v, want %v", listed, want)
	}
	assertCachesHold(t, srv, a, listed)
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.folders) >= remembered/2 {
		t.Errorf("a remembers %d folders after the full listing, %d before; want far fewer", len(a.folders), remembered)
	}
}

// TestDriveKeepsFolderTheListingLags: a folder made a moment ago that
// Drive's index does not list yet stays remembered, so that the next file
// goes into it rather than into a duplicate.
func TestDriveKeepsFolderTheListingLags(t *testing.T) {
	srv, r := newFolderTestDrive(t, "")
	createOrFail(t, r, "2026/05/19/patch_a")
	srv.SetListingLag(5)
	createOrFail(t, r, "2026/05/20/patch_b")
	listAllOrFail(t, r)
	srv.SetListingLag(0)
	createOrFail(t, r, "2026/05/20/patch_c")
	days := 0
	for _, p := range fakeFolders(srv, rootOf(r)) {
		if p == "2026/05/20" {
			days++
		}
	}
	if days != 1 {
		t.Errorf("%d folders 2026/05/20, want 1", days)
	}
}

// hookTransport runs a test's action before forwarding the next request
// that matches, once: another device's doing between two requests.
type hookTransport struct {
	next   http.RoundTripper
	mu     sync.Mutex
	match  func(*http.Request) bool
	action func()
}

func (h *hookTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	h.mu.Lock()
	action := h.action
	if action != nil && h.match(req) {
		h.action = nil
	} else {
		action = nil
	}
	h.mu.Unlock()
	if action != nil {
		action()
	}
	return h.next.RoundTrip(req)
}

func (h *hookTransport) before(match func(*http.Request) bool, action func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.match, h.action = match, action
}

func isUpload(req *http.Request) bool {
	return req.Method == http.MethodPost && strings.HasPrefix(req.URL.Path, "/upload/")
}

// TestDriveCreateAfterFolderRemoved: the folder a device remembers is
// removed (by another device's tidying, or a person) before or during a
// Create; the file still ends up listed and readable.
func TestDriveCreateAfterFolderRemoved(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		folder string
		remove string // which folder goes: the day, or its month
		trash  bool   // trashed rather than deleted (only in My Drive)
		during bool   // between the Create's name check and its upload
	}{
		{name: "day deleted between Creates", remove: "day"},
		{name: "month deleted between Creates", remove: "month"},
		{name: "day deleted during Create", remove: "day", during: true},
		{name: "month deleted during Create", remove: "month", during: true},
		{name: "day trashed between Creates", folder: "Visible Sync", remove: "day", trash: true},
		{name: "month trashed during Create", folder: "Visible Sync", remove: "month", trash: true, during: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := drivefake.New(t)
			srv.SetClock(func() time.Time { return folderTestNow })
			hook := &hookTransport{next: srv.Client().Transport}
			svc, err := drive.NewService(ctx, option.WithEndpoint(srv.URL+"/drive/v3/"),
				option.WithHTTPClient(&http.Client{Transport: hook}), option.WithoutAuthentication())
			if err != nil {
				t.Fatal(err)
			}
			r := newTestDriveRemote(t, svc, tc.folder)
			// An old day: a device's upload held up for weeks, writing
			// into a folder that another device found empty and removed.
			createOrFail(t, r, "2026/04/01/patch_a")
			deleteOrFail(t, r, "2026/04/01/patch_a")
			r.mu.Lock()
			target := r.dirs["2026/04/01"]
			if tc.remove == "month" {
				target = r.dirs["2026/04"]
			}
			r.mu.Unlock()
			other := srv.Service(ctx, t)
			remove := func() {
				var err error
				if tc.trash {
					_, err = other.Files.Update(target, &drive.File{Trashed: true}).Do()
				} else {
					err = other.Files.Delete(target).Do()
				}
				if err != nil {
					t.Errorf("removing the folder: %v", err)
				}
			}
			if tc.during {
				hook.before(isUpload, remove)
			} else {
				remove()
			}

			createOrFail(t, r, "2026/04/01/patch_b")

			for _, dev := range []*DriveRemote{r, newTestDriveRemote(t, srv.Service(ctx, t), tc.folder)} {
				if got, want := listAllOrFail(t, dev), []string{"2026/04/01/patch_b"}; !slices.Equal(got, want) {
					t.Errorf("List: got %v, want %v", got, want)
				}
				rc, err := dev.Open(ctx, "2026/04/01/patch_b")
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				content, err := io.ReadAll(rc)
				rc.Close()
				if want := "content of 2026/04/01/patch_b"; err != nil || string(content) != want {
					t.Errorf("content: got %q, %v; want %q", content, err, want)
				}
			}
			for _, f := range srv.Files() {
				if f.Name == "patch_b" && f.Trashed {
					t.Error("a copy of the file was left in the trash")
				}
			}
		})
	}
}

// TestCompactionOverDriveTidiesFolders: devices sync over Drive for two
// weeks with a one-day retention. Compaction deletes the old patch files;
// the next full listing (a new device's first sync) removes the day
// folders that left empty, but not the last week's, and every record
// still reaches the new device.
func TestCompactionOverDriveTidiesFolders(t *testing.T) {
	srv := drivefake.New(t)
	var mu sync.Mutex
	clk := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	srv.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return clk })
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clk = clk.Add(d) }
	var devs []*device
	for _, name := range []string{"dev-a", "dev-b"} {
		d := driveDevice(t, srv, name)
		d.cfg.Retention = 24 * time.Hour
		d.open()
		devs = append(devs, d)
	}
	a, b := devs[0], devs[1]
	for day := range 14 {
		a.put("n", fmt.Sprintf(`{"day":%d}`, day))
		b.put(fmt.Sprint("b", day), `{"v":1}`)
		syncAll(t, a, b)
		advance(24 * time.Hour)
	}
	a.snapshot()
	advance(time.Hour)
	// A sync right after the jump may read the clock as Drive last said
	// it, and not yet see the snapshot as old enough to compact with.
	deleted := 0
	for range 3 {
		deleted += a.sync().Deleted
	}
	if deleted == 0 {
		t.Fatal("the syncs after the snapshot compacted nothing")
	}
	root := rootOf(a.remote.(*DriveRemote))
	before := fakeFolders(srv, root)

	c := driveDevice(t, srv, "dev-c")
	syncAll(t, a, b, c)
	assertConverged(t, a, b, c)

	after := fakeFolders(srv, root)
	t.Logf("%d patch files compacted; %d folders before the full listing, %d after", deleted, len(before), len(after))
	if len(after) >= len(before) {
		t.Errorf("%d folders before the full listing, %d after: want the emptied ones removed", len(before), len(after))
	}
	inside := map[string]bool{}
	for _, f := range srv.Files() {
		inside[f.Parents[0]] = true
	}
	mu.Lock()
	now := clk
	mu.Unlock()
	for id, dir := range after {
		if removableFolder(dir, now) && !inside[id] {
			t.Errorf("folder %s is old and empty, and was kept", dir)
		}
	}
	for id, dir := range before {
		if _, kept := after[id]; !kept && !removableFolder(dir, now) {
			t.Errorf("folder %s was removed within the margin", dir)
		}
	}
}
