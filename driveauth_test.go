package drivesync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/oauth2"
)

// fakeOAuth is a fake Google authorization server: /auth redirects the
// browser straight back to the app, /token exchanges codes and refresh
// tokens.
type fakeOAuth struct {
	t   *testing.T
	srv *httptest.Server

	// authMode says how /auth answers: "ok", "deny", "badstate", "nocode".
	authMode string
	// exchangeFail makes the code exchange fail with invalid_grant.
	exchangeFail bool
	// refreshMode says how a refresh answers: "ok" or "invalid_grant".
	refreshMode string

	mu         sync.Mutex
	authQuery  url.Values // query of the last /auth request
	codes      map[string]string
	exchanges  int
	refreshes  int
	verifierOK bool
}

const (
	fakeClientID     = "client-id.apps.example"
	fakeClientSecret = "client-secret"
	fakeRefresh      = "1//refresh-SECRET-abcdef"
	fakeAccess       = "ya29.access-SECRET-0"
)

func newFakeOAuth(t *testing.T) *fakeOAuth {
	f := &fakeOAuth{t: t, authMode: "ok", refreshMode: "ok", codes: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/auth", f.auth)
	mux.HandleFunc("/token", f.token)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// counts returns how many code exchanges and refreshes were served.
func (f *fakeOAuth) counts() (exchanges, refreshes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exchanges, f.refreshes
}

func (f *fakeOAuth) config() *oauth2.Config {
	return &oauth2.Config{
		ClientID:     fakeClientID,
		ClientSecret: fakeClientSecret,
		Endpoint: oauth2.Endpoint{
			AuthURL:   f.srv.URL + "/auth",
			TokenURL:  f.srv.URL + "/token",
			AuthStyle: oauth2.AuthStyleInParams,
		},
		Scopes: []string{ScopeAppData},
	}
}

func (f *fakeOAuth) auth(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f.mu.Lock()
	f.authQuery = q
	code := fmt.Sprintf("code-%d", len(f.codes)+1)
	f.codes[code] = q.Get("code_challenge")
	f.mu.Unlock()
	back := url.Values{}
	switch f.authMode {
	case "ok":
		back.Set("code", code)
		back.Set("state", q.Get("state"))
	case "deny":
		back.Set("error", "access_denied")
		back.Set("state", q.Get("state"))
	case "badstate":
		back.Set("code", code)
		back.Set("state", "forged-state")
	case "nocode":
		back.Set("state", q.Get("state"))
	}
	http.Redirect(w, r, q.Get("redirect_uri")+"?"+back.Encode(), http.StatusFound)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeOAuth) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Form.Get("client_id") != fakeClientID {
		writeJSON(w, 401, map[string]string{"error": "invalid_client"})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Form.Get("grant_type") {
	case "authorization_code":
		f.exchanges++
		challenge, ok := f.codes[r.Form.Get("code")]
		if f.exchangeFail || !ok {
			writeJSON(w, 400, map[string]string{"error": "invalid_grant", "error_description": "Bad code"})
			return
		}
		delete(f.codes, r.Form.Get("code"))
		if r.Form.Get("redirect_uri") != f.authQuery.Get("redirect_uri") {
			writeJSON(w, 400, map[string]string{"error": "redirect_uri_mismatch"})
			return
		}
		sum := sha256.Sum256([]byte(r.Form.Get("code_verifier")))
		if r.Form.Get("code_verifier") == "" || base64.RawURLEncoding.EncodeToString(sum[:]) != challenge {
			writeJSON(w, 400, map[string]string{"error": "invalid_grant", "error_description": "Invalid code verifier."})
			return
		}
		f.verifierOK = true
		writeJSON(w, 200, map[string]any{
			"access_token": fakeAccess, "token_type": "Bearer",
			"refresh_token": fakeRefresh, "expires_in": 3599,
		})
	case "refresh_token":
		f.refreshes++
		rt := r.Form.Get("refresh_token")
		if f.refreshMode == "invalid_grant" || rt != fakeRefresh {
			// Echo the refresh token back, to check that it is redacted.
			writeJSON(w, 400, map[string]string{"error": "invalid_grant", "error_description": "Token has been expired or revoked: " + rt})
			return
		}
		// Like Google: a new access token, no new refresh token.
		writeJSON(w, 200, map[string]any{
			"access_token": fmt.Sprintf("ya29.access-SECRET-%d", f.refreshes), "token_type": "Bearer", "expires_in": 3599,
		})
	default:
		writeJSON(w, 400, map[string]string{"error": "unsupported_grant_type"})
	}
}

// testClientCtx returns ctx carrying an HTTP client for oauth2 whose
// connections are closed at the end of the test.
func testClientCtx(t *testing.T, ctx context.Context) (context.Context, *http.Client) {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	c := &http.Client{Transport: tr}
	return context.WithValue(ctx, oauth2.HTTPClient, c), c
}

// browser is a fake browser: it follows the auth URL (and its redirect to
// the app's loopback server) and records the page it ends on.
type browser struct {
	client *http.Client
	mu     sync.Mutex
	url    string
	status int
	page   string
	err    error
}

func newBrowser(t *testing.T) *browser {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &browser{client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

func (b *browser) open(u string) error {
	resp, err := b.client.Get(u)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.url = u
	if err != nil {
		b.err = err
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	b.status, b.page = resp.StatusCode, string(body)
	return nil
}

func (b *browser) result() (int, string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status, b.page, b.err
}

func assertNoSecrets(t *testing.T, s string, secrets ...string) {
	t.Helper()
	for _, v := range append(secrets, fakeAccess, fakeRefresh, "SECRET") {
		if strings.Contains(s, v) {
			t.Errorf("message contains a token (%q): %s", v, s)
		}
	}
}

func TestSignIn(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	f := newFakeOAuth(t)
	cfg := f.config()
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	var prompt bytes.Buffer

	tok, err := SignIn(ctx, cfg, SignInOptions{OpenBrowser: b.open, Prompt: &prompt, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("SignIn: %v", err)
	}
	if tok.AccessToken != fakeAccess || tok.RefreshToken != fakeRefresh {
		t.Fatalf("token = %q / %q", tok.AccessToken, tok.RefreshToken)
	}
	if !tok.Expiry.After(time.Now()) {
		t.Errorf("expiry %v not in the future", tok.Expiry)
	}
	status, page, berr := b.result()
	if berr != nil || status != 200 || !strings.Contains(page, "You can close this window") {
		t.Errorf("browser page: %d %q %v", status, page, berr)
	}
	if prompt.Len() != 0 {
		t.Errorf("prompt written although the browser opened: %q", prompt.String())
	}

	f.mu.Lock()
	q, verifierOK := f.authQuery, f.verifierOK
	f.mu.Unlock()
	if !verifierOK {
		t.Error("token endpoint never saw a matching code_verifier")
	}
	if !regexp.MustCompile(`^http://127\.0\.0\.1:[0-9]+/$`).MatchString(q.Get("redirect_uri")) {
		t.Errorf("redirect_uri = %q", q.Get("redirect_uri"))
	}
	for k, want := range map[string]string{
		"client_id": fakeClientID, "response_type": "code", "scope": ScopeAppData,
		"code_challenge_method": "S256", "access_type": "offline",
	} {
		if got := q.Get(k); got != want {
			t.Errorf("auth %s = %q, want %q", k, got, want)
		}
	}
	if q.Get("code_challenge") == "" || len(q.Get("state")) < 20 {
		t.Errorf("weak PKCE or state: %v", q)
	}
	if q.Has("prompt") {
		t.Errorf("prompt=%q sent without ForceConsent", q.Get("prompt"))
	}
	if cfg.RedirectURL != "" {
		t.Errorf("caller's config modified: RedirectURL = %q", cfg.RedirectURL)
	}

	f.srv.Close()
	goleak.VerifyNone(t, leaks)
}

func TestSignInForceConsent(t *testing.T) {
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	if _, err := SignIn(ctx, f.config(), SignInOptions{OpenBrowser: b.open, ForceConsent: true, Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.authQuery.Get("prompt") != "consent" || f.authQuery.Get("access_type") != "offline" {
		t.Errorf("auth query = %v", f.authQuery)
	}
}

func TestSignInCancelled(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	f := newFakeOAuth(t)
	f.authMode = "deny"
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	_, err := SignIn(ctx, f.config(), SignInOptions{OpenBrowser: b.open, Timeout: 10 * time.Second})
	if !errors.Is(err, ErrSignInCancelled) {
		t.Fatalf("err = %v, want ErrSignInCancelled", err)
	}
	if !strings.Contains(err.Error(), "cancelled") || !strings.Contains(err.Error(), "browser") {
		t.Errorf("message does not say the user cancelled in the browser: %v", err)
	}
	status, page, _ := b.result()
	if status != 400 || !strings.Contains(page, "cancelled") || !strings.Contains(page, "You can close this window") {
		t.Errorf("browser page: %d %q", status, page)
	}
	if n, _ := f.counts(); n != 0 {
		t.Errorf("%d code exchanges after a cancel", n)
	}
	f.srv.Close()
	goleak.VerifyNone(t, leaks)
}

func TestSignInStateMismatch(t *testing.T) {
	f := newFakeOAuth(t)
	f.authMode = "badstate"
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	_, err := SignIn(ctx, f.config(), SignInOptions{OpenBrowser: b.open, Timeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "state") || errors.Is(err, ErrSignInCancelled) {
		t.Fatalf("err = %v, want a state mismatch", err)
	}
	status, page, _ := b.result()
	if status != 400 || !strings.Contains(page, "failed") || !strings.Contains(page, "You can close this window") {
		t.Errorf("browser page: %d %q", status, page)
	}
	if n, _ := f.counts(); n != 0 {
		t.Errorf("code exchanged despite the state mismatch")
	}
}

func TestSignInMissingCode(t *testing.T) {
	f := newFakeOAuth(t)
	f.authMode = "nocode"
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	_, err := SignIn(ctx, f.config(), SignInOptions{OpenBrowser: b.open, Timeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "no authorization code") {
		t.Fatalf("err = %v, want missing code", err)
	}
}

func TestSignInExchangeFails(t *testing.T) {
	f := newFakeOAuth(t)
	f.exchangeFail = true
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	_, err := SignIn(ctx, f.config(), SignInOptions{OpenBrowser: b.open, Timeout: 10 * time.Second})
	var re *oauth2.RetrieveError
	if err == nil || !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Fatalf("err = %v, want the exchange's invalid_grant", err)
	}
	assertNoSecrets(t, err.Error())
	status, page, _ := b.result()
	if status != 400 || !strings.Contains(page, "You can close this window") {
		t.Errorf("browser page: %d %q", status, page)
	}
}

func TestSignInTimeout(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	f := newFakeOAuth(t)
	for _, tc := range []struct {
		name    string
		ctxWait time.Duration
		opt     time.Duration
	}{
		{"context deadline", 200 * time.Millisecond, 0},
		{"Timeout option", time.Hour, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctxWait)
			defer cancel()
			opened := false
			start := time.Now()
			_, err := SignIn(ctx, f.config(), SignInOptions{
				OpenBrowser: func(string) error { opened = true; return nil },
				Timeout:     tc.opt,
			})
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want context.DeadlineExceeded", err)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("SignIn took %v to time out", d)
			}
			if !opened {
				t.Error("OpenBrowser not called")
			}
		})
	}
	// A cancelled context returns at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := SignIn(ctx, f.config(), SignInOptions{OpenBrowser: func(string) error { return nil }}); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	f.srv.Close()
	goleak.VerifyNone(t, leaks)
}

// promptWriter plays a user who copies the URL printed on the prompt into
// a browser.
type promptWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	b    *browser
	base string
	wg   sync.WaitGroup
}

func (p *promptWriter) Write(data []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf.Write(data)
	if u := regexp.MustCompile(regexp.QuoteMeta(p.base) + `/auth\?\S+`).FindString(p.buf.String()); u != "" {
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.b.open(u) }()
	}
	return len(data), nil
}

func TestSignInBrowserFailsPrintsURL(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	p := &promptWriter{b: newBrowser(t), base: f.srv.URL}
	tok, err := SignIn(ctx, f.config(), SignInOptions{
		OpenBrowser: func(string) error { return errors.New("no display") },
		Prompt:      p,
		Timeout:     10 * time.Second,
	})
	p.wg.Wait()
	if err != nil {
		t.Fatalf("SignIn: %v", err)
	}
	if tok.RefreshToken != fakeRefresh {
		t.Errorf("refresh token = %q", tok.RefreshToken)
	}
	out := p.buf.String()
	if !strings.Contains(out, f.srv.URL+"/auth?") || !strings.Contains(out, "no display") {
		t.Errorf("prompt = %q", out)
	}
	assertNoSecrets(t, out)
	f.srv.Close()
	goleak.VerifyNone(t, leaks)
}

func TestSignInIgnoresStrayRequests(t *testing.T) {
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	b := newBrowser(t)
	var stray int
	_, err := SignIn(ctx, f.config(), SignInOptions{
		OpenBrowser: func(u string) error {
			// A favicon request and a bare visit do not end the sign-in.
			au, _ := url.Parse(u)
			redirect := au.Query().Get("redirect_uri")
			for _, p := range []string{"favicon.ico", ""} {
				resp, err := b.client.Get(redirect + p)
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == 404 {
						stray++
					}
				}
			}
			return b.open(u)
		},
		Timeout: 10 * time.Second,
	})
	if err != nil || stray != 2 {
		t.Fatalf("err = %v, stray 404s = %d", err, stray)
	}
}

func TestSignInNilConfig(t *testing.T) {
	if _, err := SignIn(context.Background(), nil, SignInOptions{}); err == nil {
		t.Fatal("no error for a nil config")
	}
}

func TestFileTokenStore(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "new", "app")
	path := filepath.Join(dir, "drive-token.json")
	s := NewFileTokenStore(path)

	_, err := s.Load(ctx)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load of a missing file: %v, want fs.ErrNotExist", err)
	}

	tok := &oauth2.Token{AccessToken: fakeAccess, TokenType: "Bearer", RefreshToken: fakeRefresh, Expiry: time.Now().Add(time.Hour).Round(time.Second)}
	if err := s.Save(ctx, tok); err != nil {
		t.Fatalf("Save: %v", err)
	}
	got, err := s.Load(ctx)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got.AccessToken != tok.AccessToken || got.RefreshToken != tok.RefreshToken || !got.Expiry.Equal(tok.Expiry) || got.TokenType != "Bearer" {
		t.Errorf("Load = %+v, want %+v", got, tok)
	}
	if runtime.GOOS != "windows" {
		fi, _ := os.Stat(path)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
		}
		di, _ := os.Stat(dir)
		if di.Mode().Perm() != 0o700 {
			t.Errorf("token dir mode %v, want 0700", di.Mode().Perm())
		}
	}

	// Atomic replace: a reader holding the old file still sees it whole,
	// and no temporary file is left behind.
	old, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	tok2 := &oauth2.Token{AccessToken: "ya29.second", RefreshToken: fakeRefresh}
	if err := s.Save(ctx, tok2); err != nil {
		t.Fatal(err)
	}
	var oldTok oauth2.Token
	if err := json.NewDecoder(old).Decode(&oldTok); err != nil || oldTok.AccessToken != fakeAccess {
		t.Errorf("old file changed in place: %v %q", err, oldTok.AccessToken)
	}
	if got, err := s.Load(ctx); err != nil || got.AccessToken != "ya29.second" {
		t.Errorf("after second Save: %v %v", got, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("files in token dir: %v", names)
	}
}

func TestFileTokenStoreRefusesOpenPermissions(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permission bits")
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "drive-token.json")
	s := NewFileTokenStore(path)
	if err := s.Save(ctx, &oauth2.Token{AccessToken: fakeAccess, RefreshToken: fakeRefresh}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := s.Load(ctx)
		if err == nil {
			t.Fatalf("mode %v: Load accepted the file", mode)
		}
		msg := err.Error()
		if !strings.Contains(msg, path) || !strings.Contains(msg, "chmod 600") {
			t.Errorf("mode %v: unhelpful error: %v", mode, err)
		}
		assertNoSecrets(t, msg)
	}
	os.Chmod(path, 0o600)
	if _, err := s.Load(ctx); err != nil {
		t.Errorf("after chmod 600: %v", err)
	}
}

