package drivesync

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/drivesync/drivesync/internal/drivefake"
	"github.com/drivesync/drivesync/internal/seal"
)

func init() {
	// A second of scrypt per engine is the product's; tests derive keys
	// for many engines. TestPassphraseWork runs the product's factor.
	passphraseWork = 8
}

// secretDevice is a device of an encrypted store.
func secretDevice(t testing.TB, name string, remote Remote, key Key, previous ...Key) *device {
	t.Helper()
	d := newDevice(t, name, remote)
	d.cfg.Encryption, d.cfg.PreviousKeys = key, previous
	d.open()
	return d
}

// rekey reopens d with other keys.
func (d *device) rekey(key Key, previous ...Key) {
	d.t.Helper()
	d.cfg.Encryption, d.cfg.PreviousKeys = key, previous
	d.open()
}

// remoteBytes returns every file on the remote by name.
func remoteBytes(t testing.TB, r Remote) map[string][]byte {
	t.Helper()
	files, err := r.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range files {
		rc, err := r.Open(context.Background(), f.Name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[f.Name] = b
	}
	return out
}

// assertSealed fails unless every file on the remote but the marker and
// the key checks is an age file that shows none of secrets, and those show
// none either.
func assertSealed(t testing.TB, r Remote, secrets ...string) int {
	t.Helper()
	files := remoteBytes(t, r)
	sealed := 0
	for name, b := range files {
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q in plain", name, s)
			}
		}
		if name == markerName || strings.HasPrefix(name, keysFolder) {
			continue
		}
		if !bytes.HasPrefix(b, []byte("age-encryption.org/v1\n")) {
			t.Errorf("%s is not an age file: %q", name, b[:min(len(b), 40)])
		}
		if _, err := gzip.NewReader(bytes.NewReader(b)); err == nil {
			t.Errorf("%s reads as gzip", name)
		}
		sealed++
	}
	return sealed
}

