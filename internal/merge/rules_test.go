package merge

import (
	"regexp"
	"strings"
	"testing"
)

// CheckTableName takes the names it took when it matched a regular
// expression, and no other.
func TestCheckTableName(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	before := func(name string) bool {
		return re.MatchString(name) && len(name) <= 128 && !strings.HasPrefix(strings.ToLower(name), "sqlite_") && !reservedTables[strings.ToLower(name)]
	}
	names := []string{"", "_", "a", "A9_", "9a", "_9", "a-b", "a b", "é", "aé", "a\x00", "a\n", "notes",
		"sqlite", "sqlite_", "SQLite_master", "sqlitex", "Sync_States", "sync_state", strings.Repeat("a", 128), strings.Repeat("a", 129)}
	for c := 0; c < 256; c++ {
		names = append(names, string(rune(c)), "x"+string([]byte{byte(c)}), string([]byte{byte(c)})+"x")
	}
	for _, name := range names {
		if got, want := CheckTableName(name) == nil, before(name); got != want {
			t.Errorf("CheckTableName(%q) took it: %v, want %v", name, got, want)
		}
	}
}