func TestFileTokenStoreCorrupt(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "drive-token.json")
	if err := os.WriteFile(path, []byte(`{"access_token":"ya29.access-SECRET-x", broken`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := NewFileTokenStore(path).Load(ctx)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want corrupt", err)
	}
	assertNoSecrets(t, err.Error())
	if err := os.WriteFile(path, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFileTokenStore(path).Load(ctx); err == nil {
		t.Error("empty token accepted")
	}
}

func TestDefaultTokenPath(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("XDG_CONFIG_HOME is Linux-only")
	}
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	p, err := DefaultTokenPath("MyApp")
	if err != nil || p != filepath.Join(dir, "MyApp", "drive-token.json") {
		t.Errorf("DefaultTokenPath = %q, %v", p, err)
	}
	for _, bad := range []string{"", ".", "..", "../x", "/abs"} {
		if _, err := DefaultTokenPath(bad); err == nil {
			t.Errorf("DefaultTokenPath(%q) accepted", bad)
		}
	}
}

// countingStore counts saves, and fails them while fail is set.
type countingStore struct {
	TokenStore
	saves atomic.Int32
	fail  atomic.Bool
}

func (s *countingStore) Save(ctx context.Context, tok *oauth2.Token) error {
	if s.fail.Load() {
		return errors.New("disk full")
	}
	s.saves.Add(1)
	return s.TokenStore.Save(ctx, tok)
}

