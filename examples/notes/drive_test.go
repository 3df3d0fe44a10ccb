package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/drive/v3"
	"google.golang.org/api/option"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/drivefake"
)

// isolate keeps a test away from the user's settings and sign-in, and from
// the network: the config directory is a temp dir, the notes environment
// variables are cleared, and a sign-in that opens a browser fails the test.
func isolate(t *testing.T) {
	t.Helper()
	home := t.TempDir()
	for _, k := range []string{"HOME", "XDG_CONFIG_HOME", "AppData", "home"} {
		t.Setenv(k, home) // os.UserConfigDir on every OS
	}
	for _, k := range []string{"NOTES_DB", "NOTES_REMOTE", "NOTES_GOOGLE_CREDENTIALS"} {
		t.Setenv(k, "")
	}
	setBrowser(t, func(string) error {
		t.Error("the test tried to open a browser")
		return nil
	})
	setDriveService(t, func(context.Context, *http.Client) (*drive.Service, error) {
		t.Error("the test tried to reach Google Drive")
		return nil, fmt.Errorf("no Google Drive in tests")
	})
}

func setBrowser(t *testing.T, f func(string) error) {
	old := openBrowser
	openBrowser = f
	t.Cleanup(func() { openBrowser = old })
}

func setDriveService(t *testing.T, f func(context.Context, *http.Client) (*drive.Service, error)) {
	old := newDriveService
	newDriveService = f
	t.Cleanup(func() { newDriveService = old })
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDriveErrors(t *testing.T) {
	isolate(t)
	db := filepath.Join(t.TempDir(), "notes.db")
	webClient := writeFile(t, "web.json", `{"web":{"client_id":"x","client_secret":"y","redirect_uris":["https://example.com/"],"auth_uri":"https://example.com/auth","token_uri":"https://example.com/token"}}`)
	notJSON := writeFile(t, "bad.json", `not json`)
	for _, tt := range []struct {
		env  string // NOTES_REMOTE
		args []string
		want string
	}{
		{"", []string{"-db", db, "-drive", "sync"}, "create an OAuth client of type Desktop app"},
		{"", []string{"-db", db, "-drive", "status"}, "NOTES_GOOGLE_CREDENTIALS"},
		{"", []string{"-db", db, "-drive", "signin"}, "create an OAuth client of type Desktop app"},
		// -drive is one remote, -remote or $NOTES_REMOTE another (see
		// TestTwoRemotesRefused).
		{t.TempDir(), []string{"-db", db, "-drive", "sync"}, "unset NOTES_REMOTE"},
		{"", []string{"-db", db, "-drive", "-remote", t.TempDir(), "sync"}, "to sync through Google Drive, leave out -remote"},
		{"", []string{"-remote", t.TempDir(), "-drive", "list"}, "to sync through the folder, leave out -drive"},
		{"", []string{"-db", db, "-drive", "-credentials", filepath.Join(t.TempDir(), "missing.json"), "sync"}, "no such file"},
		{"", []string{"-db", db, "-drive", "-credentials", webClient, "sync"}, "notes needs one of type Desktop app"},
		{"", []string{"-db", db, "-drive", "-credentials", notJSON, "sync"}, "is not the JSON of a Google OAuth client"},
		{"", []string{"-db", db, "-remote", t.TempDir(), "signin"}, "run notes -drive signin"},
		{"", []string{"signout"}, "run notes -drive signout"},
	} {
		t.Setenv("NOTES_REMOTE", tt.env)
		var out, errOut bytes.Buffer
		err := run(tt.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
	if _, err := os.Stat(db); err == nil {
		t.Errorf("a failed -drive command created the database")
	}
}

// fakeGoogle stands in for Google in the -drive tests: a fake Drive, a
// token endpoint and a browser in which the user agrees (or declines) at
// once. Nothing reaches the network.
type fakeGoogle struct {
	t           *testing.T
	drive       *drivefake.Server
	credentials string // the OAuth client JSON
	tokenPath   string

	mu       sync.Mutex
	decline  bool            // the user cancels the sign-in
	signIns  int             // sign-ins the user agreed to
	consents int             // of which with the consent screen forced
	issued   int             // tokens issued, by sign-in or refresh
	revoked  map[string]bool // refresh tokens Google no longer accepts
}

func newFakeGoogle(t *testing.T) *fakeGoogle {
	isolate(t)
	g := &fakeGoogle{t: t, drive: drivefake.New(t), revoked: map[string]bool{}}
	tokenSrv := httptest.NewServer(http.HandlerFunc(g.serveToken))
	t.Cleanup(tokenSrv.Close)
	g.credentials = writeFile(t, "client_secret.json", fmt.Sprintf(`{"installed":{
		"client_id":"notes-test.apps.googleusercontent.com","client_secret":"test-secret",
		"auth_uri":"https://accounts.example.com/o/oauth2/auth","token_uri":%q,
		"redirect_uris":["http://localhost"]}}`, tokenSrv.URL+"/token"))
	path, err := drivesync.DefaultTokenPath("drivesync-notes")
	if err != nil {
		t.Fatal(err)
	}
	g.tokenPath = path
	setBrowser(t, g.browse)
	setDriveService(t, func(ctx context.Context, client *http.Client) (*drive.Service, error) {
		return drive.NewService(ctx, option.WithEndpoint(g.drive.URL+"/drive/v3/"), option.WithHTTPClient(client))
	})
	return g
}

// device returns a cli for one device syncing through the fake Drive.
func (g *fakeGoogle) device(name string) cli {
	return cli{g.t, filepath.Join(g.t.TempDir(), name+".db"), []string{"-drive", "-credentials", g.credentials}}
}

// browse is the user's browser: it comes back to SignIn's redirect address
// with an authorization code, or with access_denied if the user declines.
func (g *fakeGoogle) browse(authURL string) error {
	u, err := url.Parse(authURL)
	if err != nil {
		g.t.Errorf("sign-in URL: %v", err)
		return nil
	}
	q := u.Query()
	if q.Get("scope") != drivesync.ScopeAppData || q.Get("code_challenge") == "" || q.Get("access_type") != "offline" {
		g.t.Errorf("sign-in URL %s: want scope %s, PKCE and offline access", authURL, drivesync.ScopeAppData)
	}
	g.mu.Lock()
	answer := url.Values{"state": {q.Get("state")}, "code": {"the-code"}}
	if g.decline {
		answer = url.Values{"state": {q.Get("state")}, "error": {"access_denied"}}
	} else {
		g.signIns++
		if q.Get("prompt") == "consent" {
			g.consents++
		}
	}
	g.mu.Unlock()
	resp, err := http.Get(q.Get("redirect_uri") + "?" + answer.Encode())
	if err != nil {
		g.t.Errorf("browser: %v", err)
		return nil
	}
	resp.Body.Close()
	return nil
}

// serveToken is Google's token endpoint: it trades the code, or a refresh
// token that is not revoked, for new tokens.
func (g *fakeGoogle) serveToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.Form.Get("grant_type") {
	case "authorization_code":
		if r.Form.Get("code") != "the-code" || r.Form.Get("code_verifier") == "" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"invalid_grant"}`)
			return
		}
	case "refresh_token":
		if g.revoked[r.Form.Get("refresh_token")] {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"invalid_grant","error_description":"Token has been expired or revoked."}`)
			return
		}
	default:
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":"unsupported_grant_type"}`)
		return
	}
	g.issued++
	json.NewEncoder(w).Encode(map[string]any{
		"access_token":  fmt.Sprintf("access-%d", g.issued),
		"refresh_token": fmt.Sprintf("refresh-%d", g.issued),
		"token_type":    "Bearer",
		"expires_in":    3600,
	})
}

