package drivefake_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/api/drive/v3"
	"google.golang.org/api/googleapi"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// setup starts a fake and returns it with a real client pointed at it.
func setup(t *testing.T) (*drivefake.Server, *drive.Service, context.Context) {
	t.Helper()
	ctx := t.Context()
	srv := drivefake.New(t)
	return srv, srv.Service(ctx, t), ctx
}

// fakeClock is a settable clock for Server.SetClock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func mkdir(t *testing.T, ctx context.Context, svc *drive.Service, name, parent string) *drive.File {
	t.Helper()
	f, err := svc.Files.Create(&drive.File{Name: name, MimeType: drivefake.FolderMimeType, Parents: []string{parent}}).Context(ctx).Do()
	if err != nil {
		t.Fatalf("creating folder %q: %v", name, err)
	}
	return f
}

func upload(t *testing.T, ctx context.Context, svc *drive.Service, name, parent, content string) *drive.File {
	t.Helper()
	f, err := svc.Files.Create(&drive.File{Name: name, Parents: []string{parent}}).
		Media(strings.NewReader(content)).Context(ctx).Do()
	if err != nil {
		t.Fatalf("uploading %q: %v", name, err)
	}
	return f
}

func list(t *testing.T, ctx context.Context, svc *drive.Service, spaces, q string) []*drive.File {
	t.Helper()
	var out []*drive.File
	call := svc.Files.List().Q(q).Fields("nextPageToken, files(id, name, parents, createdTime)")
	if spaces != "" {
		call = call.Spaces(spaces)
	}
	err := call.Pages(ctx, func(l *drive.FileList) error {
		out = append(out, l.Files...)
		return nil
	})
	if err != nil {
		t.Fatalf("listing q=%q: %v", q, err)
	}
	return out
}

func names(files []*drive.File) []string {
	var out []string
	for _, f := range files {
		out = append(out, f.Name)
	}
	return out
}

func sortedNames(files []*drive.File) []string {
	out := names(files)
	slices.Sort(out)
	return out
}

// apiError returns err as a *googleapi.Error with the given code and reason,
// or fails the test.
func apiError(t *testing.T, err error, code int, reason string) *googleapi.Error {
	t.Helper()
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) {
		t.Fatalf("got error %v (%T), want a *googleapi.Error", err, err)
	}
	if gerr.Code != code || len(gerr.Errors) == 0 || gerr.Errors[0].Reason != reason {
		t.Fatalf("got %v (code %d, errors %+v), want code %d reason %q", err, gerr.Code, gerr.Errors, code, reason)
	}
	return gerr
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func TestCreateFolderUploadAndListByParent(t *testing.T) {
	srv, svc, ctx := setup(t)
	clock := newClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	srv.SetClock(clock.Now)

	dir := mkdir(t, ctx, svc, "sync", "root")
	if dir.Id == "" || dir.MimeType != drivefake.FolderMimeType || !slices.Equal(dir.Parents, []string{drivefake.RootID}) {
		t.Fatalf("folder = %+v", dir)
	}

	srv.ResetRequests()
	f := upload(t, ctx, svc, "a.txt", dir.Id, "hello")
	if got, want := srv.RequestLog(), []string{"POST /upload/drive/v3/files"}; !slices.Equal(got, want) {
		t.Errorf("a small upload sent %q, want %q", got, want)
	}
	if f.Size != 5 || f.Md5Checksum != md5hex("hello") || f.Name != "a.txt" {
		t.Errorf("uploaded file = size %d md5 %s name %q", f.Size, f.Md5Checksum, f.Name)
	}
	if f.MimeType != "text/plain" {
		t.Errorf("mimeType = %q, want the sniffed text/plain", f.MimeType)
	}
	if f.CreatedTime != "2026-03-01T12:00:00.000Z" || f.ModifiedTime != f.CreatedTime {
		t.Errorf("createdTime %q modifiedTime %q, want the server clock", f.CreatedTime, f.ModifiedTime)
	}
	if !slices.Equal(f.Parents, []string{dir.Id}) || !slices.Equal(f.Spaces, []string{"drive"}) {
		t.Errorf("parents %q spaces %q", f.Parents, f.Spaces)
	}
	upload(t, ctx, svc, "b.bin", dir.Id, "\x00\x01\x02")
	upload(t, ctx, svc, "elsewhere.txt", "root", "x")

	got := list(t, ctx, svc, "", fmt.Sprintf("'%s' in parents and trashed = false", dir.Id))
	if want := []string{"a.txt", "b.bin"}; !slices.Equal(sortedNames(got), want) {
		t.Errorf("listing the folder gave %q, want %q", sortedNames(got), want)
	}
	got = list(t, ctx, svc, "", "'root' in parents")
	if want := []string{"elsewhere.txt", "sync"}; !slices.Equal(sortedNames(got), want) {
		t.Errorf("listing root gave %q, want %q", sortedNames(got), want)
	}

	files := srv.Files()
	if len(files) != 4 {
		t.Fatalf("Files() has %d files, want 4", len(files))
	}
	if s := files[1]; s.ID != f.Id || string(s.Content) != "hello" || s.Size != 5 || s.MD5 != md5hex("hello") ||
		s.Space != drivefake.SpaceDrive || !slices.Equal(s.Parents, []string{dir.Id}) || s.Trashed ||
		!s.CreatedTime.Equal(clock.Now()) {
		t.Errorf("Files()[1] = %+v", s)
	}
}

