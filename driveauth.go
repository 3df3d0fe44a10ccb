package drivesync

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/oauth2"
)

// OAuth scopes for Google Drive. The caller's oauth2.Config decides which
// one is requested; this package never asks for the full
// "https://www.googleapis.com/auth/drive" scope, and neither should the app.
const (
	// ScopeAppData grants access only to the app's hidden application-data
	// folder in the user's Drive. The user cannot see or edit the files
	// there (they can only delete them all at once from Drive's settings),
	// and no other app can read them. It is a non-sensitive scope: an app
	// requesting only it needs no Google security review or verification,
	// and the consent screen is a short one. This is the recommended
	// scope for syncing.
	ScopeAppData = "https://www.googleapis.com/auth/drive.appdata"

	// ScopeFile grants access only to files the app itself created (or
	// that the user explicitly opened with it), kept in a folder the user
	// can see in Drive. Use it when the user should be able to see, back
	// up or share the sync folder. The app cannot see any other file in
	// the user's Drive.
	ScopeFile = "https://www.googleapis.com/auth/drive.file"
)

// ErrSignInCancelled is returned by SignIn when the user declined access
// (cancelled the consent screen) in the browser.
var ErrSignInCancelled = errors.New("drive: sign-in cancelled: the user declined access in the browser")

// defaultSignInTimeout bounds how long SignIn waits for the browser when
// SignInOptions.Timeout is zero.
const defaultSignInTimeout = 5 * time.Minute

// SignInOptions adjusts SignIn. The zero value is ready to use.
type SignInOptions struct {
	// OpenBrowser opens url in the user's browser. It must start the
	// browser and return, not wait for the browser to close. The default
	// runs xdg-open (Linux, BSD), open (macOS) or rundll32 (Windows). If
	// it returns an error, SignIn prints the URL to Prompt for the user to
	// open by hand, and keeps waiting.
	OpenBrowser func(url string) error

	// Prompt receives the sign-in URL when the browser cannot be opened.
	// Default: os.Stderr. Nothing secret is ever written to it.
	Prompt io.Writer

	// Timeout bounds how long SignIn waits for the user to finish in the
	// browser, in addition to any deadline of the context. Default: 5
	// minutes.
	Timeout time.Duration

	// ForceConsent shows Google's consent screen even if the user already
	// granted access (prompt=consent). Google returns a new refresh token
	// only with consent, so set this when signing in again after the
	// refresh token was lost or revoked (ErrAuth).
	ForceConsent bool
}