func expiredToken() *oauth2.Token {
	return &oauth2.Token{AccessToken: fakeAccess, TokenType: "Bearer", RefreshToken: fakeRefresh, Expiry: time.Now().Add(-time.Minute)}
}

func TestSavingTokenSourceSavesRefresh(t *testing.T) {
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	fileStore := NewFileTokenStore(filepath.Join(t.TempDir(), "drive-token.json"))
	store := &countingStore{TokenStore: fileStore}
	ts := SavingTokenSource(ctx, f.config(), expiredToken(), store)

	// Concurrent callers: one refresh, one save.
	var wg sync.WaitGroup
	toks := make([]*oauth2.Token, 8)
	errs := make([]error, 8)
	for i := range toks {
		wg.Go(func() { toks[i], errs[i] = ts.Token() })
	}
	wg.Wait()
	for i := range toks {
		if errs[i] != nil {
			t.Fatalf("Token: %v", errs[i])
		}
		if toks[i].AccessToken != "ya29.access-SECRET-1" {
			t.Errorf("Token = %q", toks[i].AccessToken)
		}
	}
	if _, r := f.counts(); r != 1 || store.saves.Load() != 1 {
		t.Errorf("refreshes = %d, saves = %d, want 1 and 1", r, store.saves.Load())
	}
	saved, err := fileStore.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if saved.AccessToken != "ya29.access-SECRET-1" || saved.RefreshToken != fakeRefresh || !saved.Valid() {
		t.Errorf("saved token = %q / %q, valid %v", saved.AccessToken, saved.RefreshToken, saved.Valid())
	}

	// A valid token is neither refreshed nor saved again.
	if _, err := ts.Token(); err != nil || store.saves.Load() != 1 {
		t.Errorf("second Token: %v, saves %d", err, store.saves.Load())
	}
	if _, r := f.counts(); r != 1 {
		t.Errorf("refreshes = %d, want 1", r)
	}
}