func TestDownload(t *testing.T) {
	_, svc, ctx := setup(t)
	content := strings.Repeat("0123456789", 1000)
	f := upload(t, ctx, svc, "big.txt", "root", content)

	resp, err := svc.Files.Get(f.Id).Context(ctx).Download()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != content {
		t.Errorf("downloaded %d bytes, want %d", len(body), len(content))
	}

	meta, err := svc.Files.Get(f.Id).Fields("id, name, size, md5Checksum").Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if meta.Name != "big.txt" || meta.Size != int64(len(content)) || meta.Md5Checksum != md5hex(content) {
		t.Errorf("metadata = %+v", meta)
	}

	dir := mkdir(t, ctx, svc, "d", "root")
	_, err = svc.Files.Get(dir.Id).Context(ctx).Download()
	apiError(t, err, 403, "fileNotDownloadable")
}

func TestNotFound(t *testing.T) {
	_, svc, ctx := setup(t)
	const id = "1nosuchfile"

	_, err := svc.Files.Get(id).Context(ctx).Do()
	gerr := apiError(t, err, 404, "notFound")
	if gerr.Message != "File not found: 1nosuchfile." {
		t.Errorf("message = %q", gerr.Message)
	}
	var body struct {
		Error struct {
			Code    int
			Message string
			Errors  []struct{ Domain, Reason, Message string }
		}
	}
	if err := json.Unmarshal([]byte(gerr.Body), &body); err != nil {
		t.Fatalf("error body %q: %v", gerr.Body, err)
	}
	e := body.Error
	if e.Code != 404 || e.Message != "File not found: 1nosuchfile." || len(e.Errors) != 1 ||
		e.Errors[0].Domain != "global" || e.Errors[0].Reason != "notFound" || e.Errors[0].Message != e.Message {
		t.Errorf("error body = %s", gerr.Body)
	}

	_, err = svc.Files.Get(id).Context(ctx).Download()
	apiError(t, err, 404, "notFound")
	err = svc.Files.Delete(id).Context(ctx).Do()
	apiError(t, err, 404, "notFound")
	_, err = svc.Files.Update(id, &drive.File{Name: "x"}).Context(ctx).Do()
	apiError(t, err, 404, "notFound")
	_, err = svc.Files.Create(&drive.File{Name: "orphan", Parents: []string{id}}).Context(ctx).Do()
	apiError(t, err, 404, "notFound")
}

func TestDelete(t *testing.T) {
	srv, svc, ctx := setup(t)
	dir := mkdir(t, ctx, svc, "dir", "root")
	sub := mkdir(t, ctx, svc, "sub", dir.Id)
	upload(t, ctx, svc, "deep.txt", sub.Id, "deep")
	keep := upload(t, ctx, svc, "keep.txt", "root", "keep")
	gone := upload(t, ctx, svc, "gone.txt", "root", "gone")

	if err := svc.Files.Delete(gone.Id).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	_, err := svc.Files.Get(gone.Id).Context(ctx).Do()
	apiError(t, err, 404, "notFound")
	err = svc.Files.Delete(gone.Id).Context(ctx).Do()
	apiError(t, err, 404, "notFound")

	// Deleting a folder deletes what is inside it.
	if err := svc.Files.Delete(dir.Id).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	files := srv.Files()
	if len(files) != 1 || files[0].ID != keep.Id {
		t.Errorf("after the deletes Files() = %+v, want only keep.txt", files)
	}
}