// SignIn runs the OAuth 2.0 flow for installed (desktop) apps and returns
// the token, which includes a refresh token. It listens on a random port
// of the loopback address 127.0.0.1, opens the user's browser on the
// consent page with redirect URI http://127.0.0.1:PORT/, and waits for
// the browser to come back with the authorization code, which it exchanges
// for the token. The flow uses PKCE (S256) and a random state parameter,
// and asks for offline access (a refresh token).
//
// cfg is the app's OAuth client, usually from google.ConfigFromJSON with
// the JSON of a "Desktop app" OAuth client, and ScopeAppData or ScopeFile.
// Its RedirectURL is ignored and cfg is not modified. The HTTP client used
// for the token exchange can be set with the oauth2.HTTPClient context key.
//
// SignIn returns an error matching ErrSignInCancelled if the user declined
// in the browser, and the context's error (context.DeadlineExceeded) if
// the user did not finish within the timeout. It does not save the token:
// pass it to TokenStore.Save.
func SignIn(ctx context.Context, cfg *oauth2.Config, opts SignInOptions) (*oauth2.Token, error) {
	if cfg == nil {
		return nil, errors.New("drive: sign-in: no OAuth client configuration")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("drive: sign-in: %w", err)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = defaultSignInTimeout
	}
	openBrowser := opts.OpenBrowser
	if openBrowser == nil {
		openBrowser = defaultOpenBrowser
	}
	prompt := opts.Prompt
	if prompt == nil {
		prompt = os.Stderr
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Google (and RFC 8252) want the loopback IP literal, not
	// "localhost", on any port for desktop clients.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("drive: sign-in: cannot listen on the loopback address: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port

	// A fresh Config rather than a copy of *cfg: the caller's is not
	// touched, and its internal cache is not copied.
	conf := &oauth2.Config{
		ClientID:     cfg.ClientID,
		ClientSecret: cfg.ClientSecret,
		Endpoint:     cfg.Endpoint,
		Scopes:       slices.Clone(cfg.Scopes),
		RedirectURL:  "http://127.0.0.1:" + strconv.Itoa(port) + "/",
	}
	state := rand.Text()
	verifier := oauth2.GenerateVerifier()
	authOpts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier), oauth2.AccessTypeOffline}
	if opts.ForceConsent {
		authOpts = append(authOpts, oauth2.ApprovalForce)
	}
	authURL := conf.AuthCodeURL(state, authOpts...)

	type result struct {
		tok *oauth2.Token
		err error
	}
	results := make(chan result, 1) // only the one claiming callback sends
	var claimed atomic.Bool

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if r.URL.Path != "/" || (!q.Has("code") && !q.Has("error") && !q.Has("state")) {
			// favicon.ico, browser pre-connects and the like.
			http.NotFound(w, r)
			return
		}
		if !claimed.CompareAndSwap(false, true) {
			writeSignInPage(w, http.StatusConflict, "Sign-in was already handled.")
			return
		}
		tok, page, err := signInCallback(ctx, conf, q, state, verifier)
		if err != nil {
			writeSignInPage(w, http.StatusBadRequest, page)
		} else {
			writeSignInPage(w, http.StatusOK, page)
		}
		results <- result{tok, err}
	})
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	serveDone := make(chan struct{})
	var serveErr error
	go func() {
		defer close(serveDone)
		serveErr = srv.Serve(ln)
	}()
	defer func() {
		// Cancel first, so that an exchange in progress in a handler
		// stops; then wait for the handlers and the server goroutine.
		cancel()
		shutCtx, shutCancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer shutCancel()
		if err := srv.Shutdown(shutCtx); err != nil {
			srv.Close()
		}
		<-serveDone
	}()

	if err := openBrowser(authURL); err != nil {
		fmt.Fprintf(prompt, "Could not open a web browser (%v).\nTo sign in, open this address in your browser:\n\n    %s\n\n", err, authURL)
	}

	select {
	case res := <-results:
		return res.tok, res.err
	case <-serveDone:
		return nil, fmt.Errorf("drive: sign-in: local server stopped: %w", serveErr)
	case <-ctx.Done():
		return nil, fmt.Errorf("drive: sign-in: no answer from the browser: %w", ctx.Err())
	}
}

// signInCallback checks the browser's redirect and exchanges its code.
// It returns the token or an error, and the text of the page to show.
func signInCallback(ctx context.Context, conf *oauth2.Config, q map[string][]string, state, verifier string) (*oauth2.Token, string, error) {
	values := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if got := values("state"); subtle.ConstantTimeCompare([]byte(got), []byte(state)) != 1 {
		return nil, "Sign-in failed: the response does not match this sign-in request. Return to the app and try again.",
			errors.New("drive: sign-in failed: the browser's response does not match this sign-in (state mismatch); try again")
	}
	if e := values("error"); e != "" {
		if e == "access_denied" {
			return nil, "Sign-in was cancelled. Return to the app to try again.", ErrSignInCancelled
		}
		msg := "drive: sign-in failed: the authorization server returned " + strconv.Quote(truncate(e, 100))
		if d := values("error_description"); d != "" {
			msg += " (" + strconv.Quote(truncate(d, 200)) + ")"
		}
		return nil, "Sign-in failed (" + truncate(e, 100) + "). Return to the app and try again.", errors.New(msg)
	}
	code := values("code")
	if code == "" {
		return nil, "Sign-in failed: no authorization code was received. Return to the app and try again.",
			errors.New("drive: sign-in failed: the browser's response has no authorization code")
	}
	tok, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier))
	if err != nil {
		return nil, "Sign-in failed: the app could not complete the sign-in. Return to the app and try again.",
			tokenEndpointError("drive: sign-in failed: exchanging the authorization code", err, code, verifier)
	}
	return tok, "Signed in. You can close this window and return to the app.", nil
}

// writeSignInPage writes the small page the browser shows after the
// redirect. It always says the window can be closed.
func writeSignInPage(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	if !strings.Contains(msg, "You can close this window") {
		msg += " You can close this window."
	}
	fmt.Fprintf(w, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Sign-in</title></head>\n"+
		"<body style=\"font-family: sans-serif; margin: 3em;\"><p>%s</p></body></html>\n", html.EscapeString(msg))
}

// defaultOpenBrowser opens url with the system's browser launcher. It
// waits a little for the launcher to fail (no display, no browser); a
// launcher that keeps running is assumed to have opened the browser and
// is reaped in the background.
func defaultOpenBrowser(url string) error {
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", url)
	case "darwin":
		cmd = exec.Command("open", url)
	default:
		cmd = exec.Command("xdg-open", url)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(3 * time.Second):
		return nil
	}
}