func TestSavingTokenSourceSaveError(t *testing.T) {
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	store := &countingStore{TokenStore: NewFileTokenStore(filepath.Join(t.TempDir(), "t.json"))}
	store.fail.Store(true)
	ts := SavingTokenSource(ctx, f.config(), expiredToken(), store)
	_, err := ts.Token()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v, want the save error", err)
	}
	assertNoSecrets(t, err.Error())
	// The save is retried on the next call, without another refresh.
	store.fail.Store(false)
	tok, err := ts.Token()
	_, refreshes := f.counts()
	if err != nil || tok.AccessToken != "ya29.access-SECRET-1" || store.saves.Load() != 1 || refreshes != 1 {
		t.Errorf("retry: %v, saves %d, refreshes %d", err, store.saves.Load(), refreshes)
	}
}

func TestSavingTokenSourceInvalidGrant(t *testing.T) {
	f := newFakeOAuth(t)
	f.refreshMode = "invalid_grant"
	ctx, _ := testClientCtx(t, context.Background())
	store := &countingStore{TokenStore: NewFileTokenStore(filepath.Join(t.TempDir(), "t.json"))}
	ts := SavingTokenSource(ctx, f.config(), expiredToken(), store)

	_, err := ts.Token()
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("err = %v, want ErrAuth", err)
	}
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Errorf("RetrieveError not reachable: %v", err)
	}
	if !strings.Contains(err.Error(), "invalid_grant") {
		t.Errorf("message lacks the reason: %v", err)
	}
	assertNoSecrets(t, err.Error())
	if store.saves.Load() != 0 {
		t.Error("saved after a failed refresh")
	}

	// Through an HTTP client, as the Drive API uses it.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	hc := oauth2.NewClient(ctx, ts)
	_, err = hc.Get(api.URL)
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("through http.Client: %v, want ErrAuth", err)
	}
	assertNoSecrets(t, err.Error())
}