// TestCreateInDeletedOrTrashedFolder: as on Drive, a file cannot be
// created in a folder that was deleted, while one created in a trashed
// folder is accepted and trashed with it, so that no listing of untrashed
// files shows it.
func TestCreateInDeletedOrTrashedFolder(t *testing.T) {
	srv, svc, ctx := setup(t)
	deleted := mkdir(t, ctx, svc, "deleted", "root")
	trashed := mkdir(t, ctx, svc, "trashed", "root")
	if err := svc.Files.Delete(deleted.Id).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Files.Update(trashed.Id, &drive.File{Trashed: true}).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}

	_, err := svc.Files.Create(&drive.File{Name: "lost", Parents: []string{deleted.Id}}).
		Media(strings.NewReader("x")).Context(ctx).Do()
	gerr := apiError(t, err, 404, "notFound")
	if want := "File not found: " + deleted.Id + "."; gerr.Message != want {
		t.Errorf("message = %q, want %q", gerr.Message, want)
	}
	_, err = svc.Files.Create(&drive.File{Name: "sub", MimeType: drivefake.FolderMimeType, Parents: []string{deleted.Id}}).Context(ctx).Do()
	apiError(t, err, 404, "notFound")
	if n := len(srv.Files()); n != 1 {
		t.Errorf("%d files stored, want only the trashed folder", n)
	}
	if got := list(t, ctx, svc, "", fmt.Sprintf("'%s' in parents", deleted.Id)); len(got) != 0 {
		t.Errorf("listing the deleted folder's children gave %q, want nothing (and no error)", names(got))
	}

	f, err := svc.Files.Create(&drive.File{Name: "hidden", Parents: []string{trashed.Id}}).
		Media(strings.NewReader("x")).Fields("id, trashed").Context(ctx).Do()
	if err != nil {
		t.Fatalf("creating in a trashed folder: %v, want it accepted", err)
	}
	if !f.Trashed {
		t.Error("the file created in a trashed folder is not reported trashed")
	}
	if got := list(t, ctx, svc, "", "trashed = false"); len(got) != 0 {
		t.Errorf("trashed = false listed %q, want nothing", names(got))
	}
}

func TestDuplicateNamesAreAllowed(t *testing.T) {
	_, svc, ctx := setup(t)
	a := upload(t, ctx, svc, "same.txt", "root", "one")
	b := upload(t, ctx, svc, "same.txt", "root", "two")
	if a.Id == b.Id {
		t.Fatalf("both uploads got id %s", a.Id)
	}
	got := list(t, ctx, svc, "", "name = 'same.txt' and 'root' in parents")
	if len(got) != 2 {
		t.Errorf("found %d files named same.txt, want 2", len(got))
	}
}

func TestAppDataFolder(t *testing.T) {
	srv, svc, ctx := setup(t)
	app := upload(t, ctx, svc, "state.json", "appDataFolder", `{"v":1}`)
	upload(t, ctx, svc, "visible.txt", "root", "x")

	if !slices.Equal(app.Parents, []string{drivefake.AppDataFolderID}) || !slices.Equal(app.Spaces, []string{"appDataFolder"}) {
		t.Errorf("appdata file parents %q spaces %q", app.Parents, app.Spaces)
	}
	folder, err := svc.Files.Get("appDataFolder").Fields("id").Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if folder.Id != drivefake.AppDataFolderID || folder.MimeType != drivefake.FolderMimeType {
		t.Errorf("files.get(appDataFolder) = %+v", folder)
	}

	if got := names(list(t, ctx, svc, "appDataFolder", "")); !slices.Equal(got, []string{"state.json"}) {
		t.Errorf("spaces=appDataFolder listed %q", got)
	}
	if got := names(list(t, ctx, svc, "", "")); !slices.Equal(got, []string{"visible.txt"}) {
		t.Errorf("the default space listed %q", got)
	}
	if got := names(list(t, ctx, svc, "appDataFolder", "'appDataFolder' in parents")); !slices.Equal(got, []string{"state.json"}) {
		t.Errorf("'appDataFolder' in parents listed %q", got)
	}
	if got := list(t, ctx, svc, "drive,appDataFolder", ""); len(got) != 2 {
		t.Errorf("both spaces listed %q", names(got))
	}

	// Drive cannot trash appdata files: they can only be deleted.
	_, err = svc.Files.Update(app.Id, &drive.File{Trashed: true}).Context(ctx).Do()
	apiError(t, err, 403, "notSupportedForAppDataFolderFiles")
	if srv.Files()[0].Trashed {
		t.Error("the refused trash trashed the file")
	}
	if err := svc.Files.Delete(app.Id).Context(ctx).Do(); err != nil {
		t.Errorf("deleting an appdata file: %v", err)
	}
}

