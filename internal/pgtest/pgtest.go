// Package pgtest gives tests a PostgreSQL database of their own: a fresh
// schema of the server DRIVESYNC_POSTGRES_URL names (a role that may
// create schemas in its database), dropped when the test ends. Without
// that variable the tests skip, unless DRIVESYNC_REQUIRE_POSTGRES is set
// (as CI does), when they fail.
package pgtest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// URL returns DRIVESYNC_POSTGRES_URL, or skips (or fails) the test.
func URL(t testing.TB) string {
	u := os.Getenv("DRIVESYNC_POSTGRES_URL")
	if u == "" {
		if os.Getenv("DRIVESYNC_REQUIRE_POSTGRES") != "" {
			t.Fatal("DRIVESYNC_REQUIRE_POSTGRES is set but DRIVESYNC_POSTGRES_URL is not")
		}
		t.Skip("DRIVESYNC_POSTGRES_URL not set: PostgreSQL is not tested")
	}
	return u
}

// create makes an object of kind ("SCHEMA" or "DATABASE") with a new
// name on the server, dropped (with drop's clause) when the test ends.
func create(t testing.TB, kind, drop string) (base, name string) {
	base = URL(t)
	db, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := make([]byte, 6)
	rand.Read(b)
	name = "test_" + hex.EncodeToString(b)
	if _, err := db.Exec(`CREATE ` + kind + ` ` + name); err != nil {
		t.Fatalf("create a %s on %s: %v", strings.ToLower(kind), redact(base), err)
	}
	t.Cleanup(func() {
		if db, err := sql.Open("pgx", base); err == nil {
			db.Exec(`DROP ` + kind + ` IF EXISTS ` + name + drop)
			db.Close()
		}
	})
	return base, name
}

// Fresh returns a URL whose objects live in a new, empty schema, dropped
// when the test ends.
func Fresh(t testing.TB) string {
	base, schema := create(t, "SCHEMA", " CASCADE")
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an unparsable URL)"
	}
	return p.Redacted()
}

// Kinds are the stores a sync server's tests run on.
var Kinds = []string{"sqlite", "postgres"}

// Spec returns the store spec (see syncserver.Open) of a fresh store of
// kind, "sqlite" or "postgres".
func Spec(t testing.TB, kind string) string {
	if kind == "sqlite" {
		return "sqlite:" + filepath.Join(t.TempDir(), "server.db")
	}
	return Fresh(t)
}

// Database creates a database of its own for the test (the role needs
// CREATEDB), dropped when the test ends, and returns its URL and name.
// A test that cuts connections to a database (as a restart does) takes
// one, so that other tests' databases are not touched.
func Database(t testing.TB) (dbURL, name string) {
	base, name := create(t, "DATABASE", " WITH (FORCE)")
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String(), name
}