// TestEncryptedStore: two devices of an encrypted store on a folder sync
// notes, a deletion, a snapshot, an outbox file recovered after a failed
// commit and a join's merge file; every byte on the remote is encrypted.
func TestEncryptedStore(t *testing.T) {
	dir := t.TempDir()
	folder, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	key := Passphrase("correct horse battery staple")
	a := secretDevice(t, "dev-a", folder, key)
	b := secretDevice(t, "dev-b", folder, key)
	secrets := []string{"PLAINTEXT-TITLE", "PLAINTEXT-BODY", "secret-record-id", "PLAINTEXT-LATER", "PLAINTEXT-JOIN"}
	a.exec(`INSERT INTO notes (id, content, title) VALUES ('secret-record-id', jsonb('{"title":"PLAINTEXT-TITLE","body":"PLAINTEXT-BODY"}'), 'PLAINTEXT-TITLE')`)
	a.put("n2", `{"body":"gone soon"}`)
	syncAll(t, a, b)
	b.exec(`DELETE FROM notes WHERE id = 'n2'`)
	b.put("n3", `{"body":"PLAINTEXT-LATER"}`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if a.get("secret-record-id") == "" || a.get("n2") != "" || a.get("n3") == "" {
		t.Fatalf("a holds %q %q %q", a.get("secret-record-id"), a.get("n2"), a.get("n3"))
	}

	// An upload whose commit failed is recovered from the outbox: the
	// recovery reads the encrypted file back and compares it.
	a.put("n4", `{"body":"recovered"}`)
	hooks(a.eng).step = func(point string) error {
		if point == "uploaded" {
			return errors.New("crash after the upload")
		}
		return nil
	}
	if _, err := a.eng.Sync(context.Background()); err == nil {
		t.Fatal("the sync did not fail at the hook")
	}
	hooks(a.eng).step = nil
	if r := a.sync(); r.Recovered == "" {
		t.Fatalf("nothing recovered: %+v", r)
	}

	a.snapshot()
	// A third database with data of its own joins: its merge file is
	// encrypted too.
	c := secretDevice(t, "dev-c", NewMemoryRemote(), key)
	c.put("n5", `{"body":"PLAINTEXT-JOIN"}`)
	c.sync()
	c.cfg.Remote = folder
	c.open()
	if _, err := c.eng.Sync(context.Background()); !errors.Is(err, ErrRemoteChanged) {
		t.Fatalf("c on a's folder: got %v, want ErrRemoteChanged", err)
	}
	if err := c.eng.JoinRemote(context.Background()); err != nil {
		t.Fatal(err)
	}
	syncAll(t, c, a, b)
	assertConverged(t, a, b, c)
	if b.get("n5") == "" || c.get("secret-record-id") == "" {
		t.Fatal("the joined database's note or the store's did not cross")
	}
	kinds := map[fileKind]int{}
	for name := range remoteBytes(t, folder) {
		if k, _, _, ok := parseFileName(name); ok {
			kinds[k]++
		}
	}
	if kinds[kindPatch] == 0 || kinds[kindSnapshot] == 0 || kinds[kindMerge] == 0 {
		t.Fatalf("the test meant to see every kind of file: %v", kinds)
	}
	if n := assertSealed(t, folder, secrets...); n < 5 {
		t.Fatalf("only %d encrypted files", n)
	}
	// The marker says the store is encrypted, and holds no key.
	var m marker
	if err := json.Unmarshal(remoteBytes(t, folder)[markerName], &m); err != nil || m.Encryption == nil || m.Format != 2 {
		t.Fatalf("marker %+v, %v", m, err)
	}
	// A new device with the passphrase reads it all from the start.
	d := secretDevice(t, "dev-d", folder, key)
	d.sync()
	assertConverged(t, a, d)
}

// TestWrongKey: a wrong key, no key, or a key on a plain store fails Sync
// with ErrWrongKey; nothing is applied, uploaded or lost, and the right key
// then syncs.
func TestWrongKey(t *testing.T) {
	mem := NewMemoryRemote()
	a := secretDevice(t, "dev-a", mem, Passphrase("right"))
	a.put("n1", `{"v":"from a"}`)
	a.sync()
	id, _ := age.GenerateX25519Identity()
	for _, c := range []struct {
		what string
		key  Key
		want string
	}{
		{"a wrong passphrase", Passphrase("wrong"), "does not open store"},
		{"an X25519 key", X25519Key(id), "does not open store"},
		{"no key", nil, "Config.Encryption is not set"},
	} {
		b := secretDevice(t, "dev-b", mem, c.key)
		b.put("b1", `{"v":"from b"}`)
		before := remoteBytes(t, mem)
		_, err := b.eng.Sync(context.Background())
		if !errors.Is(err, ErrWrongKey) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: got %v, want ErrWrongKey saying %q", c.what, err, c.want)
		}
		if after := remoteBytes(t, mem); len(after) != len(before) {
			t.Fatalf("%s: the remote went from %d to %d files", c.what, len(before), len(after))
		}
		if b.get("n1") != "" || b.pendingCount() != 1 {
			t.Fatalf("%s: b applied a's note (%q) or lost its own (%d pending)", c.what, b.get("n1"), b.pendingCount())
		}
		b.rekey(Passphrase("right"))
		b.sync()
		a.sync()
		assertConverged(t, a, b)
		if a.get("b1") == "" {
			t.Fatalf("%s: b's note did not reach a once b had the key", c.what)
		}
		a.exec(`DELETE FROM notes WHERE id = 'b1'`)
		a.sync()
	}
	// A key on a plain store.
	plain := NewMemoryRemote()
	p := newDevice(t, "dev-p", plain)
	p.put("p1", `{"v":1}`)
	p.sync()
	q := secretDevice(t, "dev-q", plain, Passphrase("right"))
	q.put("q1", `{"v":1}`)
	if _, err := q.eng.Sync(context.Background()); !errors.Is(err, ErrWrongKey) || !strings.Contains(err.Error(), "not encrypted") {
		t.Fatalf("a key on a plain store: got %v", err)
	}
	if q.get("p1") != "" || q.pendingCount() != 1 {
		t.Fatal("q applied the plain store's note or lost its own")
	}
}