func TestTrashInMyDrive(t *testing.T) {
	srv, svc, ctx := setup(t)
	dir := mkdir(t, ctx, svc, "dir", "root")
	upload(t, ctx, svc, "inner.txt", dir.Id, "x")
	upload(t, ctx, svc, "outer.txt", "root", "y")

	f, err := svc.Files.Update(dir.Id, &drive.File{Trashed: true}).Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if !f.Trashed {
		t.Error("update did not report the folder trashed")
	}
	if got := sortedNames(list(t, ctx, svc, "", "trashed = false")); !slices.Equal(got, []string{"outer.txt"}) {
		t.Errorf("trashed = false listed %q", got)
	}
	// Files in a trashed folder are trashed too.
	if got := sortedNames(list(t, ctx, svc, "", "trashed = true")); !slices.Equal(got, []string{"dir", "inner.txt"}) {
		t.Errorf("trashed = true listed %q", got)
	}
	// Like Drive, a plain list includes the trash.
	if got := list(t, ctx, svc, "", ""); len(got) != 3 {
		t.Errorf("a plain list gave %q", names(got))
	}

	// Untrash: the client only sends false when told to.
	_, err = svc.Files.Update(dir.Id, &drive.File{Trashed: false, ForceSendFields: []string{"Trashed"}}).Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range srv.Files() {
		if f.Trashed {
			t.Errorf("%s (%s) still trashed after untrash", f.Name, f.ID)
		}
	}
}

func TestUpdate(t *testing.T) {
	srv, svc, ctx := setup(t)
	clock := newClock(time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC))
	srv.SetClock(clock.Now)
	a := mkdir(t, ctx, svc, "a", "root")
	b := mkdir(t, ctx, svc, "b", "root")
	f := upload(t, ctx, svc, "f.txt", a.Id, "v1")

	clock.Advance(time.Minute)
	srv.ResetRequests()
	g, err := svc.Files.Update(f.Id, &drive.File{Name: "g.txt", AppProperties: map[string]string{"k": "v"}}).
		AddParents(b.Id).RemoveParents(a.Id).Media(strings.NewReader("version two")).Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := srv.RequestLog(), []string{"PATCH /upload/drive/v3/files/" + f.Id}; !slices.Equal(got, want) {
		t.Errorf("update with media sent %q, want %q", got, want)
	}
	if g.Name != "g.txt" || !slices.Equal(g.Parents, []string{b.Id}) || g.Size != 11 ||
		g.Md5Checksum != md5hex("version two") || g.AppProperties["k"] != "v" {
		t.Errorf("updated file = %+v", g)
	}
	if g.CreatedTime != f.CreatedTime || g.ModifiedTime != "2026-05-01T00:01:00.000Z" {
		t.Errorf("createdTime %s modifiedTime %s", g.CreatedTime, g.ModifiedTime)
	}
	if g.Version <= f.Version {
		t.Errorf("version went from %d to %d", f.Version, g.Version)
	}

	// Moving a folder into itself is refused.
	_, err = svc.Files.Update(b.Id, &drive.File{}).AddParents(b.Id).RemoveParents("root").Context(ctx).Do()
	apiError(t, err, 400, "badRequest")
}

func TestResumableUpload(t *testing.T) {
	srv, svc, ctx := setup(t)
	content := bytes.Repeat([]byte("resumable!"), 60_000) // 600 kB: three 256 KiB chunks
	srv.ResetRequests()
	f, err := svc.Files.Create(&drive.File{Name: "large.bin", Parents: []string{"appDataFolder"}}).
		Media(bytes.NewReader(content), googleapi.ChunkSize(googleapi.MinUploadChunkSize), googleapi.ContentType("application/octet-stream")).
		Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"POST /upload/drive/v3/files", "POST /upload/drive/v3/files", "POST /upload/drive/v3/files", "POST /upload/drive/v3/files"}
	if got := srv.RequestLog(); !slices.Equal(got, want) {
		t.Errorf("resumable upload sent %q, want %q", got, want)
	}
	if f.Size != int64(len(content)) || f.Md5Checksum != md5hex(string(content)) || f.MimeType != "application/octet-stream" {
		t.Errorf("uploaded file = size %d md5 %s mime %s", f.Size, f.Md5Checksum, f.MimeType)
	}
	if got := srv.Files()[0]; !bytes.Equal(got.Content, content) || got.Space != drivefake.SpaceAppData {
		t.Errorf("stored %d bytes in space %s", len(got.Content), got.Space)
	}

	// files.update can upload new content the same way.
	content = bytes.Repeat([]byte("second version "), 30_000)
	srv.ResetRequests()
	g, err := svc.Files.Update(f.Id, &drive.File{}).
		Media(bytes.NewReader(content), googleapi.ChunkSize(googleapi.MinUploadChunkSize)).Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"PATCH /upload/drive/v3/files/" + f.Id, "POST /upload/drive/v3/files/" + f.Id, "POST /upload/drive/v3/files/" + f.Id}
	if got := srv.RequestLog(); !slices.Equal(got, want) {
		t.Errorf("resumable update sent %q, want %q", got, want)
	}
	if g.Id != f.Id || g.Size != int64(len(content)) || !bytes.Equal(srv.Files()[0].Content, content) {
		t.Errorf("updated file = id %s size %d", g.Id, g.Size)
	}
}

