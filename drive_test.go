package drivesync_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/drive/v3"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/drivefake"
	"github.com/drivesync/drivesync/remotetest"
)

// fastRetries keeps the tests' backoff short; the behaviour is the same.
var fastRetries = drivesync.DriveOptions{MinSleep: time.Millisecond, MaxSleep: 5 * time.Millisecond}

func newDrive(t *testing.T, srv *drivefake.Server, opts drivesync.DriveOptions) *drivesync.DriveRemote {
	t.Helper()
	ctx := context.Background()
	r, err := drivesync.NewDriveRemote(ctx, srv.Service(ctx, t), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDriveRemoteConformance(t *testing.T) {
	for _, folder := range []string{"", "My App Sync"} {
		t.Run("folder="+folder, func(t *testing.T) {
			remotetest.Run(t, func(t *testing.T) drivesync.Remote {
				opts := fastRetries
				opts.Folder = folder
				return newDrive(t, drivefake.New(t), opts)
			}, remotetest.Options{CreateMayRace: true})
		})
	}
}

func createFile(t *testing.T, r drivesync.Remote, name, content string) {
	t.Helper()
	if err := r.Create(context.Background(), name, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
}

// TestDriveRetries: rate limits, server errors and dropped connections are
// retried (honouring Retry-After); auth and quota failures are not.
func TestDriveRetries(t *testing.T) {
	srv := drivefake.New(t)
	r := newDrive(t, srv, fastRetries)
	createFile(t, r, "2026/11/22/a", "hello")
	ctx := context.Background()
	for _, f := range []drivefake.Fault{
		{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusForbidden, Reason: "userRateLimitExceeded", Times: 2},
		{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusForbidden, Reason: "rateLimitExceeded", Times: 1},
		{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusTooManyRequests, RetryAfter: "0", Times: 2},
		{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusServiceUnavailable, Times: 2},
		{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusInternalServerError, Times: 1},
		{Method: "GET", PathPrefix: "/drive/v3/files", ResetMidBody: true, Times: 1},
	} {
		srv.Fail(f)
		files, err := r.List(ctx, time.Time{})
		if err != nil || len(files) != 1 {
			t.Errorf("fault %+v: List = %v, %v; want it retried to success", f, files, err)
		}
	}
	// Retry-After is honoured: the call waits at least that long.
	srv.Fail(drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusTooManyRequests, RetryAfter: "1", Times: 1})
	start := time.Now()
	if _, err := r.List(ctx, time.Time{}); err != nil || time.Since(start) < time.Second {
		t.Errorf("Retry-After: err %v after %v, want success after at least 1s", err, time.Since(start))
	}
	for _, tc := range []struct {
		fault drivefake.Fault
		want  error
	}{
		{drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusUnauthorized, Times: 1}, drivesync.ErrAuth},
		{drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusForbidden, Reason: "storageQuotaExceeded", Times: 1}, drivesync.ErrQuota},
		{drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusForbidden, Reason: "insufficientPermissions", Times: 1}, drivesync.ErrAuth},
	} {
		srv.ResetRequests()
		srv.Fail(tc.fault)
		_, err := r.List(ctx, time.Time{})
		if !errors.Is(err, tc.want) || srv.Requests() != 1 {
			t.Errorf("fault %+v: got %v after %d requests, want %v at once", tc.fault, err, srv.Requests(), tc.want)
		}
	}
	// A deadline bounds the retries.
	slow := newDrive(t, srv, drivesync.DriveOptions{MinSleep: 50 * time.Millisecond, MaxSleep: time.Second, MaxAttempts: 1000})
	srv.Fail(drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files", Status: http.StatusServiceUnavailable, Times: 1000})
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := slow.List(dctx, time.Time{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the deadline", err)
	}
}

func TestDriveUploadIsVerified(t *testing.T) {
	srv := drivefake.New(t)
	r := newDrive(t, srv, fastRetries)
	// A create whose response is lost is retried; the content is read
	// again from the start.
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload/drive/v3/files", Status: http.StatusServiceUnavailable, Times: 1})
	createFile(t, r, "2026/11/22/b", "payload")
	rc, err := r.Open(context.Background(), "2026/11/22/b")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "payload" {
		t.Fatalf("got %q", got)
	}
}

func TestDriveDuplicateDayFolders(t *testing.T) {
	srv := drivefake.New(t)
	ctx := context.Background()
	a := newDrive(t, srv, fastRetries)
	createFile(t, a, "2026/11/22/from-a", "a")
	// Another device created the same day folder at the same moment:
	// a second "22" under the same "11", with its own file.
	var month string
	for _, f := range srv.Files() {
		if f.Name == "11" && f.MimeType == drivefake.FolderMimeType {
			month = f.ID
		}
	}
	svc := srv.Service(ctx, t)
	dup, err := svc.Files.Create(&drive.File{Name: "22", MimeType: drivefake.FolderMimeType, Parents: []string{month}}).Do()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Files.Create(&drive.File{Name: "from-b", Parents: []string{dup.Id}}).Media(strings.NewReader("b")).Do(); err != nil {
		t.Fatal(err)
	}
	folders := 0
	for _, f := range srv.Files() {
		if f.MimeType == drivefake.FolderMimeType && f.Name == "22" {
			folders++
		}
	}
	if folders != 2 {
		t.Fatalf("%d day folders named 22, want the duplicate", folders)
	}
	for _, r := range []*drivesync.DriveRemote{a, newDrive(t, srv, fastRetries)} {
		files, err := r.List(ctx, time.Time{})
		if err != nil || len(files) != 2 {
			t.Fatalf("List = %v, %v; want the files of both folders", files, err)
		}
		for _, name := range []string{"2026/11/22/from-a", "2026/11/22/from-b"} {
			rc, err := r.Open(ctx, name)
			if err != nil {
				t.Fatalf("Open(%s): %v", name, err)
			}
			rc.Close()
		}
	}
	c := newDrive(t, srv, fastRetries)
	if err := c.Delete(ctx, "2026/11/22/from-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(ctx, "2026/11/22/from-b"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after Delete: %v", err)
	}
}

