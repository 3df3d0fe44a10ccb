package drivesync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"
)

// A Remote is the storage the devices share: a Google Drive folder, a plain
// directory, a bucket. The engine only ever creates new files, reads them,
// lists them and deletes old ones; it never overwrites a file, so a Remote
// needs no locking and may be eventually consistent.
//
// Names are slash-separated paths relative to the Remote's root, such as
// "2026/11/22/patch_20261122T101500.123Z_<device>.json.gz". Every method
// takes a context and must return promptly with ctx.Err() (possibly
// wrapped) once the context is done.
//
// Implementations must be safe for concurrent use.
type Remote interface {
	// List returns every file created at or after since, by the remote's
	// clock. It may return older files too (a folder that other tools
	// fill may deliver files late, so FolderRemote lists everything); the
	// engine skips the files it has already applied. A zero since lists
	// all files. The order of the result is unspecified.
	List(ctx context.Context, since time.Time) ([]RemoteFile, error)

	// Open opens the named file for reading. A file that does not exist
	// gives an error that matches fs.ErrNotExist.
	//
	// An error that matches fs.ErrPermission says that this one file may
	// not be read while the remote itself works: a file another user of
	// a shared folder made unreadable, a file Drive will not let this
	// account download. The engine skips such a file, reports it in
	// Report.Rejected and reads it again later, as it does a malformed
	// file. Every other error says that the remote is failing (the
	// network, the service, the sign-in, a cancelled context); it fails
	// the sync with ErrRemote, or the context's error, and the next
	// sync tries again. So an Open must not report an outage as
	// fs.ErrPermission, nor a refusal of one file as an outage.
	Open(ctx context.Context, name string) (io.ReadCloser, error)

	// Create stores content under name, creating parent folders as
	// needed. A file must never be visible half-written: readers see
	// either nothing or the whole content. A read of content that fails
	// fails the Create, which then stores nothing, even when content can
	// seek and the Remote learnt its size first. If a file with that name
	// already exists, Create returns an error that matches fs.ErrExist
	// and leaves the existing file alone.
	Create(ctx context.Context, name string, content io.Reader) error

	// Delete removes the named file permanently. Deleting a file that
	// does not exist is not an error.
	Delete(ctx context.Context, name string) error

	// Now returns the remote's current time. File names carry it, so that
	// devices whose clocks disagree still sort their files in the order
	// the remote saw them.
	Now(ctx context.Context) (time.Time, error)
}

// unreadableFile reports whether err, from Remote.Open, means that this one
// file cannot be read while the remote works (see Remote.Open). An error
// once ctx is done is the sync's end, whatever it says. The marker and the
// device's own upload are not skipped this way: without them a sync cannot
// go on, so any error reading them fails it.
func unreadableFile(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && errors.Is(err, fs.ErrPermission)
}

// An IdentifiedRemote is a Remote that can name the storage behind it: the
// folder, the account and space, the bucket its files live in.
//
// The engine needs it for one decision. When the remote holds a store
// other than this database's, created moments after this database created
// its own, two explanations fit: another device created the store's marker
// at the same moment on the same storage (the engine joins that store,
// uploading what it had), or the app now points at another folder or
// account where another store began at about the same time (the engine
// stops with ErrRemoteChanged and lets the app decide). The engine records
// the identity when it binds to a store; only a remote with the same
// identity gets the first explanation. With a Remote that cannot tell, the
// engine takes the first.
type IdentifiedRemote interface {
	Remote
	// Identity returns a string that stays the same for as long as the
	// Remote reaches the same storage, across restarts of the app where
	// the storage outlives them, and differs for any other storage the
	// app could be pointed at. Identities are compared only with those
	// the same device recorded, never across devices: a shared folder
	// may have a different path on each machine. The engine stores and
	// shows it, so it must hold no secret.
	Identity(ctx context.Context) (string, error)
}

// RemoteFile describes one file of a Remote.
type RemoteFile struct {
	Name string // slash-separated path relative to the remote's root
	Size int64  // size in bytes, or -1 if the remote does not know it
}

// CheckRemoteName reports why name is not a valid Remote file name, for
// Remotes outside this package, which must apply the same rules.
func CheckRemoteName(name string) error { return checkRemoteName(name) }

// checkRemoteName reports why name is not a valid Remote file name. The rules
// are those of the strictest Remote, a shared folder: a name must stay inside
// the root, mean the same path on every OS, and start no element with "."
// because FolderRemote keeps its temp files under such names and sync tools
// keep their state there. Every Remote applies the same rules so that code
// tested against MemoryRemote also works against a folder.
func checkRemoteName(name string) error {
	bad := func(why string) error { return fmt.Errorf("invalid name %q: %s", name, why) }
	switch {
	case name == "":
		return bad("empty")
	case name[0] == '/':
		return bad("must be relative, not start with /")
	case strings.ContainsRune(name, '\\'):
		return bad("contains a backslash; use / to separate folders")
	case strings.ContainsRune(name, 0):
		return bad("contains NUL")
	}
	for elem := range strings.SplitSeq(name, "/") {
		switch {
		case elem == "":
			return bad("has an empty path element")
		case elem == "." || elem == "..":
			return bad(`has a "." or ".." element`)
		case elem[0] == '.':
			return bad(`has an element starting with ".", which is reserved for temp files`)
		}
	}
	return nil
}