func TestListByTime(t *testing.T) {
	srv, svc, ctx := setup(t)
	clock := newClock(time.Date(2025, 12, 31, 23, 59, 59, 0, time.UTC))
	srv.SetClock(clock.Now)
	for _, name := range []string{"f0", "f1", "f2", "f3"} {
		upload(t, ctx, svc, name, "root", name)
		clock.Advance(time.Second)
	}
	// Created at 23:59:59, 00:00:00, 00:00:01, 00:00:02. Touch f1 later.
	clock.Advance(time.Hour)
	f1 := list(t, ctx, svc, "", "name = 'f1'")[0]
	if _, err := svc.Files.Update(f1.Id, &drive.File{Name: "f1"}).Media(strings.NewReader("new")).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		q    string
		want []string
	}{
		{"createdTime > '2026-01-01T00:00:00Z'", []string{"f2", "f3"}},
		{"createdTime >= '2026-01-01T00:00:00Z'", []string{"f1", "f2", "f3"}},
		{"createdTime < '2026-01-01T00:00:00Z'", []string{"f0"}},
		{"createdTime <= '2026-01-01T00:00:00Z'", []string{"f0", "f1"}},
		{"createdTime = '2026-01-01T00:00:01Z'", []string{"f2"}},
		{"createdTime != '2026-01-01T00:00:01Z'", []string{"f0", "f1", "f3"}},
		{"createdTime >= '2026-01-01T01:00:00+01:00'", []string{"f1", "f2", "f3"}},
		{"createdTime > '2026-01-01T00:00:00'", []string{"f2", "f3"}}, // no offset: UTC
		{"createdTime >= '2026-01-01T00:00:00.500Z' and createdTime < '2026-01-01T00:00:02Z'", []string{"f2"}},
		{"modifiedTime > '2026-01-01T00:30:00Z'", []string{"f1"}},
		{"modifiedTime <= '2026-01-01T00:30:00Z' and not name = 'f0'", []string{"f2", "f3"}},
	}
	for _, tt := range tests {
		if got := sortedNames(list(t, ctx, svc, "", tt.q)); !slices.Equal(got, tt.want) {
			t.Errorf("q=%q: got %q, want %q", tt.q, got, tt.want)
		}
	}
}

func TestListOrderBy(t *testing.T) {
	srv, svc, ctx := setup(t)
	clock := newClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	srv.SetClock(clock.Now)
	for _, name := range []string{"b", "C", "a"} {
		upload(t, ctx, svc, name, "root", name)
		clock.Advance(time.Second)
	}
	mkdir(t, ctx, svc, "z-dir", "root")

	for _, tt := range []struct {
		orderBy string
		want    []string
	}{
		{"", []string{"b", "C", "a", "z-dir"}}, // creation order
		{"createdTime", []string{"b", "C", "a", "z-dir"}},
		{"createdTime desc", []string{"z-dir", "a", "C", "b"}},
		{"name", []string{"a", "b", "C", "z-dir"}},
		{"name desc", []string{"z-dir", "C", "b", "a"}},
		{"folder,name", []string{"z-dir", "a", "b", "C"}},
		{"folder, createdTime desc", []string{"z-dir", "a", "C", "b"}},
	} {
		l, err := svc.Files.List().OrderBy(tt.orderBy).Context(ctx).Do()
		if err != nil {
			t.Fatalf("orderBy=%q: %v", tt.orderBy, err)
		}
		if got := names(l.Files); !slices.Equal(got, tt.want) {
			t.Errorf("orderBy=%q: got %q, want %q", tt.orderBy, got, tt.want)
		}
	}
	_, err := svc.Files.List().OrderBy("size").Context(ctx).Do()
	apiError(t, err, 400, "invalid")
}