// TestDriveDeleteFallsBackToTrash: where Drive refuses a permanent delete
// (a file the app may not delete), the file is trashed instead.
func TestDriveDeleteFallsBackToTrash(t *testing.T) {
	srv := drivefake.New(t)
	opts := fastRetries
	opts.Folder = "Visible"
	r := newDrive(t, srv, opts)
	createFile(t, r, "2026/11/22/old", "x")
	srv.Fail(drivefake.Fault{Method: "DELETE", PathPrefix: "/drive/v3/files/", Status: http.StatusForbidden, Reason: "insufficientFilePermissions", Times: 1})
	if err := r.Delete(context.Background(), "2026/11/22/old"); err != nil {
		t.Fatal(err)
	}
	trashed := false
	for _, f := range srv.Files() {
		if f.Name == "old" {
			trashed = f.Trashed
		}
	}
	if !trashed {
		t.Fatal("the file was neither deleted nor trashed")
	}
	if files, _ := r.List(context.Background(), time.Time{}); len(files) != 0 {
		t.Fatalf("a trashed file is still listed: %v", files)
	}
}

// TestRealDrive runs the conformance suite against a real Google Drive
// account, in fresh visible folders (scope drive.file). It needs a
// Desktop-app OAuth client JSON and a token file from SignIn:
//
//	DRIVESYNC_TEST_CREDENTIALS=client.json DRIVESYNC_TEST_TOKEN=token.json go test -run TestRealDrive .
func TestRealDrive(t *testing.T) {
	creds, tokenPath := os.Getenv("DRIVESYNC_TEST_CREDENTIALS"), os.Getenv("DRIVESYNC_TEST_TOKEN")
	if creds == "" || tokenPath == "" {
		t.Skip("set DRIVESYNC_TEST_CREDENTIALS and DRIVESYNC_TEST_TOKEN to test against a real Drive")
	}
	ctx := context.Background()
	data, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := google.ConfigFromJSON(data, drivesync.ScopeFile)
	if err != nil {
		t.Fatal(err)
	}
	store := drivesync.NewFileTokenStore(tokenPath)
	tok, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := drive.NewService(ctx, option.WithHTTPClient(oauth2.NewClient(ctx, drivesync.SavingTokenSource(ctx, cfg, tok, store))))
	if err != nil {
		t.Fatal(err)
	}
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		folder := fmt.Sprintf("drivesync-test-%d", time.Now().UnixNano())
		r, err := drivesync.NewDriveRemote(ctx, svc, drivesync.DriveOptions{Folder: folder})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}, remotetest.Options{CreateMayRace: true})
}

// TestDriveUnseekableUploadKeepsError: content that cannot be read again
// is not retried, and the error is Drive's own answer, not a note that
// no retry was possible.
func TestDriveUnseekableUploadKeepsError(t *testing.T) {
	srv := drivefake.New(t)
	r := newDrive(t, srv, fastRetries)
	createFile(t, r, "2026/11/22/warm", "x") // the day folder exists
	srv.ResetRequests()
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload/drive/v3/files", Status: http.StatusServiceUnavailable, Times: 1})
	err := r.Create(context.Background(), "2026/11/22/c", io.MultiReader(strings.NewReader("payload")))
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "503") {
		t.Fatalf("got %v, want Drive's 503", err)
	}
	if n := srv.Requests(); n != 2 { // the name check and one upload
		t.Errorf("%d requests, want 2: %v", n, srv.RequestLog())
	}
}
