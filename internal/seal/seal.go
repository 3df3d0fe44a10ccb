// Package seal encrypts and authenticates the files a store keeps on its
// remote, as age files (age-encryption.org/v1) to X25519 recipients.
//
// The plaintext of a sealed file starts with a line that names the file,
// so that a file renamed or copied over another's name on the remote is
// refused rather than read as the file its new name claims:
//
//	drivesync-sealed <name>\n<the file's bytes>
//
// Readers decrypt lazily, on the first Read, so that every failure to
// decrypt is a read error of the stream; such errors match ErrSealed,
// while an error of the underlying stream (the network) is passed on as
// it is, so that a caller can tell a broken file from a failing remote.
package seal

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"filippo.io/age"
	"golang.org/x/crypto/scrypt"
)

// ErrSealed says that a file cannot be opened: it is not an age file,
// was tampered with or truncated, names another file, or is encrypted to
// none of the keys given.
var ErrSealed = errors.New("the file cannot be decrypted")

// ErrNoKey (which matches ErrSealed too) says that a file's header is
// whole but encrypted to none of the keys given: another key, or a
// header altered where it names its recipient.
var ErrNoKey = fmt.Errorf("%w: none of this device's keys opens it", ErrSealed)

const prefix = "drivesync-sealed "

// Encrypt returns a reader of src sealed under name for recipient.
func Encrypt(src io.Reader, name string, recipient age.Recipient) (io.Reader, error) {
	return age.EncryptReader(io.MultiReader(strings.NewReader(prefix+name+"\n"), src), recipient)
}

// MaxSize bounds the size of name sealed from size bytes: the plaintext's
// size, the line naming the file, age's header (a few hundred bytes for
// one X25519 recipient: 1 KiB is ample), its nonce, and a 16-byte tag for
// every 64 KiB chunk.
func MaxSize(size int64, name string) int64 {
	return size + int64(len(prefix)+len(name)+1) + 1024 + 16 + 16*(size/(64<<10)+1)
}

// Decrypt returns a reader of the plaintext of the file name, sealed in
// src for one of ids. See the package comment for its errors.
func Decrypt(src io.Reader, name string, ids []age.Identity) io.Reader {
	return &reader{src: &tracked{r: src}, name: name, ids: ids}
}

type reader struct {
	src  *tracked
	name string
	ids  []age.Identity
	r    io.Reader
	err  error
}

func (r *reader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.r == nil {
		if r.err = r.open(); r.err != nil {
			return 0, r.err
		}
	}
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = r.fail(err)
		r.err = err
	}
	return n, err
}

func (r *reader) open() error {
	if len(r.ids) == 0 {
		return ErrNoKey
	}
	pr, err := age.Decrypt(r.src, r.ids...)
	if err != nil {
		if errors.As(err, new(*age.NoIdentityMatchError)) && r.src.err == nil {
			return fmt.Errorf("%w (it was encrypted with another key, or its header was altered)", ErrNoKey)
		}
		return r.fail(err)
	}
	want := prefix + r.name + "\n"
	head := make([]byte, len(want))
	if _, err := io.ReadFull(pr, head); err != nil {
		return r.fail(err)
	}
	if string(head) != want {
		got, _, _ := strings.Cut(strings.TrimPrefix(string(head), prefix), "\n")
		return fmt.Errorf("%w: it holds the file %q, not %q: it was renamed or copied over another file", ErrSealed, got, r.name)
	}
	r.r = pr
	return nil
}

// fail returns the underlying stream's error if it failed, or err marked
// as a broken file.
func (r *reader) fail(err error) error {
	if r.src.err != nil {
		return r.src.err
	}
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%w: it is truncated", ErrSealed)
	}
	return fmt.Errorf("%w: %v", ErrSealed, err)
}

// tracked remembers the error of the stream it reads, other than EOF.
type tracked struct {
	r   io.Reader
	err error
}

func (t *tracked) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// PassphraseIdentity derives the X25519 identity of a passphrase for one
// store: scrypt (N=2^logN, r=8, p=1, the parameters age uses for its
// passphrase files) of the passphrase, salted with the store's id, is the
// identity's secret scalar. Every device of the store derives the same
// identity from the same passphrase; another store's differs.
func PassphraseIdentity(passphrase, store string, logN int) (*age.X25519Identity, error) {
	if logN < 1 || logN > 30 {
		return nil, fmt.Errorf("scrypt work factor %d out of range", logN)
	}
	scalar, err := scrypt.Key([]byte(passphrase), []byte("drivesync passphrase v1\x00"+store), 1<<logN, 8, 1, 32)
	if err != nil {
		return nil, err
	}
	return age.ParseX25519Identity(strings.ToUpper(bech32("age-secret-key-", scalar)))
}

// Check seals the key check of store for recipient: a small file that
// only its key opens. It is not secret.
func Check(store string, recipient age.Recipient) (string, error) {
	var b bytes.Buffer
	w, err := age.Encrypt(&b, recipient)
	if err != nil {
		return "", err
	}
	io.WriteString(w, checkText(store))
	if err := w.Close(); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b.Bytes()), nil
}

// Opens reports whether one of ids opens check, the key check of store.
// A malformed check opens with no key.
func Opens(check, store string, ids []age.Identity) bool {
	b, err := base64.StdEncoding.DecodeString(check)
	if err != nil || len(ids) == 0 {
		return false
	}
	r, err := age.Decrypt(bytes.NewReader(b), ids...)
	if err != nil {
		return false
	}
	got, err := io.ReadAll(io.LimitReader(r, 1024))
	return err == nil && string(got) == checkText(store)
}

func checkText(store string) string { return "drivesync key check\x00" + store }

// Fingerprint names recipient's key for store without revealing it: 32
// hex digits, which file names can carry.
func Fingerprint(store string, recipient fmt.Stringer) string {
	sum := sha256.Sum256([]byte("drivesync key fingerprint\x00" + store + "\x00" + recipient.String()))
	return hex.EncodeToString(sum[:16])
}