func TestPagination(t *testing.T) {
	srv, svc, ctx := setup(t)
	const n = 2500
	dir := mkdir(t, ctx, svc, "many", "root")
	for i := range n {
		_, err := svc.Files.Create(&drive.File{Name: fmt.Sprintf("f%04d", i), Parents: []string{dir.Id}}).Context(ctx).Do()
		if err != nil {
			t.Fatal(err)
		}
	}

	srv.ResetRequests()
	seen := make(map[string]bool)
	var pages []int
	err := svc.Files.List().Q(fmt.Sprintf("'%s' in parents", dir.Id)).PageSize(1000).OrderBy("name").
		Fields("nextPageToken, files(id, name)").Pages(ctx, func(l *drive.FileList) error {
		pages = append(pages, len(l.Files))
		for _, f := range l.Files {
			if seen[f.Id] {
				t.Errorf("%s listed twice", f.Name)
			}
			seen[f.Id] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pages, []int{1000, 1000, 500}) || len(seen) != n {
		t.Errorf("pages of %v, %d distinct files; want 1000, 1000, 500 and %d", pages, len(seen), n)
	}
	if srv.Requests() != 3 {
		t.Errorf("listing took %d requests (%q), want 3", srv.Requests(), srv.RequestLog())
	}
	for _, line := range srv.RequestLog() {
		if line != "GET /drive/v3/files" {
			t.Errorf("request %q, want only GET /drive/v3/files", line)
		}
	}

	// The default page size is 100; more than 1000 is refused.
	l, err := svc.Files.List().Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Files) != 100 || l.NextPageToken == "" {
		t.Errorf("default page: %d files, token %q", len(l.Files), l.NextPageToken)
	}
	_, err = svc.Files.List().PageSize(1001).Context(ctx).Do()
	apiError(t, err, 400, "invalid")
	_, err = svc.Files.List().PageToken("bogus").Context(ctx).Do()
	apiError(t, err, 400, "invalid")
	// A token belongs to its query.
	_, err = svc.Files.List().Q("name = 'x'").PageToken(l.NextPageToken).Context(ctx).Do()
	apiError(t, err, 400, "invalid")
}

func TestPagingIsStableUnderWrites(t *testing.T) {
	_, svc, ctx := setup(t)
	for i := range 5 {
		upload(t, ctx, svc, fmt.Sprintf("f%d", i), "root", "x")
	}
	first, err := svc.Files.List().PageSize(2).Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	// Deleting a file already listed must not make the next page skip one.
	if err := svc.Files.Delete(first.Files[0].Id).Context(ctx).Do(); err != nil {
		t.Fatal(err)
	}
	second, err := svc.Files.List().PageSize(2).PageToken(first.NextPageToken).Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if got := names(second.Files); !slices.Equal(got, []string{"f2", "f3"}) {
		t.Errorf("second page = %q, want [f2 f3]", got)
	}
}

func TestInvalidQuery(t *testing.T) {
	_, svc, ctx := setup(t)
	for _, q := range []string{
		"name = ",
		"name = 'unterminated",
		"name == 'x'",
		"(name = 'x'",
		"name = 'x' and",
		"size > 5",
		"createdTime > 'yesterday'",
		"'x' in owners",
		"trashed = maybe",
	} {
		_, err := svc.Files.List().Q(q).Context(ctx).Do()
		apiError(t, err, 400, "invalid")
	}
	for _, q := range []string{
		`name = 'Valentine\'s Day'`,
		`name contains 'x' or not (mimeType = 'a/b' and trashed != true)`,
		"  ",
	} {
		if _, err := svc.Files.List().Q(q).Context(ctx).Do(); err != nil {
			t.Errorf("q=%q: %v", q, err)
		}
	}
}

func TestQueryMatchesThroughClient(t *testing.T) {
	_, svc, ctx := setup(t)
	upload(t, ctx, svc, "Valentine's Day.txt", "root", "x")
	upload(t, ctx, svc, `back\slash`, "root", "x")
	upload(t, ctx, svc, "HelloWorld report-2026.txt", "root", "x")
	mkdir(t, ctx, svc, "folder", "root")

	for _, tt := range []struct {
		q    string
		want []string
	}{
		{`name = 'Valentine\'s Day.txt'`, []string{"Valentine's Day.txt"}},
		{`name = 'back\\slash'`, []string{`back\slash`}},
		{"name contains 'hello'", []string{"HelloWorld report-2026.txt"}},
		{"name contains 'World'", nil}, // Drive matches word prefixes only
		{"name contains '2026'", []string{"HelloWorld report-2026.txt"}},
		{"mimeType = 'application/vnd.google-apps.folder'", []string{"folder"}},
		{"mimeType != 'application/vnd.google-apps.folder' and name contains 'back'", []string{`back\slash`}},
		{"not mimeType contains 'text' and not mimeType contains 'folder'", nil},
	} {
		if got := sortedNames(list(t, ctx, svc, "", tt.q)); !slices.Equal(got, tt.want) {
			t.Errorf("q=%q: got %q, want %q", tt.q, got, tt.want)
		}
	}
}

func TestListingLag(t *testing.T) {
	srv, svc, ctx := setup(t)
	upload(t, ctx, svc, "old.txt", "root", "x")
	srv.SetListingLag(2)
	f := upload(t, ctx, svc, "new.txt", "root", "x")

	if _, err := svc.Files.Get(f.Id).Context(ctx).Do(); err != nil {
		t.Errorf("files.get does not see the new file at once: %v", err)
	}
	for i := range 2 {
		if got := names(list(t, ctx, svc, "", "")); !slices.Equal(got, []string{"old.txt"}) {
			t.Errorf("list %d: got %q, want only old.txt", i+1, got)
		}
	}
	if got := names(list(t, ctx, svc, "", "")); !slices.Equal(got, []string{"old.txt", "new.txt"}) {
		t.Errorf("list 3: got %q, want both files", got)
	}
}

func TestFaults(t *testing.T) {
	tests := []struct {
		name       string
		fault      drivefake.Fault
		wantCode   int
		wantReason string
	}{
		{"user rate limit", drivefake.Fault{Status: 403, Reason: "userRateLimitExceeded"}, 403, "userRateLimitExceeded"},
		{"rate limit", drivefake.Fault{Status: 403, Reason: "rateLimitExceeded"}, 403, "rateLimitExceeded"},
		{"storage quota", drivefake.Fault{Status: 403, Reason: "storageQuotaExceeded"}, 403, "storageQuotaExceeded"},
		{"too many requests", drivefake.Fault{Status: 429, RetryAfter: "7"}, 429, "rateLimitExceeded"},
		{"internal error", drivefake.Fault{Status: 500}, 500, "backendError"},
		{"unavailable", drivefake.Fault{Status: 503}, 503, "backendError"},
		{"expired credentials", drivefake.Fault{Status: 401}, 401, "authError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, svc, ctx := setup(t)
			srv.Fail(tt.fault)
			_, err := svc.Files.List().Context(ctx).Do()
			gerr := apiError(t, err, tt.wantCode, tt.wantReason)
			if got := gerr.Header.Get("Retry-After"); got != tt.fault.RetryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.fault.RetryAfter)
			}
			if gerr.Message == "" || gerr.Errors[0].Message == "" {
				t.Errorf("error without a message: %v", gerr)
			}
			// The fault is used up.
			if _, err := svc.Files.List().Context(ctx).Do(); err != nil {
				t.Errorf("second request: %v", err)
			}
		})
	}
}

