package main

// Google Drive (-drive): the sign-in and what the user can do about the
// Drive errors they can fix. openRemote in main.go puts it together.
//
// The app is identified to Google by an OAuth client of type "Desktop app",
// created in Google Cloud Console and downloaded as JSON. It asks only for
// drivesync.ScopeAppData: the app's own hidden folder in the user's Drive,
// which needs no Google review. The user's sign-in (the OAuth token, with
// its refresh token) is saved in a file only the user can read.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/drive/v3"
	"google.golang.org/api/option"

	"github.com/drivesync/drivesync"
)

// newDriveService returns the Drive API client, sending its requests
// through client, which signs them. Tests replace it to talk to a fake
// Drive.
var newDriveService = func(ctx context.Context, client *http.Client) (*drive.Service, error) {
	return drive.NewService(ctx, option.WithHTTPClient(client))
}

// openBrowser opens the sign-in page; nil opens the system's browser.
// Tests replace it.
var openBrowser func(url string) error

const noCredentials = "-drive needs the app's Google OAuth client: create an OAuth client of type Desktop app " +
	"in Google Cloud Console (APIs & Services > Credentials), download its JSON, and pass its path " +
	"with -credentials PATH or set NOTES_GOOGLE_CREDENTIALS (see the README, Google Drive)"

// oauthConfig reads the app's OAuth client from the JSON file at path.
func oauthConfig(path string) (*oauth2.Config, error) {
	if path == "" {
		return nil, errors.New(noCredentials)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the Google OAuth client: %w", err)
	}
	// ConfigFromJSON also takes a "Web application" client, whose sign-in
	// Google refuses with redirect_uri_mismatch: say so now.
	var kind struct{ Web json.RawMessage }
	if json.Unmarshal(data, &kind) == nil && kind.Web != nil {
		return nil, fmt.Errorf("%s is an OAuth client of type Web application: notes needs one of type Desktop app (see the README, Google Drive)", path)
	}
	cfg, err := google.ConfigFromJSON(data, drivesync.ScopeAppData)
	if err != nil {
		return nil, fmt.Errorf("%s is not the JSON of a Google OAuth client of type Desktop app (see the README, Google Drive): %w", path, err)
	}
	return cfg, nil
}

// tokenStore returns where the user's sign-in is saved: a file readable
// only by the user (mode 0600) in the user's configuration directory.
func tokenStore() (*drivesync.FileTokenStore, error) {
	path, err := drivesync.DefaultTokenPath("drivesync-notes")
	if err != nil {
		return nil, err
	}
	return drivesync.NewFileTokenStore(path), nil
}

// signIn has the user sign in to Google in the browser, and saves the
// token. SignIn prints the address to prompt if it cannot open a browser.
// force shows Google's consent screen even if the user agreed before:
// Google hands out a new refresh token only with consent.
func signIn(ctx context.Context, cfg *oauth2.Config, store *drivesync.FileTokenStore, prompt io.Writer, force bool) (*oauth2.Token, error) {
	fmt.Fprintln(prompt, "Sign in to Google in your browser to let notes keep its data in your Drive.")
	tok, err := drivesync.SignIn(ctx, cfg, drivesync.SignInOptions{
		OpenBrowser:  openBrowser,
		Prompt:       prompt,
		ForceConsent: force,
	})
	if errors.Is(err, drivesync.ErrSignInCancelled) {
		return nil, errors.New("sign-in cancelled: notes needs access to its own folder in your Drive to sync; run notes -drive signin to try again")
	}
	if err != nil {
		return nil, err
	}
	if err := store.Save(ctx, tok); err != nil {
		return nil, err
	}
	fmt.Fprintln(prompt, "Signed in. The sign-in is saved in", store.Path())
	return tok, nil
}

// signInAgain is the signin command: a new sign-in replaces the saved one,
// after it expired or was revoked, or to switch Google accounts.
func signInAgain(ctx context.Context, opts options) error {
	cfg, err := oauthConfig(opts.credentials)
	if err != nil {
		return err
	}
	store, err := tokenStore()
	if err != nil {
		return err
	}
	_, err = signIn(ctx, cfg, store, opts.prompt, true)
	return err
}

// signOut is the signout command: it deletes the saved sign-in. Google
// still lists the app as having access until the user removes it.
func signOut(w io.Writer) error {
	store, err := tokenStore()
	if err != nil {
		return err
	}
	err = os.Remove(store.Path())
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintln(w, "not signed in")
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "signed out: deleted", store.Path())
	fmt.Fprintln(w, "to also revoke the app's access to your Drive, remove it at https://myaccount.google.com/permissions")
	return nil
}

// driveHelp says what the user can do about the Drive errors only they can
// fix, keeping err for errors.Is and the details.
func driveHelp(err error) error {
	switch {
	case errors.Is(err, drivesync.ErrAuth):
		return fmt.Errorf("sign-in with Google expired or was revoked: run `notes -drive signin` again (%w)", err)
	case errors.Is(err, drivesync.ErrQuota):
		return fmt.Errorf("your Google Drive is full: free some space or buy more storage, then sync again (%w)", err)
	}
	return err
}
