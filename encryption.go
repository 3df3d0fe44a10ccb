package drivesync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"filippo.io/age"
	"github.com/drivesync/drivesync/internal/seal"
)

// End-to-end encryption. With Config.Encryption set, every file the
// engine uploads is an age file (age-encryption.org/v1) encrypted to the
// store's key and authenticated: a file changed by one byte, truncated, or
// renamed over another file's name is refused whole (Report.Rejected),
// like any malformed file. Names (the remote's times and device ids) and
// sizes stay visible; contents do not.
//
// The store's marker stays plain: it says the store is encrypted, and it
// carries a key check, a small age file encrypted to the key that created
// the store, which a device opens to learn that its key is the store's
// before it applies or uploads anything. A key added by rotation leaves a
// check of its own under keys/ (see bindKeys).

// A Key encrypts a store's files: Passphrase or X25519Key.
type Key interface {
	// identity returns the key's age identity for store; logN is the
	// store's scrypt work factor, for keys derived from a passphrase.
	identity(store string, logN int) (*age.X25519Identity, error)
	describe() string
}

// Passphrase returns the key derived from passphrase, with scrypt at the
// work factor age uses for its own passphrase files (N=2^18, about a second
// and 256 MiB, once per Engine), salted with the store's id. Every device
// of the store derives the same key from the same passphrase.
func Passphrase(passphrase string) Key { return passphraseKey(passphrase) }

// X25519Key returns the key of an age X25519 identity, as made by
// age.GenerateX25519Identity or age-keygen and read by
// age.ParseX25519Identity. Files are encrypted to its recipient; any file
// of the store can be decrypted with the identity and the age tool (each
// starts with a line naming the file, then the gzip bytes). Keep the
// recipient private as well as the identity: age does not tell who
// encrypted a file, so whoever knows the recipient could write files that
// devices would accept.
func X25519Key(identity *age.X25519Identity) Key { return x25519Key{identity} }

type passphraseKey string

func (k passphraseKey) identity(store string, logN int) (*age.X25519Identity, error) {
	if k == "" {
		return nil, errors.New("the passphrase is empty")
	}
	return seal.PassphraseIdentity(string(k), store, logN)
}

func (passphraseKey) describe() string { return "the passphrase" }

type x25519Key struct{ id *age.X25519Identity }

func (k x25519Key) identity(string, int) (*age.X25519Identity, error) {
	if k.id == nil {
		return nil, errors.New("the X25519 identity is nil")
	}
	return k.id, nil
}

func (x25519Key) describe() string { return "the X25519 key" }

// passphraseWork is the scrypt work factor (log2 N) of stores this
// device creates; a store keeps its own in its marker.
var passphraseWork = 18

// The bounds of a marker's work factor: a hostile marker must not make
// devices spend gigabytes deriving a key.
const minPassphraseWork, maxPassphraseWork = 1, 20

// markerEncryption is the marker's "encryption" member.
type markerEncryption struct {
	Scheme     string `json:"scheme"`       // "age-x25519"
	ScryptLogN int    `json:"scrypt_log_n"` // the work factor of passphrase keys
	Check      string `json:"check"`        // the key check (see seal.Check), base64
}

const encryptionScheme = "age-x25519"

func (m *markerEncryption) valid() error {
	switch {
	case m.Scheme != encryptionScheme:
		return fmt.Errorf("%w: the store is encrypted with scheme %q; this app knows %q", ErrUnsupportedFormat, m.Scheme, encryptionScheme)
	case m.ScryptLogN < minPassphraseWork || m.ScryptLogN > maxPassphraseWork:
		return fmt.Errorf("%w: marker: scrypt work factor %d is outside %d-%d", ErrCorruptFile, m.ScryptLogN, minPassphraseWork, maxPassphraseWork)
	case m.Check == "" || len(m.Check) > 4096:
		return fmt.Errorf("%w: marker: the key check is empty or too long", ErrCorruptFile)
	}
	return nil
}