// savedToken returns the saved sign-in, checking that only the user can
// read it.
func (g *fakeGoogle) savedToken() *oauth2.Token {
	g.t.Helper()
	fi, err := os.Stat(g.tokenPath)
	if err != nil {
		g.t.Fatalf("no saved sign-in: %v", err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		g.t.Errorf("token file mode %04o, want 0600", mode)
	}
	tok, err := drivesync.NewFileTokenStore(g.tokenPath).Load(context.Background())
	if err != nil {
		g.t.Fatal(err)
	}
	return tok
}

// expireAccessToken makes the next run refresh the access token.
func (g *fakeGoogle) expireAccessToken() {
	g.t.Helper()
	tok := g.savedToken()
	tok.Expiry = time.Now().Add(-time.Hour)
	if err := drivesync.NewFileTokenStore(g.tokenPath).Save(context.Background(), tok); err != nil {
		g.t.Fatal(err)
	}
}

func (g *fakeGoogle) count() (signIns, consents, issued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.signIns, g.consents, g.issued
}

func TestDriveTwoDevices(t *testing.T) {
	g := newFakeGoogle(t)
	a, b := g.device("a"), g.device("b")

	// Notes are written without Drive; the first command that syncs
	// signs in and saves the sign-in, and the next ones, on either
	// device, use it.
	first := strings.TrimSpace(a.run("add", "first note"))
	if signIns, _, _ := g.count(); signIns != 0 {
		t.Fatalf("%d sign-ins after adding a note, want none", signIns)
	}
	a.run("status")
	if signIns, _, _ := g.count(); signIns != 1 {
		t.Fatalf("%d sign-ins after the first command that syncs, want 1", signIns)
	}
	if tok := g.savedToken(); tok.RefreshToken != "refresh-1" {
		t.Errorf("saved refresh token %q, want refresh-1", tok.RefreshToken)
	}
	if got := a.run("sync"); !strings.Contains(got, "sent 1 change") {
		t.Errorf("a sync: %q", got)
	}
	second := strings.TrimSpace(b.run("add", "second note"))
	if got := b.run("sync"); !strings.Contains(got, "received 1 change from 1 file") || !strings.Contains(got, "sent 1 change") {
		t.Errorf("b sync: %q", got)
	}
	if got := a.run("sync"); !strings.Contains(got, "received 1 change") {
		t.Errorf("a's second sync: %q", got)
	}
	for _, c := range []cli{a, b} {
		list := c.run("list")
		for _, want := range []string{first, "first note", second, "second note"} {
			if !strings.Contains(list, want) {
				t.Errorf("%s lists %q, want it to contain %q", c.db, list, want)
			}
		}
	}
	if signIns, _, _ := g.count(); signIns != 1 {
		t.Errorf("%d sign-ins, want 1", signIns)
	}

	// The patch files are in the hidden app-data folder, nowhere else.
	patches := 0
	for _, f := range g.drive.Files() {
		if f.Space != drivefake.SpaceAppData {
			t.Errorf("file %s is in space %s, want %s", f.Name, f.Space, drivefake.SpaceAppData)
		}
		if strings.HasPrefix(f.Name, "patch_") {
			patches++
		}
	}
	if patches != 2 {
		t.Errorf("%d patch files in Drive, want 2", patches)
	}

	// An expired access token is refreshed, and the new one saved.
	g.expireAccessToken()
	if got := a.run("sync"); strings.TrimSpace(got) != "up to date" {
		t.Errorf("sync after the access token expired: %q", got)
	}
	if tok := g.savedToken(); tok.AccessToken != "access-2" || !tok.Expiry.After(time.Now()) {
		t.Errorf("saved token after refresh: access token %q, expiry %v; want access-2, in the future", tok.AccessToken, tok.Expiry)
	}
}

func TestDriveSignInAgain(t *testing.T) {
	g := newFakeGoogle(t)
	a := g.device("a")
	a.run("add", "a note")
	a.run("sync")

	// The user revokes the app's access: the refresh fails, and the error
	// says what to do.
	g.mu.Lock()
	g.revoked[g.savedToken().RefreshToken] = true
	g.mu.Unlock()
	g.expireAccessToken()
	msg := a.fail("sync")
	if !strings.Contains(msg, "sign-in with Google expired or was revoked: run `notes -drive signin` again") {
		t.Errorf("sync with a revoked sign-in: %s", msg)
	}
	if strings.Contains(msg, "refresh-1") || strings.Contains(msg, "access-1") {
		t.Errorf("the error shows a token: %s", msg)
	}

	// signin asks for consent again, so that Google hands out a new
	// refresh token, and saves it; sync works again.
	a.run("signin")
	if signIns, consents, _ := g.count(); signIns != 2 || consents != 1 {
		t.Errorf("%d sign-ins, %d with consent forced; want 2, 1", signIns, consents)
	}
	if tok := g.savedToken(); tok.RefreshToken == "refresh-1" {
		t.Errorf("signin kept the revoked refresh token")
	}
	a.run("add", "another note")
	if got := a.run("sync"); !strings.Contains(got, "sent 1 change") {
		t.Errorf("sync after signing in again: %q", got)
	}
}

func TestDriveSignInCancelled(t *testing.T) {
	g := newFakeGoogle(t)
	g.decline = true
	msg := g.device("a").fail("sync")
	if !strings.Contains(msg, "sign-in cancelled") {
		t.Errorf("declined sign-in: %s", msg)
	}
	if _, err := os.Stat(g.tokenPath); !os.IsNotExist(err) {
		t.Errorf("a declined sign-in saved a token (stat: %v)", err)
	}
}

func TestDriveSignOut(t *testing.T) {
	g := newFakeGoogle(t)
	a := g.device("a")
	a.run("status")
	g.savedToken()
	if got := a.run("signout"); !strings.Contains(got, "signed out") {
		t.Errorf("signout: %q", got)
	}
	if _, err := os.Stat(g.tokenPath); !os.IsNotExist(err) {
		t.Errorf("token file after signout: %v", err)
	}
	if got := a.run("signout"); !strings.Contains(got, "not signed in") {
		t.Errorf("second signout: %q", got)
	}
	// The next command that syncs signs in again.
	a.run("status")
	if signIns, _, _ := g.count(); signIns != 2 {
		t.Errorf("%d sign-ins, want 2", signIns)
	}
}

func TestDriveFull(t *testing.T) {
	g := newFakeGoogle(t)
	a := g.device("a")
	a.run("sync") // creates the store on the Drive
	a.run("add", "a note")
	g.drive.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload/", Status: http.StatusForbidden, Reason: "storageQuotaExceeded"})
	if msg := a.fail("sync"); !strings.Contains(msg, "your Google Drive is full") {
		t.Errorf("sync into a full Drive: %s", msg)
	}
	// The failed sync kept its file for upload; the next one sends it.
	if got := a.run("sync"); !strings.Contains(got, "sent the changes of a sync that failed") {
		t.Errorf("sync once there is room: %q", got)
	}
	if got := g.device("b").run("sync"); !strings.Contains(got, "received 1 change") {
		t.Errorf("another device's sync: %q", got)
	}
}

// TestDriveOffline: with the sign-in saved, the local commands work
// without the network; only sync needs Google Drive.
func TestDriveOffline(t *testing.T) {
	g := newFakeGoogle(t)
	a := g.device("a")
	a.run("add", "written online")
	a.run("sync")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	setDriveService(t, func(ctx context.Context, client *http.Client) (*drive.Service, error) {
		return drive.NewService(ctx, option.WithEndpoint("http://"+dead+"/drive/v3/"), option.WithHTTPClient(client))
	})
	id := strings.TrimSpace(a.run("add", "written offline"))
	list := a.run("list")
	for _, want := range []string{id, "written offline", "written online"} {
		if !strings.Contains(list, want) {
			t.Errorf("offline list %q, want it to contain %q", list, want)
		}
	}
}
