package drivesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/drivesync/drivesync/internal/merge"
	"github.com/google/uuid"
)

// The marker (drivesync.json at the remote's root) names the store and
// records its limits. Each device records the id it syncs with, so that a
// remote that was emptied, or swapped for another account or folder, stops
// Sync with ErrRemoteChanged instead of looking like a store where every
// record was deleted; JoinRemote and StartFresh are the app's answers.

// The marker: drivesync.json at the remote's root. Format 2 is the
// marker of an encrypted store: an app that reads only format 1 would
// ignore its encryption and upload plain files, so it must refuse it.
// Plain stores keep format 1.
const (
	markerName   = "drivesync.json"
	markerFormat = 2
	maxMarker    = 64 << 10
)

type marker struct {
	Format  int64     `json:"format"`
	Store   string    `json:"store"`
	Created time.Time `json:"created"` // the remote's time; a store's first snapshot is due the month after
	// Limits are the store's (see Limits); a marker without them has
	// the defaults.
	Limits *markerLimits `json:"limits,omitempty"`
	// Encryption is set on an encrypted store (see encryption.go).
	Encryption *markerEncryption `json:"encryption,omitempty"`
}

type markerLimits struct {
	MaxFileSize     int64 `json:"max_file_size"`
	MaxExpandedSize int64 `json:"max_expanded_size"`
	MaxRecordSize   int64 `json:"max_record_size"`
	MaxSnapshotSize int64 `json:"max_snapshot_size"`
	MaxHeldFiles    int64 `json:"max_held_files"`
}

// limits returns the store's limits. The marker is untrusted like every
// remote file: limits outside sane bounds make it unreadable rather than
// have devices read unbounded files.
func (m marker) limits() (Limits, error) {
	if m.Limits == nil {
		return Limits{}.withDefaults(), nil
	}
	l := Limits{MaxFileSize: m.Limits.MaxFileSize, MaxExpandedSize: m.Limits.MaxExpandedSize,
		MaxRecordSize: m.Limits.MaxRecordSize, MaxSnapshotSize: m.Limits.MaxSnapshotSize, MaxHeldFiles: m.Limits.MaxHeldFiles}
	if err := l.check(); err != nil {
		return l, fmt.Errorf("%w: marker: %w", ErrCorruptFile, err)
	}
	return l, nil
}

// readMarker reads the remote's marker; found is false if there is none.
func readMarker(ctx context.Context, r Remote) (m marker, found bool, err error) {
	rc, err := r.Open(ctx, markerName)
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, remoteErr("read marker", markerName, err)
	}
	defer rc.Close()
	src := &countingReader{r: &limitedReader{r: rc, n: maxMarker, what: "marker"}}
	derr := json.NewDecoder(src).Decode(&m)
	switch {
	case src.failed != nil:
		return m, false, remoteErr("read marker", markerName, src.failed)
	case derr != nil:
		return m, true, &Error{Op: "read marker", File: markerName, Err: fmt.Errorf("%w: %w", ErrCorruptFile, derr)}
	case m.Format > markerFormat:
		return m, true, &Error{Op: "read marker", File: markerName, Err: fmt.Errorf("%w: marker format %d; this app reads up to %d", ErrUnsupportedFormat, m.Format, markerFormat)}
	case m.Format < 1 || merge.CheckDeviceID(m.Store) != nil:
		return m, true, &Error{Op: "read marker", File: markerName, Err: fmt.Errorf("%w: marker has format %d and store %q", ErrCorruptFile, m.Format, m.Store)}
	}
	if _, err := m.limits(); err != nil {
		return m, true, &Error{Op: "read marker", File: markerName, Err: err}
	}
	if m.Encryption != nil {
		if err := m.Encryption.valid(); err != nil {
			return m, true, &Error{Op: "read marker", File: markerName, Err: err}
		}
	}
	return m, true, nil
}