// newMarkerEncryption returns the encryption member of a new store's
// marker, or nil if this device does not encrypt.
func (e *Engine) newMarkerEncryption(store string) (*markerEncryption, error) {
	if e.cfg.Encryption == nil {
		return nil, nil
	}
	id, err := e.keyIdentity(e.cfg.Encryption, store, passphraseWork)
	if err != nil {
		return nil, err
	}
	check, err := seal.Check(store, id.Recipient())
	if err != nil {
		return nil, err
	}
	return &markerEncryption{Scheme: encryptionScheme, ScryptLogN: passphraseWork, Check: check}, nil
}

// keyring is what a bound run encrypts and decrypts with.
type keyring struct {
	store string
	write *age.X25519Identity // the current key: new files are encrypted to it
	read  []age.Identity      // the current key, then the previous ones
	ids   string              // see id
	// first: one of the keys opens the marker's check, that of the key
	// the store was created with, or did when this device synced before
	// (it read the files of that key then, and dropped it afterwards, as
	// a key change ends).
	first bool
}

// id names the keys of k, "" for none: a file rejected under other keys
// is read again (see readerKey).
func (k *keyring) id() string {
	if k == nil {
		return ""
	}
	if k.ids == "" {
		k.ids = " " + strings.Join(k.fingerprints(), " ")
	}
	return k.ids
}

// keyIdentity derives k's identity for store, once per Engine: a
// passphrase costs a second of scrypt.
func (e *Engine) keyIdentity(k Key, store string, logN int) (*age.X25519Identity, error) {
	cache := fmt.Sprintf("%p %s %d", k, store, logN)
	if p, ok := k.(passphraseKey); ok {
		cache = fmt.Sprintf("p%d:%s %s %d", len(p), p, store, logN)
	}
	if id, ok := e.derived[cache]; ok {
		return id, nil
	}
	id, err := k.identity(store, logN)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.describe(), err)
	}
	if e.derived == nil {
		e.derived = map[string]*age.X25519Identity{}
	}
	e.derived[cache] = id
	return id, nil
}

// A key added by a rotation leaves its check under keys/, named
// key_{remote time}_{device}_{fingerprint}.age: the fingerprint (see
// seal.Fingerprint) tells every device from a listing alone whether it
// holds that key. The time only keeps names unique: nothing is ordered
// by it, since a folder's devices name files by clocks that disagree.
const (
	keysFolder  = "keys/"
	maxKeyCheck = 64 << 10
)

func keyCheckName(at time.Time, device, fingerprint string) string {
	return keysFolder + "key_" + at.UTC().Format(nameTimeLayout) + "_" + device + "_" + fingerprint + ".age"
}

// keyCheckFingerprint returns the fingerprint a key check's name carries.
func keyCheckFingerprint(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, keysFolder+"key_")
	if !ok || strings.Contains(rest, "/") {
		return "", false
	}
	rest, ok = strings.CutSuffix(rest, ".age")
	i := strings.LastIndexByte(rest, '_')
	if !ok || i < 0 {
		return "", false
	}
	return rest[i+1:], true
}

func wrongKey(format string, args ...any) error {
	return &Error{Op: "sync", File: markerName, Err: fmt.Errorf("%w: "+format, append([]any{ErrWrongKey}, args...)...)}
}