// TestTamperedFile: a file changed by one byte anywhere, truncated, or
// copied over another name is rejected whole and reported, the sync goes
// on with the others, and the file is read again once it is whole.
func TestTamperedFile(t *testing.T) {
	mem, clk := clockedRemote()
	key := Passphrase("pw")
	a := secretDevice(t, "dev-a", mem, key)
	a.put("n1", `{"v":1}`)
	first := a.sync().Uploaded
	clk.add(time.Minute)
	a.put("n2", fmt.Sprintf(`{"v":%q}`, strings.Repeat("long ", 30000))) // a payload of several chunks
	second := a.sync().Uploaded
	orig := remoteBytes(t, mem)[second]
	for _, c := range []struct {
		what string
		edit func([]byte) []byte
	}{
		{"the header's recipient stanza", func(b []byte) []byte { b[40] ^= 1; return b }},
		{"the header's MAC", func(b []byte) []byte { i := bytes.Index(b, []byte("\n---")) + 6; b[i] ^= 1; return b }},
		{"the first chunk", func(b []byte) []byte { b[len(b)/3] ^= 1; return b }},
		{"the last byte", func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }},
		{"a truncation", func(b []byte) []byte { return b[:len(b)-100] }},
	} {
		b := secretDevice(t, "dev-b", mem, key)
		bad := c.edit(bytes.Clone(orig))
		mem.Delete(context.Background(), second)
		if err := mem.Create(context.Background(), second, bytes.NewReader(bad)); err != nil {
			t.Fatal(err)
		}
		r := b.sync()
		if len(r.Rejected) != 1 || r.Rejected[0].Name != second || !errors.Is(r.Rejected[0].Err, ErrCorruptFile) || !errors.Is(r.Rejected[0].Err, seal.ErrSealed) {
			t.Fatalf("%s: rejected %v", c.what, r.Rejected)
		}
		if b.get("n1") == "" || b.get("n2") != "" {
			t.Fatalf("%s: b holds n1 %q and n2 of %d bytes", c.what, b.get("n1"), len(b.get("n2")))
		}
		// Whole again, it is read when a rejected file is read again.
		mem.Delete(context.Background(), second)
		mem.Create(context.Background(), second, bytes.NewReader(orig))
		clk.add(rejectRetryMax)
		if r := b.sync(); len(r.Rejected) != 0 || b.get("n2") != a.get("n2") {
			t.Fatalf("%s: the whole file was not applied: %v", c.what, r.Rejected)
		}
	}
	// The first file's bytes under a new name (a rename, or a copy over
	// another file) are refused: each file names itself inside.
	clk.add(time.Minute)
	at, _ := mem.Now(context.Background())
	copied := patchFileName(at, "dev-a")
	mem.Create(context.Background(), copied, bytes.NewReader(remoteBytes(t, mem)[first]))
	b := secretDevice(t, "dev-c", mem, key)
	r := b.sync()
	if len(r.Rejected) != 1 || r.Rejected[0].Name != copied || !strings.Contains(r.Rejected[0].Err.Error(), "renamed or copied") {
		t.Fatalf("a copied file: rejected %v", r.Rejected)
	}
	assertConverged(t, a, b)
}

// TestKeyRotation: a device changes the key (new key, old one kept as
// previous); devices that know only the old key stop with ErrWrongKey;
// devices given both read old and new files; a snapshot and compaction
// leave only files of the new key, and a device with only the new key
// then starts from the store.
func TestKeyRotation(t *testing.T) {
	mem, clk := clockedRemote()
	oldKey, newKey := Passphrase("old"), Passphrase("new")
	a := secretDevice(t, "dev-a", mem, oldKey)
	b := secretDevice(t, "dev-b", mem, oldKey)
	withRetention(a, time.Minute)
	a.put("n1", `{"v":"before"}`)
	syncAll(t, a, b)

	// Without the old key, the new one cannot join the store: it could
	// be a mistyped passphrase.
	a.rekey(newKey)
	if _, err := a.eng.Sync(context.Background()); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("a new key alone: got %v, want ErrWrongKey", err)
	}
	a.rekey(newKey, oldKey)
	withRetention(a, time.Minute)
	a.put("n2", `{"v":"after"}`)
	a.sync()
	checks := 0
	for name := range remoteBytes(t, mem) {
		if strings.HasPrefix(name, keysFolder) {
			checks++
		}
	}
	if checks != 1 {
		t.Fatalf("%d key checks under keys/, want 1", checks)
	}
	b.put("n3", `{"v":"b with the old key"}`)
	if _, err := b.eng.Sync(context.Background()); !errors.Is(err, ErrWrongKey) || !strings.Contains(err.Error(), "changed the store's key") {
		t.Fatalf("b with the old key after the change: got %v", err)
	}
	if b.get("n2") != "" || b.pendingCount() != 1 {
		t.Fatal("b applied or lost something")
	}
	b.rekey(newKey, oldKey)
	syncAll(t, b, a)
	assertConverged(t, a, b)

	// A snapshot re-encrypts everything; compaction removes the old files.
	clk.add(40 * time.Minute) // past the overlap: the files are the snapshot's to compact
	a.snapshot()
	b.sync()
	clk.add(time.Hour)
	if r := a.snapshot(); r.Deleted == 0 {
		t.Fatalf("nothing compacted: %+v", r)
	}
	newID, err := seal.PassphraseIdentity("new", a.store(), passphraseWork)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range remoteBytes(t, mem) {
		if _, _, _, ok := parseFileName(name); !ok {
			continue
		}
		if _, err := io.ReadAll(seal.Decrypt(bytes.NewReader(content), name, []age.Identity{newID})); err != nil {
			t.Errorf("%s does not open with the new key alone: %v", name, err)
		}
	}
	c := secretDevice(t, "dev-c", mem, newKey)
	c.sync()
	assertConverged(t, a, b, c)
	if c.get("n1") == "" || c.get("n3") == "" {
		t.Fatal("c lacks notes written before the change")
	}
	// The old key alone is now refused at once.
	d := secretDevice(t, "dev-d", mem, oldKey)
	if _, err := d.eng.Sync(context.Background()); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("the old key after the change: got %v", err)
	}
}