// writeMarker creates the marker of a new store with this device's limits
// and encryption.
func (e *Engine) writeMarker(ctx context.Context, store string, created time.Time) error {
	l := e.cfg.Limits
	m := marker{Format: 1, Store: store, Created: created.UTC(), Limits: &markerLimits{
		MaxFileSize: l.MaxFileSize, MaxExpandedSize: l.MaxExpandedSize, MaxRecordSize: l.MaxRecordSize,
		MaxSnapshotSize: l.MaxSnapshotSize, MaxHeldFiles: l.MaxHeldFiles,
	}}
	var err error
	if m.Encryption, err = e.newMarkerEncryption(store); err != nil {
		return &Error{Op: "write marker", Err: fmt.Errorf("Config.Encryption: %w", err)}
	}
	if m.Encryption != nil {
		m.Format = 2
	}
	b, _ := json.Marshal(m)
	return e.cfg.Remote.Create(ctx, markerName, strings.NewReader(string(b)+"\n"))
}

// bind checks that the remote holds the store this database syncs with,
// creating the marker on a remote that has none yet and that this
// database never synced with, and sets the run's store and limits.
// rebound reports that it joined another store (a lost race to create
// the marker): the sync must then list that store from the start.
func (s *syncRun) bind(ctx context.Context, l *listing) (rebound bool, err error) {
	e := s.e
	var bound, claim, last string
	for _, kv := range []struct {
		key string
		v   *string
	}{{metaStore, &bound}, {metaStoreClaim, &claim}, {metaSnapshot, &last}} {
		var err error
		if *kv.v, err = getMeta(ctx, s.conn, kv.key); err != nil {
			return false, &Error{Op: "sync", Err: err}
		}
	}
	m, found, err := readMarker(ctx, e.cfg.Remote)
	if err != nil {
		return false, err
	}
	identity, recorded, err := s.remoteIdentity(ctx)
	if err != nil {
		return false, err
	}
	// Our marker made moments ago explains a different store, or none,
	// only on the storage we made it on.
	sameRemote := identity == "" || recorded == "" || identity == recorded
	var set []string
	switch {
	case found && m.Store == bound:
		// Our marker held for two overlaps: another device's marker
		// created in the same moment would show by now.
		at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(claim, claimSeen))
		switch {
		case claim != "" && (err != nil || !l.cursor.Before(at.Add(2*e.cfg.ListOverlap))):
			set = append(set, metaStoreClaim, "")
		case claim != "" && !strings.HasPrefix(claim, claimSeen):
			set = append(set, metaStoreClaim, claimSeen+claim) // read back: no longer "not listed yet"
		}
	case found && bound == "":
		set = append(set, metaStore, m.Store) // the first sync with this remote
	case found && m.Store != bound && !sameRemote:
		return false, &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote holds store %s, but this database syncs with store %s, and the remote is %s, not %s where this database synced: the app is pointed at another folder or signed in to another account. Nothing local was changed. Point the app back at the right remote, or call JoinRemote to merge this database with that store", ErrRemoteChanged, m.Store, bound, identity, recorded)}
	case found && claim != "" && racedWith(claim, m.Created, e.cfg.ListOverlap):
		// Our own marker lost a race with another device's, created in
		// the same moment (Drive allows two files of one name, and every
		// device reads the same one): join that store, uploading what
		// this device had.
		e.log.Info("drivesync: another device created the store's marker at the same time; joining its store", "store", m.Store)
		if err := s.rebind(ctx, m.Store, true); err != nil {
			return false, err
		}
		rebound = true
		last, recorded = "", "" // rebind forgot them
		// Until the listings settle, the marker every device reads may
		// still change: keep treating a change as this race.
		set = append(set, metaStoreClaim, claim)
	case found:
		return false, &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote holds store %s, but this database syncs with store %s: the app may be signed in to another account or pointed at another folder. Nothing local was changed. Point the app back at the right remote, or call JoinRemote to merge this database with that store", ErrRemoteChanged, m.Store, bound)}
	case bound != "" && !sameRemote:
		return false, &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote has no %s, and it is %s, not %s where store %s lives: the app is pointed at another folder or signed in to another account. Nothing local was changed or deleted. Point the app back at the right remote, or call StartFresh to upload this database's data there as a new store", ErrRemoteChanged, markerName, identity, recorded, bound)}
	case bound != "" && claim != "" && !strings.HasPrefix(claim, claimSeen) && racedWith(claim, l.cursor, 2*e.cfg.ListOverlap):
		// We created the marker moments ago; the remote does not list
		// it yet.
		m = marker{Store: bound}
	case bound != "":
		return false, &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: the remote has no %s: it was emptied, or it is another folder or account than the one store %s lives in. Nothing local was changed or deleted. Point the app back at the right remote, or call StartFresh to upload this database's data there as a new store", ErrRemoteChanged, markerName, bound)}
	default:
		m = marker{Store: newStoreID(), Created: l.cursor}
		err = e.writeMarker(ctx, m.Store, m.Created)
		if errors.Is(err, fs.ErrExist) { // another device created it since we looked
			if m, found, err = readMarker(ctx, e.cfg.Remote); err == nil && !found {
				err = fmt.Errorf("%w: the marker exists but cannot be read; sync again", ErrRemote)
			}
			if err != nil {
				return false, remoteErr("read marker", markerName, err)
			}
			set = append(set, metaStore, m.Store)
			break
		}
		if err != nil {
			return false, remoteErr("write marker", markerName, err)
		}
		e.log.Info("drivesync: created the store's marker on the remote", "store", m.Store)
		set = append(set, metaStore, m.Store, metaStoreClaim, l.cursor.UTC().Format(time.RFC3339Nano))
	}
	s.store = m.Store
	own := m.Limits == nil && m.Format == 0
	if own {
		// The marker this device just wrote, or the one it wrote moments
		// ago and cannot list yet: this device's limits are the store's.
		s.limits = e.cfg.Limits
	} else if s.limits, err = m.limits(); err != nil {
		return false, &Error{Op: "read marker", File: markerName, Err: err}
	}
	if err := s.bindKeys(ctx, m, own, l); err != nil {
		return false, err
	}
	if last == "" && !m.Created.IsZero() {
		// A store's first snapshot is due in the month after it began.
		set = append(set, metaSnapshot, m.Created.UTC().Format(time.RFC3339Nano))
	}
	if identity != recorded && identity != "" {
		// Bound, or still bound, through this remote: a folder that moved
		// is recorded where it is now.
		set = append(set, metaRemoteID, identity)
	}
	if len(set) == 0 {
		return rebound, nil
	}
	return rebound, s.setMetas(ctx, set...)
}