// bindKeys sets the run's keys for the store of marker m, or fails with
// ErrWrongKey before anything is applied or uploaded: the store is
// encrypted and this device has no key, or a key that opens none of the
// store's key checks; or the store is plain and this device would
// encrypt.
//
// A device's current key is verified once per store and remembered. A key
// that opens no check but arrives with a previous key that does is a
// rotation: the device leaves a check for it under keys/, so that devices
// that know only the new key can verify it once the old one is dropped.
// A device that lacks a key another device added learns it from the first
// file encrypted with it (see foreignKey).
func (s *syncRun) bindKeys(ctx context.Context, m marker, own bool, l *listing) error {
	e := s.e
	e.keys = nil
	enc := m.Encryption
	switch {
	case enc == nil && own:
		// The marker this device wrote moments ago and cannot list yet.
		if e.cfg.Encryption == nil {
			return nil
		}
		enc = &markerEncryption{Scheme: encryptionScheme, ScryptLogN: passphraseWork}
	case enc == nil && e.cfg.Encryption == nil:
		return nil
	case enc == nil:
		return wrongKey("store %s is not encrypted, but Config.Encryption is set: this device would upload encrypted files that the other devices cannot read. Nothing was applied or uploaded. Leave Config.Encryption unset for this store, or move to an encrypted store: StartFresh on an empty folder with the key set, then JoinRemote on the other devices", m.Store)
	case e.cfg.Encryption == nil:
		return wrongKey("store %s is encrypted, and Config.Encryption is not set. Nothing was applied or uploaded. Set Config.Encryption to the store's passphrase or key (drivesync.Passphrase, drivesync.X25519Key)", m.Store)
	}
	k := &keyring{store: m.Store}
	var err error
	if k.write, err = e.keyIdentity(e.cfg.Encryption, m.Store, enc.ScryptLogN); err != nil {
		return &Error{Op: "sync", Err: fmt.Errorf("Config.Encryption: %w", err)}
	}
	k.read = append(k.read, k.write)
	for i, p := range e.cfg.PreviousKeys {
		id, err := e.keyIdentity(p, m.Store, enc.ScryptLogN)
		if err != nil {
			return &Error{Op: "sync", Err: fmt.Errorf("Config.PreviousKeys[%d]: %w", i, err)}
		}
		k.read = append(k.read, id)
	}
	fp := k.fingerprints()[0]
	verified, err := getMeta(ctx, s.conn, metaKeyVerified)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if !own && verified != fp {
		if err := s.verifyKey(ctx, m, enc, k); err != nil {
			return err
		}
		if err := s.setMetas(ctx, metaKeyVerified, fp); err != nil {
			return err
		}
	}
	held, err := getMeta(ctx, s.conn, metaFirstKey)
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	if k.first = held == m.Store; !k.first && seal.Opens(enc.Check, k.store, k.read) {
		if err := s.setMetas(ctx, metaFirstKey, m.Store); err != nil {
			return err
		}
		k.first = true
	}
	e.keys = k
	return nil
}

// verifyKey checks that k's current key is one of the store's: it opens
// the marker's check or a check under keys/ that names it. A current key
// that opens none, with a previous key that opens one, is a rotation: it
// leaves a check under keys/.
func (s *syncRun) verifyKey(ctx context.Context, m marker, enc *markerEncryption, k *keyring) error {
	e := s.e
	if seal.Opens(enc.Check, k.store, k.read[:1]) {
		return nil
	}
	files, err := e.cfg.Remote.List(ctx, time.Time{})
	if err != nil {
		return remoteErr("list", "", err)
	}
	fps := k.fingerprints()
	opens := make([]bool, len(k.read))
	for i, id := range k.read[1:] {
		opens[i+1] = seal.Opens(enc.Check, k.store, []age.Identity{id})
	}
	for _, f := range files {
		fp, ok := keyCheckFingerprint(f.Name)
		i := slices.Index(fps, fp)
		if !ok || i < 0 || opens[i] {
			continue
		}
		if opens[i], err = s.keyCheckOpens(ctx, f.Name, k.store, k.read[i]); err != nil {
			return err
		}
		if opens[0] {
			return nil
		}
	}
	if slices.Contains(opens[1:], true) {
		// A rotation: a previous key is the store's, so the store is
		// this user's, and the current key is new to it.
		return s.addKeyCheck(ctx, k)
	}
	return wrongKey("%s in Config.Encryption does not open store %s: it is not the key the store was encrypted with. Nothing was applied or uploaded. Ask for the store's passphrase or key again; after a key change on another device, set the new key in Config.Encryption (and the old one in Config.PreviousKeys until a snapshot has replaced the old files)", e.cfg.Encryption.describe(), m.Store)
}

