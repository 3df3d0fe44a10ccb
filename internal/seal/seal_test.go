package seal

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"filippo.io/age"
)

func seal(t *testing.T, plain, name string, r age.Recipient) []byte {
	t.Helper()
	er, err := Encrypt(strings.NewReader(plain), name, r)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(er)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	other, _ := age.GenerateX25519Identity()
	plain := strings.Repeat("secret content ", 10000) // several 64 KiB chunks
	b := seal(t, plain, "2026/11/25/patch_x.json.gz", id.Recipient())
	if bytes.Contains(b, []byte("secret")) || bytes.Contains(b, []byte("patch_x")) {
		t.Fatal("the sealed file holds plaintext")
	}
	got, err := io.ReadAll(Decrypt(bytes.NewReader(b), "2026/11/25/patch_x.json.gz", []age.Identity{other, id}))
	if err != nil || string(got) != plain {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	for _, c := range []struct {
		what string
		name string
		ids  []age.Identity
	}{
		{"another name", "2026/11/25/patch_y.json.gz", []age.Identity{id}},
		{"another key", "2026/11/25/patch_x.json.gz", []age.Identity{other}},
		{"no key", "2026/11/25/patch_x.json.gz", nil},
	} {
		_, err := io.ReadAll(Decrypt(bytes.NewReader(b), c.name, c.ids))
		if !errors.Is(err, ErrSealed) {
			t.Errorf("%s: got %v, want ErrSealed", c.what, err)
		}
	}
}

// Every single-byte change and every truncation is refused, and no byte
// of an altered chunk is returned before the error.
func TestTampering(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	plain := strings.Repeat("x", 70<<10) // two chunks
	b := seal(t, plain, "f", id.Recipient())
	for i := range b {
		// The header is text; most of its bytes, then a sample of the payload.
		if i > 400 && i%97 != 0 && i < len(b)-20 {
			continue
		}
		bad := bytes.Clone(b)
		bad[i] ^= 0x01
		got, err := io.ReadAll(Decrypt(bytes.NewReader(bad), "f", []age.Identity{id}))
		if !errors.Is(err, ErrSealed) {
			t.Fatalf("byte %d flipped: got %d bytes, %v", i, len(got), err)
		}
		if !strings.HasPrefix(plain, string(got)) {
			t.Fatalf("byte %d flipped: altered bytes were returned before the error", i)
		}
	}
	for n := range len(b) {
		if n > 400 && n%211 != 0 {
			continue
		}
		if _, err := io.ReadAll(Decrypt(bytes.NewReader(b[:n]), "f", []age.Identity{id})); !errors.Is(err, ErrSealed) {
			t.Fatalf("truncated to %d bytes: got %v", n, err)
		}
	}
}

type failing struct {
	r   io.Reader
	n   int
	err error
}

func (f *failing) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	p = p[:min(len(p), f.n)]
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

// An error of the stream underneath is passed on as it is: a failing
// network is not a broken file.
func TestStreamErrorPassesThrough(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	b := seal(t, strings.Repeat("y", 100<<10), "f", id.Recipient())
	outage := errors.New("connection reset")
	for _, at := range []int{0, 10, 200, 70 << 10} {
		_, err := io.ReadAll(Decrypt(&failing{r: bytes.NewReader(b), n: at, err: outage}, "f", []age.Identity{id}))
		if err != outage {
			t.Errorf("stream failed after %d bytes: got %v, want the stream's error", at, err)
		}
	}
}

func TestPassphraseIdentity(t *testing.T) {
	a, err := PassphraseIdentity("correct horse", "store-1", 10)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := PassphraseIdentity("correct horse", "store-1", 10)
	otherStore, _ := PassphraseIdentity("correct horse", "store-2", 10)
	otherPass, _ := PassphraseIdentity("correct horsf", "store-1", 10)
	if a.String() != again.String() {
		t.Fatal("the same passphrase derived two identities")
	}
	if a.String() == otherStore.String() || a.String() == otherPass.String() {
		t.Fatal("another store or passphrase derived the same identity")
	}
	// age parsed the encoding, checksum included; it must also print it back.
	if p, err := age.ParseX25519Identity(a.String()); err != nil || p.Recipient().String() != a.Recipient().String() {
		t.Fatalf("age does not read the derived identity back: %v", err)
	}
	check, err := Check("store-1", a.Recipient())
	if err != nil {
		t.Fatal(err)
	}
	if !Opens(check, "store-1", []age.Identity{a}) || Opens(check, "store-1", []age.Identity{otherPass}) || Opens(check, "store-2", []age.Identity{a}) {
		t.Fatal("the key check opens for the wrong key or store, or not for the right one")
	}
}

// A BIP 173 test vector: bech32 is the encoding age reads its keys in.
func TestBech32(t *testing.T) {
	if got := bech32("a", nil); got != "a12uel5l" {
		t.Fatalf("got %s", got)
	}
}

func TestMaxSize(t *testing.T) {
	id, _ := age.GenerateX25519Identity()
	for _, n := range []int{0, 1, 1000, 64 << 10, 64<<10 + 1, 200 << 10} {
		name := "2026/11/25/patch_20261125T062155.850Z_" + strings.Repeat("d", 200) + ".json.gz"
		b := seal(t, strings.Repeat("z", n), name, id.Recipient())
		if int64(len(b)) > MaxSize(int64(n), name) {
			t.Errorf("%d bytes sealed to %d, over MaxSize %d", n, len(b), MaxSize(int64(n), name))
		}
	}
}