// remoteIdentity returns the identity of the remote (see IdentifiedRemote)
// and the one recorded when this database last bound to its store; each is
// "" when unknown.
func (s *syncRun) remoteIdentity(ctx context.Context) (identity, recorded string, err error) {
	if recorded, err = getMeta(ctx, s.conn, metaRemoteID); err != nil {
		return "", "", &Error{Op: "sync", Err: err}
	}
	r, ok := s.e.cfg.Remote.(IdentifiedRemote)
	if !ok {
		return "", recorded, nil
	}
	if identity, err = r.Identity(ctx); err != nil {
		return "", "", remoteErr("identify remote", "", err)
	}
	return identity, recorded, nil
}

// claimSeen prefixes the claim once this device has read its marker back.
const claimSeen = "seen "

// racedWith reports whether a marker created at other could have been
// created by another device without either seeing the other's.
func racedWith(claim string, other time.Time, overlap time.Duration) bool {
	at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(claim, claimSeen))
	d := other.Sub(at)
	return err == nil && d < overlap && d > -overlap
}

// JoinRemote binds this database to the store the remote holds now, after
// Sync failed with ErrRemoteChanged because the remote carries another
// store. The next Sync starts from that store's newest snapshot and files,
// merges them with this database (last writer wins, per field) and uploads
// this database's records there, so that the other devices of that store
// get them. Nothing is deleted on either side.
func (e *Engine) JoinRemote(ctx context.Context) error {
	_, err := e.run(ctx, func(s *syncRun) error {
		if e.cfg.Server != nil {
			return s.joinServer(ctx, false)
		}
		m, found, err := readMarker(ctx, e.cfg.Remote)
		if err != nil {
			return err
		}
		if !found {
			return &Error{Op: "join", File: markerName, Err: errors.New("the remote holds no store to join (it has no marker): call StartFresh to make this database's data a new store there")}
		}
		return s.rebind(ctx, m.Store, true)
	})
	return err
}