// foreignKey looks, after a file turned out to be encrypted to none of
// this device's keys, for a key of the store this device lacks: another
// device changed the key. It returns the ErrWrongKey that stops the sync
// if there is one, nil if the file is only broken (its header altered).
func (s *syncRun) foreignKey(ctx context.Context, file string) error {
	e := s.e
	if !e.keys.first {
		return &Error{Op: "sync", File: file, Err: fmt.Errorf("%w: this file is encrypted with a key this device does not have, and this device never had the key the store was created with (its marker's key check): it was given only a newer key while files of the first one remain. Nothing was applied or uploaded. Add the store's first key to Config.PreviousKeys; if every file of that key was compacted and this one is damaged or not the store's, delete it from the remote", ErrWrongKey)}
	}
	if s.keyFiles == nil {
		// Listed once per run, however many files need it.
		files, err := e.cfg.Remote.List(ctx, time.Time{})
		if err != nil {
			return remoteErr("list", "", err)
		}
		s.keyFiles = []RemoteFile{}
		for _, f := range files {
			if _, ok := keyCheckFingerprint(f.Name); ok {
				s.keyFiles = append(s.keyFiles, f)
			}
		}
	}
	files := s.keyFiles
	fps := e.keys.fingerprints()
	for _, f := range files {
		if fp, ok := keyCheckFingerprint(f.Name); ok && !slices.Contains(fps, fp) {
			return &Error{Op: "sync", File: file, Err: fmt.Errorf("%w: this file is encrypted with a key this device does not have, and the store has such a key (%s): another device changed the store's key, or this device dropped an old key before the files encrypted with it were compacted. Nothing was applied or uploaded. Set the new key in Config.Encryption, and keep every older key the store's files still use in Config.PreviousKeys", ErrWrongKey, f.Name)}
		}
	}
	return nil
}

// keyCheckOpens reports whether id opens the key check name; a check
// that is gone or unreadable does not.
func (s *syncRun) keyCheckOpens(ctx context.Context, name, store string, id age.Identity) (bool, error) {
	rc, err := s.e.cfg.Remote.Open(ctx, name)
	switch {
	case errors.Is(err, fs.ErrNotExist) || unreadableFile(ctx, err):
		return false, nil
	case err != nil:
		return false, remoteErr("download", name, err)
	}
	b, err := io.ReadAll(io.LimitReader(rc, maxKeyCheck))
	rc.Close()
	if err != nil {
		return false, remoteErr("download", name, err)
	}
	return seal.Opens(strings.TrimSpace(string(b)), store, []age.Identity{id}), nil
}

// fingerprints returns the fingerprints of k's keys, the current first.
func (k *keyring) fingerprints() []string {
	var fps []string
	for _, id := range k.read {
		fps = append(fps, seal.Fingerprint(k.store, id.(*age.X25519Identity).Recipient()))
	}
	return fps
}

// addKeyCheck leaves a check for the current key under keys/.
func (s *syncRun) addKeyCheck(ctx context.Context, k *keyring) error {
	e := s.e
	check, err := seal.Check(k.store, k.write.Recipient())
	if err != nil {
		return &Error{Op: "sync", Err: err}
	}
	now, err := e.cfg.Remote.Now(ctx)
	if err != nil {
		return remoteErr("add key", "", err)
	}
	name := keyCheckName(now, e.deviceID, k.fingerprints()[0])
	if err := e.cfg.Remote.Create(ctx, name, strings.NewReader(check+"\n")); err != nil && !errors.Is(err, fs.ErrExist) {
		return remoteErr("add key", name, err)
	}
	e.log.Info("drivesync: added a key to the store (a key rotation)", "store", k.store, "check", name)
	return nil
}

