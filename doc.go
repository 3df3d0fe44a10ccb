// Package drivesync keeps one user's SQLite database in sync across that
// user's devices, through storage the user already owns or through
// drivesync's own sync server:
//
//   - a Google Drive folder (NewDriveRemote), or any folder that Dropbox,
//     iCloud Drive, Syncthing, a network share or a USB stick carries
//     between machines (NewFolderRemote): no server of the app's own;
//   - an S3 bucket, or a server speaking its API (package s3remote);
//   - a sync server (cmd/drivesync-server, package syncserver), which
//     merges the devices' records and serves plain REST clients too
//     (Config.Server, package httpremote).
//
// # Using it
//
// The app keeps its own *sql.DB (drivesync never opens SQLite itself) and
// registers the tables to sync:
//
//	eng, err := drivesync.Open(ctx, db, drivesync.Config{
//		Remote: remote, // drivesync.NewFolderRemote(dir), ...; or Server: httpremote.New(...)
//		Tables: []drivesync.Table{{Name: "notes"}},
//	})
//	...
//	report, err := eng.Sync(ctx) // on start, on exit, on "Sync now"
//
// A synced table takes one of two shapes. A document table has id TEXT
// PRIMARY KEY (never NULL), a content column holding the record as a
// JSON object (JSONB or text), merged per member path, and any other
// columns, which are projections of the same-named top-level keys of
// content: when the engine writes a row it fills them from content. An
// ordinary table is any table with a declared PRIMARY KEY of one or more
// TEXT, INTEGER or BLOB columns and no content column: its typed columns
// sync as they are, each merging on its own, and a record is its key (a
// single INTEGER PRIMARY KEY, numbered apart on each device, needs
// Table.UniqueIntegerKey). Table.AppendOnly makes an ordinary table's rows
// immutable once written, as a log's are: the app's UPDATE and DELETE
// are refused, and two payloads under one key are reported
// (ErrImmutableConflict), never merged. The app reads and writes its
// tables with plain SQL; triggers record which rows changed. The README
// ("A synced table", "An ordinary table", "Append-only tables") has the
// details.
//
// # The sync cycle
//
// Each Sync lists the remote and downloads the patch files of other
// devices it has not applied yet; diffs each locally changed record
// against its last synced state from before those downloads; stamps the
// changes with Lamport versions above everything it has seen; uploads
// them as one gzip file of RFC 7396 merge patches (several, past the
// store's file limits); and applies everything
// to the synced state (table sync_states) and the app's tables in one
// transaction. Nothing is ever overwritten on the remote, so devices need
// no lock and the remote may be eventually consistent. Through a sync
// server, a Sync instead pushes its stamped changes in one request and
// pulls the records merged since its cursor (see Server); the merge is
// the same.
//
// # Conflicts
//
// Every member path of a record carries the stamp (version, device id) of
// its last write. The state after any set of patch files is the state
// after applying them in stamp order, whatever order they arrive in and
// however often: devices that have seen the same files are byte-identical.
// In practice:
//
//   - Edits of different fields, or of different keys of a nested object,
//     on different devices all survive. Keep small collections as objects
//     keyed by id ({"tags": {"<uuid>": {...}}}) so additions merge; arrays
//     are values and are replaced whole.
//   - When two devices change the same field between syncs, the device
//     that syncs later wins: its change is stamped after everything it
//     downloaded first. Equal versions are won by the larger device id.
//   - A physical delete hides the record and keeps its fields. An edit
//     stamped after it (another device edited the record without having
//     seen the delete, and synced later) brings the whole record back
//     with that edit on top; one stamped before it stays hidden. A record
//     is never re-created in part. A row inserted again over one the
//     device saw deleted is exactly the new row everywhere. A soft delete (a deleted_at
//     field in content) is an ordinary edit.
//
// What a concurrent write overwrote is kept in the conflict log
// (Engine.Conflicts) on each device that showed it: the side that lost,
// not a device that received both writes in one sync. ResolveConflict
// brings it back (KeepLoser) or dismisses it (KeepWinner). For an ordinary table,
// Conflict.Key is the row's key as Go values and DecodeColumnValue reads
// the two values, which the log keeps as typed JSON.
//
// # On top of Sync
//
//   - Config.Encryption (Passphrase, X25519Key) encrypts and
//     authenticates every file a device uploads; a wrong or missing key
//     fails Sync with ErrWrongKey before anything is applied or uploaded.
//     Through a sync server, an encrypted store keeps sealed files there
//     (httpremote.Client.Files), which the devices merge.
//   - Engine.AutoSync syncs by itself: after local edits, every interval,
//     at once on SyncNow, backing off while the remote is unreachable.
//   - Engine.Status says what waits and how the last sync went, from the
//     database alone; Config.Progress reports files, bytes and records.
//
// # Values
//
// RFC 7396 cannot set a member to null (null means "remove"), so a member
// whose value is null is the same as a missing member: synced content
// drops null members of objects (nulls inside arrays stay). Numbers keep
// their exact text: integers beyond 2^53 and long decimals round-trip.
// Object keys are stored sorted.
//
// # Writing during a sync
//
// The app need not block its UI while Sync runs. A record written while a
// sync is in flight stays pending for the next sync, and its row ends as
// the merged synced state with the app's edits on top. Use WAL mode and a
// busy timeout (see the README) so writers wait for the engine's short
// final transaction instead of failing.
//
// # Drivers
//
// The engine uses only database/sql and imports no SQLite driver. It is
// tested with modernc.org/sqlite, github.com/mattn/go-sqlite3 and
// github.com/ncruces/go-sqlite3, which need SQLite 3.45 or later (JSONB);
// the README gives each one's DSN.
//
// # Remote files
//
// Everything read from the remote is untrusted. Table names are checked
// against a strict pattern before any SQL sees them, sizes and gzip
// expansion are bounded by the store's Limits (recorded in the store's
// marker, the same for every device), versions by the time a file is
// named, and a malformed file is rejected whole, reported in
// Report.Rejected, read again later, and does not stop the other files or
// the upload. A file a device cannot read reaches it through a snapshot
// that holds it.
//
// Files can also vanish: a sync tool loses one, a user cleans the folder.
// Each device numbers the files it publishes, so a device that holds a
// file no longer on the remote finds it gone, reports it in
// Report.Vanished and writes a snapshot that holds it, from which the
// devices that missed it take it; a device that received files of a
// device before and after one it lacks reports that one in
// Report.Missing and Status.Missing until then.
package drivesync
