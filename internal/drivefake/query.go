package drivefake

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
)

// This file implements the subset of Drive's search language (the q
// parameter of files.list) that the fake understands:
//
//	query   = or
//	or      = and { "or" and }
//	and     = unary { "and" unary }
//	unary   = "not" unary | primary
//	primary = "(" or ")" | term
//	term    = string "in" "parents"
//	        | ("name" | "mimeType") ("=" | "!=" | "contains") string
//	        | "trashed" ("=" | "!=") ("true" | "false")
//	        | ("createdTime" | "modifiedTime") ("=" | "!=" | "<" | "<=" | ">" | ">=") string
//
// so "not" binds tighter than "and", which binds tighter than "or". Strings
// are in single quotes, with \' and \\ as the only escapes. Keywords (and,
// or, not, in, contains, true, false) are case-insensitive; field names are
// not. Times are RFC 3339, in UTC when they carry no offset. Anything else
// is a syntax error, which the server reports as Drive does: 400, reason
// "invalid".

// queryFile is what a query can look at in a file.
type queryFile struct {
	name     string
	mimeType string
	parents  []string // real ids
	trashed  bool
	created  time.Time
	modified time.Time
}

// A query is a parsed q: a predicate on files.
type query interface {
	match(f *queryFile) bool
}

type (
	orQuery  struct{ left, right query }
	andQuery struct{ left, right query }
	notQuery struct{ q query }

	// inParents is "'id' in parents".
	inParents struct{ id string }

	// stringTerm is name or mimeType compared with a string.
	stringTerm struct {
		field string
		op    string // "=", "!=" or "contains"
		value string
	}

	// trashedTerm is "trashed = true" and the like.
	trashedTerm struct {
		op    string // "=" or "!="
		value bool
	}

	// timeTerm is createdTime or modifiedTime compared with a time.
	timeTerm struct {
		field string
		op    string
		value time.Time
	}
)

func (q orQuery) match(f *queryFile) bool  { return q.left.match(f) || q.right.match(f) }
func (q andQuery) match(f *queryFile) bool { return q.left.match(f) && q.right.match(f) }
func (q notQuery) match(f *queryFile) bool { return !q.q.match(f) }

func (q inParents) match(f *queryFile) bool {
	return slices.Contains(f.parents, resolveAlias(q.id))
}

func (q stringTerm) match(f *queryFile) bool {
	v := f.name
	if q.field == "mimeType" {
		v = f.mimeType
	}
	switch q.op {
	case "=":
		return v == q.value
	case "!=":
		return v != q.value
	}
	if q.field == "name" {
		return nameContains(v, q.value)
	}
	return strings.Contains(v, q.value)
}

// nameContains is Drive's "name contains": the name and the pattern are cut
// into lower-cased alphanumeric words, and every word of the pattern must be
// a prefix of some word of the name. So "HelloWorld" contains 'hello' but
// not 'world', and "report-2026.txt" contains '2026'.
func nameContains(name, pattern string) bool {
	words := alnumWords(name)
	for _, p := range alnumWords(pattern) {
		if !slices.ContainsFunc(words, func(w string) bool { return strings.HasPrefix(w, p) }) {
			return false
		}
	}
	return true
}

func alnumWords(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
}

func (q trashedTerm) match(f *queryFile) bool {
	return (f.trashed == q.value) == (q.op == "=")
}

func (q timeTerm) match(f *queryFile) bool {
	v := f.created
	if q.field == "modifiedTime" {
		v = f.modified
	}
	c := v.Compare(q.value)
	switch q.op {
	case "=":
		return c == 0
	case "!=":
		return c != 0
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	default: // ">="
		return c >= 0
	}
}

// resolveAlias maps the folder aliases Drive accepts to the real ids.
func resolveAlias(id string) string {
	switch id {
	case "root":
		return RootID
	case "appDataFolder":
		return AppDataFolderID
	}
	return id
}

// Tokens.

type tokenKind int

const (
	tokEOF    tokenKind = iota
	tokIdent            // a field name or keyword
	tokString           // a quoted string, unescaped
	tokOp               // = != < <= > >=
	tokLParen
	tokRParen
)

type token struct {
	kind tokenKind
	text string
	pos  int // byte offset in the query, for error messages
}

func (t token) String() string {
	switch t.kind {
	case tokEOF:
		return "end of query"
	case tokString:
		return fmt.Sprintf("string %q", t.text)
	}
	return fmt.Sprintf("%q", t.text)
}

// tokenize splits a query into tokens, ending with a tokEOF.
func tokenize(src string) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(':
			toks = append(toks, token{tokLParen, "(", i})
			i++
		case c == ')':
			toks = append(toks, token{tokRParen, ")", i})
			i++
		case c == '=':
			toks = append(toks, token{tokOp, "=", i})
			i++
		case c == '!' || c == '<' || c == '>':
			op := string(c)
			if i+1 < len(src) && src[i+1] == '=' {
				op += "="
			}
			if op == "!" {
				return nil, fmt.Errorf("offset %d: '!' must be followed by '='", i)
			}
			toks = append(toks, token{tokOp, op, i})
			i += len(op)
		case c == '\'':
			s, n, err := scanString(src[i:])
			if err != nil {
				return nil, fmt.Errorf("offset %d: %w", i, err)
			}
			toks = append(toks, token{tokString, s, i})
			i += n
		case isIdentByte(c):
			j := i
			for j < len(src) && isIdentByte(src[j]) {
				j++
			}
			toks = append(toks, token{tokIdent, src[i:j], i})
			i = j
		default:
			return nil, fmt.Errorf("offset %d: unexpected character %q", i, c)
		}
	}
	return append(toks, token{tokEOF, "", len(src)}), nil
}

func isIdentByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

// scanString reads the quoted string at the start of s and returns its
// value and the number of bytes it took.
func scanString(s string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\'':
			return b.String(), i + 1, nil
		case '\\':
			if i+1 == len(s) {
				return "", 0, fmt.Errorf("unterminated string")
			}
			i++
			if s[i] != '\'' && s[i] != '\\' {
				return "", 0, fmt.Errorf(`bad escape \%c in string (only \' and \\ are allowed)`, s[i])
			}
			b.WriteByte(s[i])
		default:
			b.WriteByte(s[i])
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

// Parser.

type parser struct {
	toks []token
	pos  int
}

// parseQuery parses a q parameter. An empty or blank q matches every file.
func parseQuery(src string) (query, error) {
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	if toks[0].kind == tokEOF {
		return matchAll{}, nil
	}
	p := &parser{toks: toks}
	q, err := p.or()
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tokEOF {
		return nil, p.errorf(t, "expected 'and', 'or' or end of query")
	}
	return q, nil
}

type matchAll struct{}

func (matchAll) match(*queryFile) bool { return true }

func (p *parser) peek() token { return p.toks[p.pos] }

func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tokEOF {
		p.pos++
	}
	return t
}

// keyword reports whether the next token is the keyword kw, and consumes
// it if so.
func (p *parser) keyword(kw string) bool {
	if t := p.peek(); t.kind == tokIdent && strings.EqualFold(t.text, kw) {
		p.pos++
		return true
	}
	return false
}

func (p *parser) errorf(t token, format string, args ...any) error {
	return fmt.Errorf("offset %d, at %v: %s", t.pos, t, fmt.Sprintf(format, args...))
}

func (p *parser) or() (query, error) {
	left, err := p.and()
	if err != nil {
		return nil, err
	}
	for p.keyword("or") {
		right, err := p.and()
		if err != nil {
			return nil, err
		}
		left = orQuery{left, right}
	}
	return left, nil
}

func (p *parser) and() (query, error) {
	left, err := p.unary()
	if err != nil {
		return nil, err
	}
	for p.keyword("and") {
		right, err := p.unary()
		if err != nil {
			return nil, err
		}
		left = andQuery{left, right}
	}
	return left, nil
}

func (p *parser) unary() (query, error) {
	if p.keyword("not") {
		q, err := p.unary()
		if err != nil {
			return nil, err
		}
		return notQuery{q}, nil
	}
	return p.primary()
}

func (p *parser) primary() (query, error) {
	t := p.peek()
	switch t.kind {
	case tokLParen:
		p.next()
		q, err := p.or()
		if err != nil {
			return nil, err
		}
		if t := p.next(); t.kind != tokRParen {
			return nil, p.errorf(t, "expected ')'")
		}
		return q, nil
	case tokString:
		return p.inTerm()
	case tokIdent:
		return p.fieldTerm()
	}
	return nil, p.errorf(t, "expected a search term")
}

// inTerm parses "'id' in parents".
func (p *parser) inTerm() (query, error) {
	id := p.next().text
	if t := p.peek(); !p.keyword("in") {
		return nil, p.errorf(t, "expected 'in' after a string")
	}
	t := p.next()
	if t.kind != tokIdent || t.text != "parents" {
		return nil, p.errorf(t, "only 'parents' is supported after 'in'")
	}
	return inParents{id}, nil
}

// fieldTerm parses "field op value".
func (p *parser) fieldTerm() (query, error) {
	field := p.next()
	op := p.next()
	switch {
	case op.kind == tokOp:
	case op.kind == tokIdent && strings.EqualFold(op.text, "contains"):
		op.text = "contains"
	default:
		return nil, p.errorf(op, "expected an operator after %s", field.text)
	}
	value := p.next()

	switch field.text {
	case "name", "mimeType":
		if op.text != "=" && op.text != "!=" && op.text != "contains" {
			return nil, p.errorf(op, "%s takes =, != or contains", field.text)
		}
		if value.kind != tokString {
			return nil, p.errorf(value, "expected a quoted string")
		}
		return stringTerm{field.text, op.text, value.text}, nil

	case "trashed":
		if op.text != "=" && op.text != "!=" {
			return nil, p.errorf(op, "trashed takes = or !=")
		}
		switch {
		case value.kind == tokIdent && strings.EqualFold(value.text, "true"):
			return trashedTerm{op.text, true}, nil
		case value.kind == tokIdent && strings.EqualFold(value.text, "false"):
			return trashedTerm{op.text, false}, nil
		}
		return nil, p.errorf(value, "expected true or false")

	case "createdTime", "modifiedTime":
		if op.text == "contains" {
			return nil, p.errorf(op, "%s does not take contains", field.text)
		}
		if value.kind != tokString {
			return nil, p.errorf(value, "expected a quoted RFC 3339 time")
		}
		tm, err := parseQueryTime(value.text)
		if err != nil {
			return nil, p.errorf(value, "%v", err)
		}
		return timeTerm{field.text, op.text, tm}, nil
	}
	return nil, p.errorf(field, "unsupported search term")
}

// parseQueryTime parses an RFC 3339 time; one without an offset is UTC.
func parseQueryTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not an RFC 3339 time", s)
}