// TestX25519Key: a store encrypted to an age identity; its files decrypt
// with the identity and the age library alone (what the age tool does).
func TestX25519Key(t *testing.T) {
	dir := t.TempDir()
	folder, err := NewFolderRemote(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := age.GenerateX25519Identity()
	a := secretDevice(t, "dev-a", folder, X25519Key(id))
	b := secretDevice(t, "dev-b", folder, X25519Key(id))
	a.put("n1", `{"body":"SECRET-X25519"}`)
	syncAll(t, a, b)
	assertConverged(t, a, b)
	assertSealed(t, folder, "SECRET-X25519")
	found := false
	filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() || !strings.HasPrefix(de.Name(), "patch_") {
			return err
		}
		f, _ := os.Open(p)
		defer f.Close()
		r, err := age.Decrypt(f, id)
		if err != nil {
			t.Fatalf("age cannot decrypt %s: %v", p, err)
		}
		plain, _ := io.ReadAll(r)
		_, gz, _ := bytes.Cut(plain, []byte("\n"))
		zr, err := gzip.NewReader(bytes.NewReader(gz))
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(zr)
		found = found || bytes.Contains(text, []byte("SECRET-X25519"))
		return nil
	})
	if !found {
		t.Fatal("no patch file decrypted to the note")
	}
}

// TestPassphraseWork: a store created with the default work factor
// records it, and another device derives the same key from it.
func TestPassphraseWork(t *testing.T) {
	defer func(w int) { passphraseWork = w }(passphraseWork)
	passphraseWork = 18
	mem := NewMemoryRemote()
	a := secretDevice(t, "dev-a", mem, Passphrase("pw"))
	a.put("n1", `{"v":1}`)
	a.sync()
	passphraseWork = 8 // what this device would create; the store's governs
	b := secretDevice(t, "dev-b", mem, Passphrase("pw"))
	b.sync()
	assertConverged(t, a, b)
	var m marker
	json.Unmarshal(remoteBytes(t, mem)[markerName], &m)
	if m.Encryption.ScryptLogN != 18 {
		t.Fatalf("marker records work factor %d", m.Encryption.ScryptLogN)
	}
}

// checkHidingRemote hides the key checks from its listings, as a remote whose
// listings lag may for a while.
type checkHidingRemote struct {
	Remote
	hide bool
}

func (h *checkHidingRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	files, err := h.Remote.List(ctx, since)
	if !h.hide {
		return files, err
	}
	var out []RemoteFile
	for _, f := range files {
		if !strings.HasPrefix(f.Name, keysFolder) {
			out = append(out, f)
		}
	}
	return out, err
}

// TestRotationSeenLate: a device that lists another's new-key files before
// that key's check rejects them, stops with ErrWrongKey once it lists the
// check, and reads them at once when given the new key, without waiting
// for the rejected files' retry.
func TestRotationSeenLate(t *testing.T) {
	mem := NewMemoryRemote()
	oldKey, newKey := Passphrase("old"), Passphrase("new")
	a := secretDevice(t, "dev-a", mem, oldKey)
	view := &checkHidingRemote{Remote: mem, hide: true}
	b := secretDevice(t, "dev-b", view, oldKey)
	syncAll(t, a, b)
	a.rekey(newKey, oldKey)
	a.put("n1", `{"v":"new key"}`)
	up := a.sync().Uploaded
	r := b.sync()
	if len(r.Rejected) != 1 || r.Rejected[0].Name != up || !errors.Is(r.Rejected[0].Err, ErrCorruptFile) || b.get("n1") != "" {
		t.Fatalf("b with the old key, the check unlisted: rejected %v, n1 %q", r.Rejected, b.get("n1"))
	}
	view.hide = false
	if _, err := b.eng.Sync(context.Background()); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("b once the check is listed: got %v", err)
	}
	b.rekey(newKey, oldKey)
	if r := b.sync(); len(r.Rejected) != 0 || b.get("n1") == "" {
		t.Fatalf("b with the new key: rejected %v, n1 %q", r.Rejected, b.get("n1"))
	}
	assertConverged(t, a, b)
}