func TestFaultMatchingAndTimes(t *testing.T) {
	srv, svc, ctx := setup(t)
	srv.Fail(
		drivefake.Fault{Method: "POST", PathPrefix: "/upload/", Status: 503, Times: 2},
		drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/about", Status: 500},
	)
	// Neither fault matches a list.
	if _, err := svc.Files.List().Context(ctx).Do(); err != nil {
		t.Fatalf("list: %v", err)
	}
	for range 2 {
		_, err := svc.Files.Create(&drive.File{Name: "x"}).Media(strings.NewReader("x")).Context(ctx).Do()
		apiError(t, err, 503, "backendError")
	}
	if len(srv.Files()) != 0 {
		t.Error("a faulted create stored a file")
	}
	upload(t, ctx, svc, "x", "root", "x")
	_, err := svc.About.Get().Fields("user").Context(ctx).Do()
	apiError(t, err, 500, "backendError")
	if _, err := svc.About.Get().Fields("user").Context(ctx).Do(); err != nil {
		t.Errorf("about after the fault: %v", err)
	}
}

func TestResetMidBody(t *testing.T) {
	srv, svc, ctx := setup(t)
	content := strings.Repeat("abcdefgh", 512)
	f := upload(t, ctx, svc, "f.bin", "root", content)

	srv.Fail(drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files/" + f.Id, ResetMidBody: true})
	srv.ResetRequests()
	resp, err := svc.Files.Get(f.Id).Context(ctx).Download()
	if err != nil {
		t.Fatalf("the headers should arrive intact: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("read %d bytes without error, want a broken connection", len(body))
	}
	var gerr *googleapi.Error
	if errors.As(err, &gerr) {
		t.Errorf("got a googleapi error %v, want a transport error", err)
	}
	if len(body) != len(content)/2 || !strings.HasPrefix(content, string(body)) {
		t.Errorf("got %d bytes before the reset, want the first %d", len(body), len(content)/2)
	}
	if srv.Requests() != 1 {
		t.Errorf("the reset download took requests %q, want one", srv.RequestLog())
	}

	// The next download is whole again.
	resp, err = svc.Files.Get(f.Id).Context(ctx).Download()
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != content {
		t.Errorf("second download: %d bytes, %v", len(body), err)
	}

	// A reset create is carried out although the client sees it fail.
	srv.Fail(drivefake.Fault{Method: "POST", ResetMidBody: true})
	_, err = svc.Files.Create(&drive.File{Name: "ghost"}).Media(strings.NewReader("boo")).Context(ctx).Do()
	if err == nil || errors.As(err, &gerr) {
		t.Fatalf("create: got %v, want a transport error", err)
	}
	if got := list(t, ctx, svc, "", "name = 'ghost'"); len(got) != 1 {
		t.Errorf("the reset create stored %d files, want 1", len(got))
	}
}

func TestDateHeader(t *testing.T) {
	srv, svc, ctx := setup(t)
	at := time.Date(2030, 7, 4, 10, 30, 0, 0, time.FixedZone("X", 3600))
	srv.SetClock(func() time.Time { return at })
	want := "Thu, 04 Jul 2030 09:30:00 GMT"

	about, err := svc.About.Get().Fields("user, storageQuota").Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if got := about.Header.Get("Date"); got != want {
		t.Errorf("Date = %q, want %q", got, want)
	}
	srv.Fail(drivefake.Fault{Status: 429})
	_, err = svc.Files.List().Context(ctx).Do()
	if got := apiError(t, err, 429, "rateLimitExceeded").Header.Get("Date"); got != want {
		t.Errorf("Date on an error = %q, want %q", got, want)
	}
	_, err = svc.Files.Get("1missing").Context(ctx).Do()
	if got := apiError(t, err, 404, "notFound").Header.Get("Date"); got != want {
		t.Errorf("Date on a 404 = %q, want %q", got, want)
	}
}

func TestAbout(t *testing.T) {
	_, svc, ctx := setup(t)
	upload(t, ctx, svc, "a", "root", "12345")
	upload(t, ctx, svc, "b", "appDataFolder", "123")

	about, err := svc.About.Get().Fields("user, storageQuota").Context(ctx).Do()
	if err != nil {
		t.Fatal(err)
	}
	if about.User == nil || about.User.EmailAddress == "" || about.StorageQuota == nil {
		t.Fatalf("about = %+v", about)
	}
	if q := about.StorageQuota; q.Usage != 8 || q.Limit <= q.Usage {
		t.Errorf("quota = %+v", q)
	}
	// Drive requires fields on about.get.
	_, err = svc.About.Get().Context(ctx).Do()
	apiError(t, err, 400, "required")
}

func TestRequestCounting(t *testing.T) {
	srv, svc, ctx := setup(t)
	if srv.Requests() != 0 {
		t.Fatalf("a new server has served %d requests", srv.Requests())
	}
	f := upload(t, ctx, svc, "a", "root", "x")
	srv.Fail(drivefake.Fault{Status: 500})
	svc.Files.Get(f.Id).Context(ctx).Do() // faulted, still counted
	svc.Files.Get(f.Id).Context(ctx).Do()
	svc.Files.Delete(f.Id).Context(ctx).Do()

	want := []string{
		"POST /upload/drive/v3/files",
		"GET /drive/v3/files/" + f.Id,
		"GET /drive/v3/files/" + f.Id,
		"DELETE /drive/v3/files/" + f.Id,
	}
	if got := srv.RequestLog(); !slices.Equal(got, want) || srv.Requests() != len(want) {
		t.Errorf("Requests() = %d, RequestLog() = %q; want %q", srv.Requests(), got, want)
	}
	srv.ResetRequests()
	if srv.Requests() != 0 || len(srv.RequestLog()) != 0 {
		t.Errorf("after ResetRequests: %d requests, log %q", srv.Requests(), srv.RequestLog())
	}
}

func TestConcurrentClients(t *testing.T) {
	srv, svc, ctx := setup(t)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 10 {
				name := fmt.Sprintf("w%d-%d", i, j)
				if _, err := svc.Files.Create(&drive.File{Name: name}).Media(strings.NewReader(name)).Context(ctx).Do(); err != nil {
					t.Error(err)
				}
				if _, err := svc.Files.List().Q("name contains 'w'").Context(ctx).Do(); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if got := len(srv.Files()); got != 80 {
		t.Errorf("stored %d files, want 80", got)
	}
	if srv.Requests() != 160 {
		t.Errorf("served %d requests, want 160", srv.Requests())
	}
}

// TestUnknownMethod checks that a request outside the fake fails loudly
// rather than pretending to succeed.
func TestUnknownMethod(t *testing.T) {
	srv, _, _ := setup(t)
	resp, err := srv.Client().Get(srv.URL + "/drive/v3/changes/startPageToken")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("status %d, want 404", resp.StatusCode)
	}
}
