package httpremote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/drivesync/drivesync"
)

// Files returns a Remote that keeps the store's files on the server: the
// way devices whose data the server must not read sync through it. With
// Config.Encryption set, an Engine whose Config.Server is a Client syncs
// through Files by itself, so an app need not call it:
//
//	srv := httpremote.New(url, token, httpremote.Options{Store: "notes"})
//	eng, err := drivesync.Open(ctx, db, drivesync.Config{Server: srv, Encryption: drivesync.Passphrase(p), Tables: tables})
//
// The server then holds sealed files, as a shared folder would: it cannot
// read them and does not merge them; the devices do, and write the
// store's snapshots and compact it themselves. A store keeps records or
// files, whichever it was made with: a device that syncs records (no key)
// with a store of files, or files with a store of records, fails with
// drivesync.ErrWrongKey.
func (c *Client) Files() drivesync.Remote { return &files{c: c} }

// files is a store's files on the server.
type files struct{ c *Client }

var _ drivesync.IdentifiedRemote = (*files)(nil)

func (f *files) query(name string) url.Values {
	q := url.Values{"store": {f.c.opts.Store}}
	if name != "" {
		q.Set("name", name)
	}
	return q
}

func (f *files) List(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
	if f.c.err != nil {
		return nil, f.c.err
	}
	q := f.query("")
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	var res struct {
		Files []struct {
			Name string `json:"name"`
			Size int64  `json:"size"`
		} `json:"files"`
	}
	if err := f.c.call(ctx, http.MethodGet, "/sync/files", q, nil, "", &res); err != nil {
		return nil, fmt.Errorf("httpremote: list files: %w", err)
	}
	out := make([]drivesync.RemoteFile, len(res.Files))
	for i, r := range res.Files {
		out[i] = drivesync.RemoteFile{Name: r.Name, Size: r.Size}
	}
	return out, nil
}

func (f *files) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if f.c.err != nil {
		return nil, f.c.err
	}
	var body io.ReadCloser
	err := f.c.pace.Call(ctx, func() error {
		res, err := f.c.sendWith(ctx, f.c.files, http.MethodGet, "/sync/file", f.query(name), nil, "", "")
		if err == nil {
			body = res.Body
		}
		return err
	}, retryable)
	if err != nil {
		return nil, fmt.Errorf("httpremote: open %s: %w", name, err)
	}
	return body, nil
}

func (f *files) Create(ctx context.Context, name string, content io.Reader) error {
	if f.c.err != nil {
		return f.c.err
	}
	if err := drivesync.CheckRemoteName(name); err != nil {
		return fmt.Errorf("httpremote: create: %w", err)
	}
	// A request sent again must send the same bytes: the server takes a
	// file of that name and content for the same request's, whose answer
	// was lost.
	// Each attempt reads the content through a reader of its own (see
	// sendWith): from a file or bytes as they are, anything else once
	// into memory.
	var body *io.SectionReader
	if ra, ok := content.(interface {
		io.ReaderAt
		io.Seeker
	}); ok {
		size, err := ra.Seek(0, io.SeekEnd)
		if err != nil {
			return fmt.Errorf("httpremote: create %s: %w", name, err)
		}
		body = io.NewSectionReader(ra, 0, size)
	} else {
		b, err := io.ReadAll(content)
		if err != nil {
			return fmt.Errorf("httpremote: create %s: %w", name, err)
		}
		body = io.NewSectionReader(bytes.NewReader(b), 0, int64(len(b)))
	}
	err := f.c.pace.Call(ctx, func() error {
		res, err := f.c.sendWith(ctx, f.c.files, http.MethodPut, "/sync/file", f.query(name), body, "application/octet-stream", "")
		if err == nil {
			res.Body.Close()
		}
		return err
	}, retryable)
	if err != nil {
		return fmt.Errorf("httpremote: create %s: %w", name, err)
	}
	return nil
}

func (f *files) Delete(ctx context.Context, name string) error {
	if f.c.err != nil {
		return f.c.err
	}
	var res struct {
		Deleted bool `json:"deleted"`
	}
	if err := f.c.call(ctx, http.MethodDelete, "/sync/file", f.query(name), nil, "", &res); err != nil {
		return fmt.Errorf("httpremote: delete %s: %w", name, err)
	}
	return nil
}

func (f *files) Now(ctx context.Context) (time.Time, error) {
	if f.c.err != nil {
		return time.Time{}, f.c.err
	}
	var res struct {
		ServerTime time.Time `json:"server_time"`
	}
	if err := f.c.call(ctx, http.MethodGet, "/sync/time", nil, nil, "", &res); err != nil {
		return time.Time{}, fmt.Errorf("httpremote: read the server's clock: %w", err)
	}
	if res.ServerTime.IsZero() {
		return time.Time{}, errors.New("httpremote: the server's clock: no server_time in its answer")
	}
	return res.ServerTime, nil
}

// Identity is the Client's: the server's URL and the store's name.
func (f *files) Identity(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	return f.c.Identity(), nil
}