// TestEncryptedOverDrive: an encrypted store on the fake Drive, with
// rate limits and dropped connections; no byte Drive stores shows the
// notes.
func TestEncryptedOverDrive(t *testing.T) {
	srv := drivefake.New(t)
	key := Passphrase("drive passphrase")
	a, b := driveDevice(t, srv, "dev-a"), driveDevice(t, srv, "dev-b")
	a.rekey(key)
	b.rekey(key)
	a.put("n1", `{"body":"DRIVE-SECRET-1"}`)
	b.put("n2", `{"body":"DRIVE-SECRET-2"}`)
	srv.Fail(
		drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusServiceUnavailable, Times: 2},
		drivefake.Fault{Method: "GET", PathPrefix: "/drive/v3/files/", ResetMidBody: true, Times: 2},
	)
	for range 3 {
		for _, d := range []*device{a, b} {
			d.eng.Sync(context.Background()) // a fault may fail a sync; the next one retries
		}
	}
	a.snapshot()
	syncAll(t, a, b)
	assertConverged(t, a, b)
	if a.get("n2") == "" || b.get("n1") == "" {
		t.Fatal("the notes did not cross")
	}
	if n := assertSealed(t, a.remote, "DRIVE-SECRET-1", "DRIVE-SECRET-2"); n < 3 {
		t.Fatalf("only %d encrypted files on Drive", n)
	}
}

// Key check names carry the fingerprint last, after the device id, which
// may hold underscores itself.
func TestKeyCheckName(t *testing.T) {
	at := time.Date(2026, 11, 25, 6, 0, 0, 123e6, time.UTC)
	for range 50 {
		id, _ := age.GenerateX25519Identity()
		fp := seal.Fingerprint("store_x", id.Recipient())
		name := keyCheckName(at, "dev_with_underscores", fp)
		gotFP, ok := keyCheckFingerprint(name)
		if !ok || gotFP != fp || CheckRemoteName(name) != nil {
			t.Fatalf("%s parsed as %q %v", name, gotFP, ok)
		}
	}
}

// TestEncryptedFilesAtTheLimit: patch files planned right up to the
// store's MaxFileSize grow past it when encrypted; the limit bounds what
// they hold, so every device still reads them.
func TestEncryptedFilesAtTheLimit(t *testing.T) {
	mem := NewMemoryRemote()
	limits := Limits{MaxFileSize: 4096, MaxExpandedSize: 1 << 20, MaxRecordSize: 2048}
	a := secretDevice(t, "dev-a", mem, Passphrase("pw"))
	a.cfg.Limits = limits
	a.open()
	b := secretDevice(t, "dev-b", mem, Passphrase("pw"))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 60 {
		// Random letters barely compress: the files fill up.
		v := make([]byte, 300)
		for j := range v {
			v[j] = 'a' + byte(rng.IntN(26))
		}
		a.put(fmt.Sprint("n", i), fmt.Sprintf(`{"v":%q}`, v))
	}
	a.sync()
	full := 0
	files, _ := mem.List(context.Background(), time.Time{})
	for _, f := range files {
		if _, _, _, ok := parseFileName(f.Name); ok && f.Size > limits.MaxFileSize-400 {
			full++
		}
	}
	if full == 0 {
		t.Fatal("no file came near the limit: the test does not test it")
	}
	if r := b.sync(); len(r.Rejected) != 0 {
		t.Fatalf("rejected %v", r.Rejected)
	}
	assertConverged(t, a, b)
}

// recordsOnly is a Server that keeps no files.
type recordsOnly struct{ Server }

// TestEncryptionNeedsFileServer checks that Open refuses a key with a
// Server that can only merge records, saying why.
func TestEncryptionNeedsFileServer(t *testing.T) {
	d := newDevice(t, "a", NewMemoryRemote())
	_, err := Open(context.Background(), d.db, Config{Server: recordsOnly{}, Encryption: Passphrase("p"), Tables: []Table{{Name: "notes"}}})
	if err == nil || !strings.Contains(err.Error(), "keeps files") {
		t.Fatalf("Open with a key and a records-only Server: got %v, want an error saying the server must keep files", err)
	}
}
