// Package remotetest checks that a [drivesync.Remote] keeps the contract
// the sync engine relies on. It is to a Remote what testing/fstest.TestFS is
// to an fs.FS: whoever writes a Remote (for a bucket, a WebDAV share, a
// server of their own) calls [Run] from their tests, and a Remote that
// passes can be given a user's data.
//
// # Running the suite
//
// Call Run from a test of the package that defines the Remote:
//
//	func TestConformance(t *testing.T) {
//		remotetest.Run(t, func(t *testing.T) drivesync.Remote {
//			return mybucket.New(newTestBucket(t))
//		})
//	}
//
// Run calls newRemote once for each subtest, with the subtest's t. It must
// return an empty Remote that nothing else uses while the subtest runs: a
// new temp folder, bucket, prefix or fake server. Several subtests check
// List's result exactly, so a file left by another subtest, or written by
// anyone else, fails them. Remove the storage with t.Cleanup, and call
// t.Fatal if it cannot be made. The subtests run one after another, but
// some call the Remote from many goroutines at once: run the suite with
// -race.
//
// # What it checks
//
// Each subtest checks one promise made on [drivesync.Remote] and
// [drivesync.IdentifiedRemote], and its failure messages say what the
// Remote did and what it must do instead.
//
//   - RoundTrip, CreateReaders: Open reads back exactly what Create stored,
//     from empty to several megabytes, whatever io.Reader the content comes
//     from. The engine's content readers cannot seek, and may return data
//     together with io.EOF.
//   - NestedNames: names are slash-separated paths relative to the root.
//     Create makes the folders a name needs, List returns each name as
//     Create was given it, and a folder that Delete emptied takes new files.
//   - CreateExisting, ConcurrentCreate: Create never replaces a file. A
//     name that exists gives an error matching fs.ErrExist and keeps its
//     content; of several Creates racing for one name, one wins and the
//     others get fs.ErrExist.
//   - HiddenWhileWriting, CreateReaderFails, CancelDuringCreate: no one
//     sees a file half-written. While Create is still reading its content,
//     Open and List show nothing (or, if they wait for the Create, the
//     whole file). A Create whose content fails, or whose context is
//     cancelled, returns an error and leaves nothing readable, and the
//     name free for the next try.
//   - OpenMissing: opening a file that does not exist gives an error
//     matching fs.ErrNotExist.
//   - Delete, DeleteMissing: Delete removes one file for good, leaves the
//     others alone and frees the name; deleting a missing file is not an
//     error.
//   - ListAll, ListSince: List with a zero since returns every file once,
//     with its size (or -1), and no deleted file. List(since) returns at
//     least every file created at or after since by the remote's clock,
//     whatever time zone since is in. Older files may be listed too.
//   - Now: the remote's clock is a real time, within a day of this
//     machine's clock, and never goes back more than a second.
//   - CancelledContext, DeadlineExceeded: every method called with a
//     context that is done returns at once, with an error matching
//     ctx.Err(), and changes nothing.
//   - InvalidNames: Create and Open refuse a name that is empty or
//     absolute, has an empty, "." or ".." element, a backslash or NUL, or
//     an element starting with "." (those are kept for temp files); a
//     Delete of such a name removes nothing.
//   - Concurrent: all methods may be called from many goroutines at once.
//   - Identity: for a Remote that implements drivesync.IdentifiedRemote,
//     Identity is not empty, is the same on every call, and honours its
//     context. The subtest is skipped for other Remotes.
//
// The suite expects a file to be listed and readable as soon as Create has
// returned. Some promises cannot be checked from outside, so review them by
// hand: that Identity differs for any other storage and holds no secret,
// and that Open returns fs.ErrPermission only when one file cannot be read
// while the remote itself works.
//
// # Options
//
// Pass an [Options] to Run only for a store that cannot keep part of the
// contract; the engine copes with what each option allows. Everything not
// named by an option is checked in full.
package remotetest