// TokenStore keeps the OAuth token between runs of the app.
type TokenStore interface {
	// Load returns the saved token, or an error matching fs.ErrNotExist
	// when none was saved.
	Load(ctx context.Context) (*oauth2.Token, error)
	// Save replaces the saved token.
	Save(ctx context.Context, tok *oauth2.Token) error
}

// FileTokenStore is a TokenStore keeping the token as JSON in a file
// readable only by its owner.
type FileTokenStore struct {
	path string
}

var _ TokenStore = (*FileTokenStore)(nil)

// NewFileTokenStore returns a store keeping the token in the file at path,
// for example the one DefaultTokenPath returns.
func NewFileTokenStore(path string) *FileTokenStore {
	return &FileTokenStore{path: path}
}

// Path returns the file the token is kept in.
func (s *FileTokenStore) Path() string { return s.path }

// maxTokenFileSize bounds what Load reads.
const maxTokenFileSize = 1 << 20

// Load reads the token. It returns an error matching fs.ErrNotExist if the
// file does not exist. On Unix it refuses a file that other users could
// read or write (any group or other permission bit): fix it with
// chmod 600, or sign in again.
func (s *FileTokenStore) Load(ctx context.Context) (*oauth2.Token, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := os.Open(s.path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("drive: no saved sign-in (token file %s does not exist): %w", s.path, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("drive: reading token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("drive: reading token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("drive: token file %s is not a regular file", s.path)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("drive: token file %s is accessible by other users (mode %04o); "+
			"make it private with: chmod 600 %s", s.path, fi.Mode().Perm(), s.path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxTokenFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("drive: reading token file: %w", err)
	}
	if len(data) > maxTokenFileSize {
		return nil, fmt.Errorf("drive: token file %s is too large", s.path)
	}
	var tok oauth2.Token
	if err := json.Unmarshal(data, &tok); err != nil {
		// The JSON error is left out: it could quote the file's content.
		return nil, fmt.Errorf("drive: token file %s is corrupt (not valid JSON); delete it and sign in again", s.path)
	}
	if tok.AccessToken == "" && tok.RefreshToken == "" {
		return nil, fmt.Errorf("drive: token file %s holds no token; delete it and sign in again", s.path)
	}
	return &tok, nil
}

// Save writes the token atomically: to a temporary file (mode 0600) in the
// same directory, flushed to disk, then renamed over the old one. It
// creates the directory (mode 0700) if needed.
func (s *FileTokenStore) Save(ctx context.Context, tok *oauth2.Token) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tok == nil {
		return errors.New("drive: saving token: no token")
	}
	data, err := json.MarshalIndent(tok, "", "  ")
	if err != nil {
		return errors.New("drive: saving token: cannot encode it")
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("drive: saving token: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(s.path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("drive: saving token: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if runtime.GOOS != "windows" {
		// CreateTemp already uses 0600; make sure despite the umask.
		if err := f.Chmod(0o600); err != nil {
			return fmt.Errorf("drive: saving token: %w", err)
		}
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("drive: saving token: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("drive: saving token: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("drive: saving token: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("drive: saving token: %w", err)
	}
	if runtime.GOOS != "windows" {
		// Make the rename durable; best effort.
		if d, err := os.Open(dir); err == nil {
			d.Sync()
			d.Close()
		}
	}
	return nil
}

// DefaultTokenPath returns where an app named app keeps its token by
// default: drive-token.json in the app's directory of the user's
// configuration directory (os.UserConfigDir), for example
// ~/.config/APP/drive-token.json on Linux. app must be a relative path
// such as "MyApp" or "MyCompany/MyApp".
func DefaultTokenPath(app string) (string, error) {
	if !filepath.IsLocal(app) || filepath.Clean(app) == "." {
		return "", fmt.Errorf("drive: token path: invalid app name %q", app)
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("drive: token path: %w", err)
	}
	return filepath.Join(dir, app, "drive-token.json"), nil
}

// SavingTokenSource returns a token source that starts from tok, refreshes
// it with cfg when it expires (cfg.TokenSource), and saves every new token
// to store, so that a rotated refresh token is never lost. tok is assumed
// to be saved already (it came from store.Load, or was saved after
// SignIn). ctx is used for the refresh requests (see oauth2.HTTPClient)
// and for Save. The source is safe for concurrent use.
//
// If saving a refreshed token fails, Token returns that error (and retries
// the save on the next call): a refresh token that is not saved means
// signing in again on the next run, which the app should hear about.
//
// If the refresh is refused with "invalid_grant" (the user revoked access,
// the refresh token expired or was rotated away) or there is no refresh
// token, Token returns an error matching ErrAuth: the app should call
// SignIn again. Error messages never contain the tokens.
//
// Typical use:
//
//	store := drivesync.NewFileTokenStore(path)
//	tok, err := store.Load(ctx)
//	if errors.Is(err, fs.ErrNotExist) {
//		tok, err = drivesync.SignIn(ctx, cfg, drivesync.SignInOptions{})
//		if err == nil {
//			err = store.Save(ctx, tok)
//		}
//	}
//	if err != nil { ... }
//	client := oauth2.NewClient(ctx, drivesync.SavingTokenSource(ctx, cfg, tok, store))
func SavingTokenSource(ctx context.Context, cfg *oauth2.Config, tok *oauth2.Token, store TokenStore) oauth2.TokenSource {
	s := &savingTokenSource{
		ctx:   ctx,
		src:   cfg.TokenSource(ctx, tok),
		store: store,
	}
	if tok != nil {
		s.saved = tok.AccessToken
		s.remember(tok)
	}
	return s
}

type savingTokenSource struct {
	ctx   context.Context
	src   oauth2.TokenSource
	store TokenStore

	mu      sync.Mutex
	saved   string   // access token last saved (or loaded)
	secrets []string // tokens seen, to keep them out of error messages
}

// Token returns a valid token, refreshing and saving it if needed.
func (s *savingTokenSource) Token() (*oauth2.Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, err := s.src.Token()
	if err != nil {
		return nil, tokenEndpointError("drive: refreshing the access token", err, s.secrets...)
	}
	s.remember(tok)
	if tok.AccessToken != s.saved {
		if err := s.store.Save(s.ctx, tok); err != nil {
			return nil, &redactedError{
				msg:  redact("drive: saving the refreshed token (sign-in would be lost): "+err.Error(), s.secrets),
				errs: []error{err},
			}
		}
		s.saved = tok.AccessToken
	}
	return tok, nil
}

// remember records tok's secrets for redaction, keeping the last few.
func (s *savingTokenSource) remember(tok *oauth2.Token) {
	for _, v := range []string{tok.AccessToken, tok.RefreshToken} {
		if v != "" && !slices.Contains(s.secrets, v) {
			s.secrets = append(s.secrets, v)
		}
	}
	if n := len(s.secrets); n > 8 {
		s.secrets = slices.Clone(s.secrets[n-8:])
	}
}

// tokenEndpointError turns an error of a token request into one whose
// message holds none of secrets, matching ErrAuth when signing in again
// is needed. The original error stays reachable with errors.As (for
// *oauth2.RetrieveError).
func tokenEndpointError(prefix string, err error, secrets ...string) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		detail := ""
		switch {
		case re.ErrorCode != "":
			detail = strconv.Quote(truncate(re.ErrorCode, 100))
			if re.ErrorDescription != "" {
				detail += " " + strconv.Quote(truncate(re.ErrorDescription, 200))
			}
		case re.Response != nil:
			// The body of the response is left out: it is not ours to show.
			detail = "HTTP " + re.Response.Status
		default:
			detail = "refused"
		}
		detail = redact(detail, secrets)
		if re.ErrorCode == "invalid_grant" {
			return &redactedError{
				msg:  prefix + ": token endpoint refused: " + detail + "; sign in again: " + ErrAuth.Error(),
				errs: []error{ErrAuth, err},
			}
		}
		return &redactedError{msg: prefix + ": token endpoint refused: " + detail, errs: []error{err}}
	}
	if strings.Contains(err.Error(), "refresh token is not set") {
		return &redactedError{
			msg:  prefix + ": the token expired and there is no refresh token; sign in again: " + ErrAuth.Error(),
			errs: []error{ErrAuth, err},
		}
	}
	return &redactedError{msg: redact(prefix+": "+err.Error(), secrets), errs: []error{err}}
}

// redactedError has its own message, free of secrets, and unwraps to the
// errors it stands for.
type redactedError struct {
	msg  string
	errs []error
}

func (e *redactedError) Error() string   { return e.msg }
func (e *redactedError) Unwrap() []error { return e.errs }

// redact replaces every secret in s.
func redact(s string, secrets []string) string {
	for _, v := range secrets {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[REDACTED]")
		}
	}
	return s
}

// truncate shortens s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