// listedOver reports whether a listed file is larger than a file that
// holds at most limit bytes can be: the limits bound what files hold, and
// an encrypted file is larger than what it holds. Readers bound what they
// read of it by the limit itself.
func (e *Engine) listedOver(d *downloaded, limit int64) bool {
	if e.keys != nil {
		return d.size > seal.MaxSize(limit, d.name)
	}
	return d.size > limit
}

// openFile opens a store file, decrypting it if the store is encrypted.
// Errors of decryption come as read errors that match seal.ErrSealed.
// counted, if not nil, counts the bytes as the remote holds them, sealed
// or not (a listing's sizes measure those), as the current step's (see
// Progress).
func (e *Engine) openFile(ctx context.Context, name string, counted *progressReader) (io.ReadCloser, error) {
	rc, err := e.cfg.Remote.Open(ctx, name)
	if err != nil || (counted == nil && e.cfg.Encryption == nil) {
		return rc, err
	}
	var r io.Reader = rc
	if counted != nil {
		counted.r, r = rc, counted
	}
	if e.cfg.Encryption != nil {
		if e.keys == nil {
			rc.Close()
			return nil, errors.New("drivesync: internal error: a file read before the store's keys were bound")
		}
		r = seal.Decrypt(r, name, e.keys.read)
	}
	return struct {
		io.Reader
		io.Closer
	}{r, rc}, nil
}

// createFile creates a store file, encrypted if the store is.
// The content stays seekable, so that a Remote can send it again when a
// try fails (DriveRemote does): an encrypted file is sealed into a
// temporary file first. progress says that its bytes are the current
// step's (see Progress).
func (e *Engine) createFile(ctx context.Context, name string, content io.ReadSeeker, progress bool) error {
	counted := &uploadReader{e: e, progress: progress}
	if e.cfg.Encryption != nil {
		if e.keys == nil {
			return errors.New("drivesync: internal error: a file written before the store's keys were bound")
		}
		sealed, err := seal.Encrypt(content, name, e.keys.write.Recipient())
		if err != nil {
			return err
		}
		f, err := os.CreateTemp(e.cfg.TempDir, "drivesync-sealed-*")
		if err != nil {
			return &Error{Op: "upload", File: name, Err: err}
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if counted.sealed, err = io.Copy(f, sealed); err != nil {
			return &Error{Op: "upload", File: name, Err: fmt.Errorf("seal: %w", err)}
		}
		if counted.plain, err = content.Seek(0, io.SeekCurrent); err != nil {
			return &Error{Op: "upload", File: name, Err: err}
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return &Error{Op: "upload", File: name, Err: err}
		}
		content = f
	}
	counted.r = content
	err := e.cfg.Remote.Create(ctx, name, counted)
	if err == nil {
		e.uploaded += counted.n
	}
	return err
}

// uploadReader counts the bytes a Remote reads of a file it uploads, for
// Status and Progress; a Remote that reads it again from the start (a
// retry) counts from zero again.
type uploadReader struct {
	r        io.ReadSeeker
	e        *Engine
	progress bool
	n        int64
	// A sealed file's bytes count for Progress as the share they are of
	// the plain file's, whose size the step's total holds: plain of
	// sealed bytes (0: not sealed).
	plain, sealed int64
}

// shown is what n bytes read count for in Progress.
func (u *uploadReader) shown(n int64) int64 {
	switch {
	case u.sealed == 0:
		return n
	case n >= u.sealed:
		return u.plain
	}
	return int64(float64(n) / float64(u.sealed) * float64(u.plain))
}

func (u *uploadReader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	before := u.n
	u.n += int64(n)
	if d := u.shown(u.n) - u.shown(before); u.progress && d > 0 {
		u.e.progressBytes(d)
	}
	return n, err
}

func (u *uploadReader) Seek(offset int64, whence int) (int64, error) {
	pos, err := u.r.Seek(offset, whence)
	if err == nil && pos < u.n {
		if u.progress {
			u.e.meter.p.Bytes -= u.shown(u.n) - u.shown(pos)
		}
		u.n = pos
	}
	return pos, err
}