// StartFresh makes this database's data a new store on the remote, after
// Sync failed with ErrRemoteChanged because the remote was emptied: it
// writes a new marker, syncs, and uploads a snapshot of every record.
// Other devices of the old store then get ErrRemoteChanged and can
// JoinRemote. StartFresh refuses a remote that holds a store already.
func (e *Engine) StartFresh(ctx context.Context) (Report, error) {
	return e.run(ctx, func(s *syncRun) error {
		if e.cfg.Server != nil {
			if err := s.joinServer(ctx, true); err != nil {
				return err
			}
			_, _, err := s.syncServer(ctx)
			return err
		}
		m, found, err := readMarker(ctx, e.cfg.Remote)
		if err != nil {
			return err
		}
		if found {
			return &Error{Op: "start fresh", File: markerName, Err: fmt.Errorf("the remote holds store %s: call JoinRemote to merge with it, or point the app at an empty folder", m.Store)}
		}
		now, err := e.cfg.Remote.Now(ctx)
		if err != nil {
			return remoteErr("start fresh", "", err)
		}
		store := newStoreID()
		if err := e.writeMarker(ctx, store, now); err != nil {
			return remoteErr("start fresh", markerName, err)
		}
		if err := s.rebind(ctx, store, false); err != nil {
			return err
		}
		l, f, err := s.sync(ctx)
		if err != nil {
			return err
		}
		return s.maintain(ctx, l, f, true)
	})
}

// rebind records store as this database's and forgets what it knew of
// the old remote, so that the next sync reads the new one from the start.
func (s *syncRun) rebind(ctx context.Context, store string, join bool) error {
	if err := beginImmediate(ctx, s.conn); err != nil {
		return &Error{Op: "rebind", Err: err}
	}
	err := func() error {
		if _, err := s.conn.ExecContext(ctx, `DELETE FROM sync_files`); err != nil {
			return err
		}
		if _, err := s.conn.ExecContext(ctx, `DELETE FROM sync_held`); err != nil {
			return err
		}
		j := ""
		if join {
			j = "1"
		}
		// The names uploaded so far are other stores' from now on: the
		// pruning that keeps the record of uploads to what the bound
		// store holds keeps them (see uploadsGone). A store joined
		// again still holds those files, which checkCopied would
		// otherwise take for a copy's.
		if err := keepUploads(ctx, s.conn); err != nil {
			return err
		}
		for _, kv := range [][2]string{{metaStore, store}, {metaStoreClaim, ""}, {metaCursor, ""}, {metaSnapshot, ""}, {metaCompact, ""}, {metaJoin, j}, {metaRemoteID, ""}, {metaServerCursor, ""}, {metaKeyVerified, ""}, {metaListedAll, ""}, {metaHealFailed, ""}, {metaMergeSeq, ""}} {
			if err := setMeta(ctx, s.conn, kv[0], kv[1]); err != nil {
				return err
			}
		}
		_, err := s.conn.ExecContext(ctx, "COMMIT")
		return err
	}()
	if err != nil {
		endTx(s.conn)
		return &Error{Op: "rebind", Err: err}
	}
	s.e.log.Info("drivesync: bound to a store", "store", store, "join", join)
	return nil
}

func newStoreID() string { return uuid.NewString() }
