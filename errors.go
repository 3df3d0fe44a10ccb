package drivesync

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/drivesync/drivesync/internal/sqliteerr"
)

// Errors the engine returns, for use with errors.Is. Each comes wrapped in
// an *Error that says which operation, table, record or file it concerns.
var (
	// ErrCorruptFile marks a remote file that is not a valid patch file:
	// not gzip, not the expected JSON, a bad table name, a wrong type. The
	// file is skipped and reported; nothing of it is applied.
	ErrCorruptFile = errors.New("corrupt remote file")
	// ErrUnsupportedFormat marks a remote file written by a newer version
	// of the library. Upgrade the app to read it.
	ErrUnsupportedFormat = errors.New("file format is newer than this app: upgrade the app")
	// ErrFileTooLarge marks a remote file over one of the store's Limits,
	// compressed or expanded, or one of whose records is.
	ErrFileTooLarge = errors.New("remote file too large")
	// ErrRemote wraps a failure of the Remote (network, permissions,
	// quota). The sync can be retried later; nothing was lost.
	ErrRemote = errors.New("remote storage failed")
	// ErrClosed is returned by Sync after Close.
	ErrClosed = errors.New("engine closed")
	// ErrAuth marks a remote that refused the app's credentials. What
	// the user does depends on the remote, and its error says it: for
	// Google Drive the sign-in expired or was revoked (invalid_grant), or
	// the app lacks the permission, and the user signs in again; for S3
	// the access key is wrong or may not use the bucket; for a sync
	// server (httpremote) the server refused the token (401: unknown,
	// or removed from its tokens file) or the token's user may not use
	// the store (403).
	ErrAuth = errors.New("not authorized")
	// ErrQuota marks a remote that is out of storage. The user must free
	// space or buy more.
	ErrQuota = errors.New("storage quota exceeded: free space on the drive or buy more storage")
	// ErrRemoteChanged stops Sync when the remote is not the store this
	// database syncs with: it was emptied, or the app now points at
	// another account or folder. Nothing local was changed. The app
	// decides: StartFresh makes this database's data a new store there,
	// JoinRemote merges with the store the remote holds; or point the app
	// back at the right remote.
	ErrRemoteChanged = errors.New("the remote is not the store this database syncs with")
	// ErrImmutableConflict marks a record of an append-only table
	// (Table.AppendOnly) whose row on this device holds another payload
	// than one another device wrote under the same key. Nothing is
	// overwritten: each device keeps its row, and every Sync reports the
	// record in Report.Unwritten until the app deletes its row of that
	// key, which the trigger allows for such a record only; the row then
	// takes the synced payload, the same on every device.
	ErrImmutableConflict = errors.New("append-only row differs from the one another device wrote under the same key")
	// ErrDeviceIDShared stops a Sync through a Server that refused this
	// database's changes: the store holds another write under one of
	// their stamps, so another database syncs under this device id (a
	// copy of this database file). Nothing of them was applied; they stay
	// pending. A database whose device id the engine chose takes a new
	// one, and the next Sync sends them under it; an app that sets
	// Config.DeviceID must give each copy its own.
	ErrDeviceIDShared = errors.New("another database syncs under this device id (a copy of this database)")
	// ErrServerRefused marks a push a sync server refused whole as
	// invalid or too large (its limits shrank since the changes were
	// planned). Nothing of it was applied; the changes stay pending, and
	// the next Sync plans them again under the server's limits.
	ErrServerRefused = errors.New("the sync server refused the push")
	// ErrWrongKey stops a Sync whose key does not fit the store: the
	// store is encrypted and Config.Encryption is unset or opens none of
	// its key checks, the store is plain and Config.Encryption is set, or
	// another device changed the store's key. Nothing was applied or
	// uploaded. The app asks the user for the passphrase (or key) again.
	ErrWrongKey = errors.New("the encryption key does not fit the store")
)

// Error describes a failure of one step of a sync.
type Error struct {
	Op     string // the step: "open", "list", "download", "upload", "apply", ...
	Table  string // the table concerned, if any
	Record string // the record id concerned, if any
	File   string // the remote file concerned, if any
	Err    error
}

// Error formats the failure with the step, file, table and record it names.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("drivesync: ")
	b.WriteString(e.Op)
	if e.File != "" {
		b.WriteString(" " + e.File)
	}
	if e.Table != "" {
		b.WriteString(" " + e.Table)
		if e.Record != "" {
			b.WriteString("/" + e.Record)
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns the underlying error, for errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Err }

// databaseReadOnly names the database file in a failure to write it, which
// SQLite reports only as "attempt to write a readonly database" (the app
// opened it with mode=ro, or SQLite could not open the file for writing
// and read it instead), and says what to do. Other errors pass unchanged.
func databaseReadOnly(ctx context.Context, q querier, err error) error {
	if !sqliteerr.IsReadOnly(err) {
		return err
	}
	var path string
	q.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&path)
	if path == "" {
		path = "(in memory)"
	}
	return fmt.Errorf("database file %s is read-only: open it writable (no mode=ro in the DSN) and check that the app may write the file and its folder: %w", path, err)
}
