package drivefake

import (
	"slices"
	"testing"
	"time"
)

func TestParseQueryMatches(t *testing.T) {
	day := func(d int) time.Time { return time.Date(2026, 1, d, 0, 0, 0, 0, time.UTC) }
	files := []*queryFile{
		{name: "a", mimeType: "text/plain", parents: []string{RootID}, created: day(1), modified: day(5)},
		{name: "b", mimeType: "text/plain", parents: []string{"1dir"}, trashed: true, created: day(2), modified: day(2)},
		{name: "c", mimeType: FolderMimeType, parents: []string{RootID}, created: day(3), modified: day(3)},
		{name: "Valentine's Day", mimeType: "image/png", parents: []string{AppDataFolderID}, created: day(4), modified: day(4)},
		{name: `back\slash`, mimeType: "text/csv", parents: []string{"1dir"}, created: day(5), modified: day(6)},
	}
	tests := []struct {
		q    string
		want []string
	}{
		{"", []string{"a", "b", "c", "Valentine's Day", `back\slash`}},
		{"name = 'a'", []string{"a"}},
		{"name != 'a'", []string{"b", "c", "Valentine's Day", `back\slash`}},
		{`name = 'Valentine\'s Day'`, []string{"Valentine's Day"}},
		{`name = 'back\\slash'`, []string{`back\slash`}},
		{"name contains 'valen'", []string{"Valentine's Day"}},
		{"name contains 'day valentine'", []string{"Valentine's Day"}},
		{"name contains 'entine'", nil},
		{"mimeType = 'text/plain'", []string{"a", "b"}},
		{"mimeType != 'application/vnd.google-apps.folder'", []string{"a", "b", "Valentine's Day", `back\slash`}},
		{"mimeType contains 'text/'", []string{"a", "b", `back\slash`}},
		{"trashed = true", []string{"b"}},
		{"trashed = false", []string{"a", "c", "Valentine's Day", `back\slash`}},
		{"trashed != true", []string{"a", "c", "Valentine's Day", `back\slash`}},
		{"'1dir' in parents", []string{"b", `back\slash`}},
		{"'root' in parents", []string{"a", "c"}},
		{"'appDataFolder' in parents", []string{"Valentine's Day"}},
		{"createdTime > '2026-01-03T00:00:00Z'", []string{"Valentine's Day", `back\slash`}},
		{"createdTime >= '2026-01-03T00:00:00Z'", []string{"c", "Valentine's Day", `back\slash`}},
		{"createdTime < '2026-01-03T00:00:00Z'", []string{"a", "b"}},
		{"createdTime <= '2026-01-03T00:00:00Z'", []string{"a", "b", "c"}},
		{"createdTime = '2026-01-03T00:00:00Z'", []string{"c"}},
		{"createdTime != '2026-01-03T00:00:00Z'", []string{"a", "b", "Valentine's Day", `back\slash`}},
		{"modifiedTime > '2026-01-04T12:00:00Z'", []string{"a", `back\slash`}},
		{"modifiedTime < '2026-01-03'", []string{"b"}},

		// Precedence: not binds tighter than and, and tighter than or.
		{"name = 'a' or name = 'b' and trashed = true", []string{"a", "b"}},
		{"(name = 'a' or name = 'b') and trashed = true", []string{"b"}},
		{"trashed = true and name = 'c' or name = 'a'", []string{"a"}},
		{"trashed = true and (name = 'c' or name = 'a')", nil},
		{"not name = 'a' and mimeType = 'text/plain'", []string{"b"}},
		{"not (name = 'a' and mimeType = 'text/plain')", []string{"b", "c", "Valentine's Day", `back\slash`}},
		{"not name = 'a' or name = 'a'", []string{"a", "b", "c", "Valentine's Day", `back\slash`}},
		{"not not name = 'a'", []string{"a"}},
		{"'1dir' in parents and not trashed = true or name = 'c'", []string{"c", `back\slash`}},
		{"'1dir' in parents and (not trashed = true or name = 'c')", []string{`back\slash`}},
		{"name = 'a' OR name = 'c' AND NOT trashed = true", []string{"a", "c"}},
		{"((name = 'a'))", []string{"a"}},
	}
	for _, tt := range tests {
		q, err := parseQuery(tt.q)
		if err != nil {
			t.Errorf("%q: %v", tt.q, err)
			continue
		}
		var got []string
		for _, f := range files {
			if q.match(f) {
				got = append(got, f.name)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%q matched %q, want %q", tt.q, got, tt.want)
		}
	}
}

func TestParseQueryErrors(t *testing.T) {
	for _, q := range []string{
		"name",
		"name =",
		"name = a",
		"name = 'a",
		`name = 'a\'`,
		`name = 'a\n'`,
		"name == 'a'",
		"name ! 'a'",
		"name < 'a'",
		"name = 'a' and",
		"name = 'a' or or name = 'b'",
		"and name = 'a'",
		"not",
		"(name = 'a'",
		"name = 'a')",
		"()",
		"name = 'a' name = 'b'",
		"trashed = 'false'",
		"trashed contains true",
		"trashed > false",
		"createdTime contains '2026-01-01T00:00:00Z'",
		"createdTime > 2026",
		"createdTime > 'last week'",
		"'x' in owners",
		"'x' parents",
		"'x'",
		"parents in 'x'",
		"fullText contains 'x'",
		"starred = true",
		"Name = 'a'", // field names are case-sensitive, keywords are not
		"name = 'a' & name = 'b'",
		"name = \"a\"",
	} {
		if _, err := parseQuery(q); err == nil {
			t.Errorf("%q parsed, want a syntax error", q)
		}
	}
}

func TestTokenize(t *testing.T) {
	toks, err := tokenize(`(name!='it\'s'or modifiedTime>='x')`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tok := range toks {
		got = append(got, tok.text)
	}
	want := []string{"(", "name", "!=", "it's", "or", "modifiedTime", ">=", "x", ")", ""}
	if !slices.Equal(got, want) {
		t.Errorf("tokens %q, want %q", got, want)
	}
}