func TestSavingTokenSourceNoRefreshToken(t *testing.T) {
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	store := &countingStore{TokenStore: NewFileTokenStore(filepath.Join(t.TempDir(), "t.json"))}
	tok := expiredToken()
	tok.RefreshToken = ""
	_, err := SavingTokenSource(ctx, f.config(), tok, store).Token()
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("err = %v, want ErrAuth", err)
	}
	assertNoSecrets(t, err.Error())
}

func TestSavingTokenSourceOtherErrors(t *testing.T) {
	f := newFakeOAuth(t)
	ctx, _ := testClientCtx(t, context.Background())
	cfg := f.config()
	cfg.ClientID = "someone-else" // invalid_client: not ErrAuth
	store := &countingStore{TokenStore: NewFileTokenStore(filepath.Join(t.TempDir(), "t.json"))}
	_, err := SavingTokenSource(ctx, cfg, expiredToken(), store).Token()
	if err == nil || errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "invalid_client") {
		t.Fatalf("err = %v, want invalid_client, not ErrAuth", err)
	}
	assertNoSecrets(t, err.Error())

	// Token endpoint unreachable.
	f.srv.Close()
	_, err = SavingTokenSource(ctx, f.config(), expiredToken(), store).Token()
	if err == nil || errors.Is(err, ErrAuth) {
		t.Fatalf("err = %v, want a network error", err)
	}
	assertNoSecrets(t, err.Error())
}
