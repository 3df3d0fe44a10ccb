// Package jsonv parses JSON into the canonical tree that drivesync stores,
// diffs and merges.
//
// The canonical form is what makes every device byte-identical:
//
//   - Object members are sorted by key (byte order); a duplicated key keeps
//     its last value, as most decoders do.
//   - In an object reached from the root through objects only, a member
//     whose value is null is dropped: RFC 7396 cannot set a member to null
//     (null means remove), so "null" and "absent" are the same value.
//     Parsing with KeepNulls keeps them, for merge patches, where null is
//     the removal marker.
//   - Every other value (string, number, true, false, null, array) is a
//     leaf kept as canonical bytes: no insignificant space, strings
//     re-escaped the one way Encode does, invalid UTF-8 replaced by U+FFFD.
//     Objects inside arrays are canonical too but keep their null members:
//     an array is a value, replaced whole.
//   - Numbers keep their literal text. They are never converted to float64,
//     so integers beyond 2^53 and long decimals round-trip exactly.
package jsonv

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// DefaultMaxDepth is the nesting limit Parse applies when given zero.
const DefaultMaxDepth = 200

// Value is a canonical JSON value: an object (Leaf == nil) with members
// sorted by key, or a leaf holding the canonical bytes of any other value.
type Value struct {
	Leaf    []byte
	Members []Member
}

// Member is one member of an object.
type Member struct {
	Key   string
	Value Value
}

var nullBytes = []byte("null")

// Null is the leaf null, the removal marker of a merge patch.
var Null = Value{Leaf: nullBytes}

// IsObject reports whether v is an object.
func (v Value) IsObject() bool { return v.Leaf == nil }

// IsNull reports whether v is the leaf null.
func (v Value) IsNull() bool { return string(v.Leaf) == "null" }

// Get returns the member named key of object v.
func (v Value) Get(key string) (Value, bool) {
	i, ok := slices.BinarySearchFunc(v.Members, key, func(m Member, k string) int { return strings.Compare(m.Key, k) })
	if !ok {
		return Value{}, false
	}
	return v.Members[i].Value, true
}

// Equal reports whether a and b are the same canonical value.
func Equal(a, b Value) bool {
	if a.IsObject() != b.IsObject() {
		return false
	}
	if !a.IsObject() {
		return bytes.Equal(a.Leaf, b.Leaf)
	}
	if len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		if a.Members[i].Key != b.Members[i].Key || !Equal(a.Members[i].Value, b.Members[i].Value) {
			return false
		}
	}
	return true
}

// Options control Parse.
type Options struct {
	// KeepNulls keeps null members of objects (merge patches need them).
	KeepNulls bool
	// MaxDepth bounds the nesting of objects and arrays; zero means
	// DefaultMaxDepth.
	MaxDepth int
}

// SyntaxError describes malformed input.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("json: %s at offset %d", e.Msg, e.Offset) }

// ErrTooDeep is returned (wrapped in a SyntaxError message) when input
// nests deeper than the limit.
var ErrTooDeep = errors.New("json: nested too deep")

// Parse parses one JSON value that must fill data (surrounding space
// allowed) into its canonical form.
func Parse(data []byte, opt Options) (Value, error) {
	if opt.MaxDepth <= 0 {
		opt.MaxDepth = DefaultMaxDepth
	}
	p := parser{data: data, opt: opt}
	p.skipSpace()
	v, err := p.value(0, false)
	if err != nil {
		return Value{}, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return Value{}, p.fail("unexpected data after value")
	}
	return v, nil
}

// ParseObject is Parse for input that must be an object.
func ParseObject(data []byte, opt Options) (Value, error) {
	v, err := Parse(data, opt)
	if err != nil {
		return Value{}, err
	}
	if !v.IsObject() {
		return Value{}, &SyntaxError{Msg: "not an object"}
	}
	return v, nil
}

type parser struct {
	data []byte
	pos  int
	opt  Options
	buf  []byte // scratch for leaves inside arrays
}

func (p *parser) fail(msg string) error { return &SyntaxError{Offset: p.pos, Msg: msg} }

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value parses the value at p.pos. inArray says whether an array encloses
// it, where objects keep their null members and leaves are not split out.
func (p *parser) value(depth int, inArray bool) (Value, error) {
	if p.pos >= len(p.data) {
		return Value{}, p.fail("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		if depth >= p.opt.MaxDepth {
			return Value{}, fmt.Errorf("%w (limit %d) at offset %d", ErrTooDeep, p.opt.MaxDepth, p.pos)
		}
		return p.object(depth+1, inArray)
	case c == '[':
		if depth >= p.opt.MaxDepth {
			return Value{}, fmt.Errorf("%w (limit %d) at offset %d", ErrTooDeep, p.opt.MaxDepth, p.pos)
		}
		start := len(p.buf)
		if err := p.array(depth + 1); err != nil {
			return Value{}, err
		}
		leaf := slices.Clone(p.buf[start:])
		p.buf = p.buf[:start]
		return Value{Leaf: leaf}, nil
	default:
		start := len(p.buf)
		if err := p.scalar(); err != nil {
			return Value{}, err
		}
		leaf := slices.Clone(p.buf[start:])
		p.buf = p.buf[:start]
		return Value{Leaf: leaf}, nil
	}
}

func (p *parser) object(depth int, inArray bool) (Value, error) {
	p.pos++ // '{'
	var members []Member
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return Value{Members: []Member{}}, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return Value{}, p.fail("expected string key")
		}
		start := len(p.buf)
		if err := p.str(); err != nil {
			return Value{}, err
		}
		key, err := unquote(p.buf[start:])
		if err != nil {
			return Value{}, p.fail(err.Error())
		}
		p.buf = p.buf[:start]
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return Value{}, p.fail("expected ':'")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth, inArray)
		if err != nil {
			return Value{}, err
		}
		members = append(members, Member{Key: key, Value: v})
		p.skipSpace()
		if p.pos >= len(p.data) {
			return Value{}, p.fail("unexpected end of input in object")
		}
		if p.data[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.data[p.pos] != '}' {
			return Value{}, p.fail("expected ',' or '}'")
		}
		p.pos++
		break
	}
	// Sort by key; on duplicates keep the last, then drop nulls.
	slices.SortStableFunc(members, func(a, b Member) int { return strings.Compare(a.Key, b.Key) })
	out := members[:0]
	for i, m := range members {
		if i+1 < len(members) && members[i+1].Key == m.Key {
			continue
		}
		if m.Value.IsNull() && !inArray && !p.opt.KeepNulls {
			continue
		}
		out = append(out, m)
	}
	if out == nil {
		out = []Member{}
	}
	return Value{Members: out}, nil
}

// array appends the canonical bytes of the array at p.pos to p.buf.
func (p *parser) array(depth int) error {
	p.pos++ // '['
	p.buf = append(p.buf, '[')
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.buf = append(p.buf, ']')
		return nil
	}
	for first := true; ; first = false {
		if !first {
			p.buf = append(p.buf, ',')
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case '{':
			if depth >= p.opt.MaxDepth {
				return fmt.Errorf("%w (limit %d) at offset %d", ErrTooDeep, p.opt.MaxDepth, p.pos)
			}
			// Detach p.buf while parsing the object: its leaves use it.
			saved := p.buf
			p.buf = nil
			v, err := p.object(depth+1, true)
			p.buf = saved
			if err != nil {
				return err
			}
			p.buf = Append(p.buf, v)
		case '[':
			if depth >= p.opt.MaxDepth {
				return fmt.Errorf("%w (limit %d) at offset %d", ErrTooDeep, p.opt.MaxDepth, p.pos)
			}
			if err := p.array(depth + 1); err != nil {
				return err
			}
		default:
			if err := p.scalar(); err != nil {
				return err
			}
		}
		p.skipSpace()
		if p.pos >= len(p.data) {
			return p.fail("unexpected end of input in array")
		}
		if p.data[p.pos] == ',' {
			p.pos++
			continue
		}
		if p.data[p.pos] != ']' {
			return p.fail("expected ',' or ']'")
		}
		p.pos++
		p.buf = append(p.buf, ']')
		return nil
	}
}

// scalar appends the canonical bytes of the string, number or literal at
// p.pos to p.buf.
func (p *parser) scalar() error {
	c := p.data[p.pos]
	switch {
	case c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(p.data[p.pos:], []byte(lit)) {
			p.pos += len(lit)
			p.buf = append(p.buf, lit...)
			return nil
		}
	}
	return p.fail(fmt.Sprintf("invalid character %q", c))
}

func (p *parser) number() error {
	start := p.pos
	d := p.data
	i := p.pos
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		p.pos = i
		return p.fail("invalid number")
	}
	// digits consumes one or more digits at i.
	digits := func() bool {
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			return false
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		return true
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			p.pos = i
			return p.fail("invalid number")
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			p.pos = i
			return p.fail("invalid number")
		}
	}
	p.pos = i
	p.buf = append(p.buf, d[start:i]...)
	return nil
}

// str decodes the string at p.pos and appends its canonical encoding.
func (p *parser) str() error {
	p.pos++ // opening quote
	d := p.data
	// Fast path: no escapes, no control characters, valid UTF-8.
	i := p.pos
	for i < len(d) {
		c := d[i]
		if c == '"' {
			if seg := d[p.pos:i]; utf8.Valid(seg) {
				p.buf = append(p.buf, '"')
				p.buf = append(p.buf, seg...)
				p.buf = append(p.buf, '"')
				p.pos = i + 1
				return nil
			}
			break
		}
		if c == '\\' || c < 0x20 {
			break
		}
		i++
	}
	var sb []byte
	for {
		if p.pos >= len(d) {
			return p.fail("unterminated string")
		}
		c := d[p.pos]
		switch {
		case c == '"':
			p.pos++
			p.buf = AppendString(p.buf, string(sb))
			return nil
		case c < 0x20:
			return p.fail("control character in string")
		case c == '\\':
			if p.pos+1 >= len(d) {
				return p.fail("unterminated escape")
			}
			e := d[p.pos+1]
			p.pos += 2
			switch e {
			case '"', '\\', '/':
				sb = append(sb, e)
			case 'b':
				sb = append(sb, '\b')
			case 'f':
				sb = append(sb, '\f')
			case 'n':
				sb = append(sb, '\n')
			case 'r':
				sb = append(sb, '\r')
			case 't':
				sb = append(sb, '\t')
			case 'u':
				r, ok := p.hex4()
				if !ok {
					return p.fail("invalid \\u escape")
				}
				if r >= 0xD800 && r < 0xDC00 { // high surrogate: want a low one
					if p.pos+1 < len(d) && d[p.pos] == '\\' && d[p.pos+1] == 'u' {
						save := p.pos
						p.pos += 2
						r2, ok := p.hex4()
						if ok && r2 >= 0xDC00 && r2 < 0xE000 {
							r = 0x10000 + (r-0xD800)<<10 + (r2 - 0xDC00)
						} else {
							p.pos = save
							r = utf8.RuneError
						}
					} else {
						r = utf8.RuneError
					}
				} else if r >= 0xDC00 && r < 0xE000 {
					r = utf8.RuneError
				}
				sb = utf8.AppendRune(sb, r)
			default:
				return p.fail("invalid escape")
			}
		default:
			r, size := utf8.DecodeRune(d[p.pos:])
			sb = utf8.AppendRune(sb, r) // invalid bytes become U+FFFD
			p.pos += size
		}
	}
}

func (p *parser) hex4() (rune, bool) {
	if p.pos+4 > len(p.data) {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

// unquote decodes a canonical string encoding produced by str.
func unquote(enc []byte) (string, error) {
	s := enc[1 : len(enc)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		return string(s), nil
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			sb.WriteByte(s[i])
			continue
		}
		i++
		switch s[i] {
		case '"', '\\':
			sb.WriteByte(s[i])
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'u':
			var r rune
			for _, c := range s[i+1 : i+5] {
				r <<= 4
				switch {
				case c >= '0' && c <= '9':
					r |= rune(c - '0')
				default:
					r |= rune(c - 'a' + 10)
				}
			}
			sb.WriteRune(r)
			i += 4
		default:
			return "", errors.New("invalid escape in key")
		}
	}
	return sb.String(), nil
}

const hexDigits = "0123456789abcdef"

// AppendString appends the canonical encoding of s: only '"', '\\' and
// control characters are escaped, with the short forms where JSON has them.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			if c < utf8.RuneSelf {
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, "\ufffd"...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Append appends the canonical encoding of v to dst.
func Append(dst []byte, v Value) []byte {
	if !v.IsObject() {
		return append(dst, v.Leaf...)
	}
	dst = append(dst, '{')
	for i, m := range v.Members {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendString(dst, m.Key)
		dst = append(dst, ':')
		dst = Append(dst, m.Value)
	}
	return append(dst, '}')
}

// Encode returns the canonical encoding of v.
func Encode(v Value) []byte { return Append(nil, v) }

// ParseArray parses a JSON array into its elements, each in canonical
// form (objects as trees, everything else as leaves).
func ParseArray(data []byte, opt Options) ([]Value, error) {
	if opt.MaxDepth <= 0 {
		opt.MaxDepth = DefaultMaxDepth
	}
	p := parser{data: data, opt: opt}
	p.skipSpace()
	if p.pos >= len(p.data) || p.data[p.pos] != '[' {
		return nil, p.fail("not an array")
	}
	p.pos++
	var out []Value
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
	} else {
		for {
			p.skipSpace()
			v, err := p.value(1, true)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			p.skipSpace()
			if p.pos >= len(p.data) {
				return nil, p.fail("unexpected end of input in array")
			}
			if p.data[p.pos] == ',' {
				p.pos++
				continue
			}
			if p.data[p.pos] != ']' {
				return nil, p.fail("expected ',' or ']'")
			}
			p.pos++
			break
		}
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.fail("unexpected data after value")
	}
	return out, nil
}

// String returns the string a canonical string leaf encodes.
func (v Value) String() (string, bool) {
	if len(v.Leaf) < 2 || v.Leaf[0] != '"' {
		return "", false
	}
	s, err := unquote(v.Leaf)
	return s, err == nil
}

// Canonical reports whether data is already the canonical encoding of the
// value it holds, that is whether Parse succeeds on it with opt and Encode
// gives back the same bytes. It allocates nothing, so a reader can keep
// bytes that are canonical as they are instead of building their tree.
// It may report false for a few canonical encodings (an object key with
// an escape in it); the caller then parses, and loses only time.
func Canonical(data []byte, opt Options) bool {
	if opt.MaxDepth <= 0 {
		opt.MaxDepth = DefaultMaxDepth
	}
	c := checker{data: data, keepNulls: opt.KeepNulls, maxDepth: opt.MaxDepth}
	return c.value(0, false) && c.pos == len(data)
}

type checker struct {
	data      []byte
	pos       int
	keepNulls bool
	maxDepth  int
}

func (c *checker) value(depth int, inArray bool) bool {
	if c.pos >= len(c.data) {
		return false
	}
	switch b := c.data[c.pos]; {
	case b == '{':
		return depth < c.maxDepth && c.object(depth+1, inArray)
	case b == '[':
		return depth < c.maxDepth && c.array(depth+1)
	case b == '"':
		_, ok := c.str()
		return ok
	case b == '-' || (b >= '0' && b <= '9'):
		p := parser{data: c.data, pos: c.pos}
		if p.number() != nil {
			return false
		}
		c.pos = p.pos
		return true
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if bytes.HasPrefix(c.data[c.pos:], []byte(lit)) {
			c.pos += len(lit)
			return true
		}
	}
	return false
}

// object checks an object: members sorted by key with no key twice, and
// no null member where Parse would drop it.
func (c *checker) object(depth int, inArray bool) bool {
	c.pos++ // '{'
	if c.pos < len(c.data) && c.data[c.pos] == '}' {
		c.pos++
		return true
	}
	var prev []byte
	for first := true; ; first = false {
		key, ok := c.str()
		// A key with an escape sorts by its decoded bytes: left to Parse.
		if !ok || bytes.IndexByte(key, '\\') >= 0 || (!first && bytes.Compare(prev, key) >= 0) {
			return false
		}
		prev = key
		if c.pos >= len(c.data) || c.data[c.pos] != ':' {
			return false
		}
		c.pos++
		if !inArray && !c.keepNulls && bytes.HasPrefix(c.data[c.pos:], nullBytes) {
			return false
		}
		if !c.value(depth, inArray) || c.pos >= len(c.data) {
			return false
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
		case '}':
			c.pos++
			return true
		default:
			return false
		}
	}
}

func (c *checker) array(depth int) bool {
	c.pos++ // '['
	if c.pos < len(c.data) && c.data[c.pos] == ']' {
		c.pos++
		return true
	}
	for {
		if !c.value(depth, true) || c.pos >= len(c.data) {
			return false
		}
		switch c.data[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			return true
		default:
			return false
		}
	}
}

// str checks a string at c.pos spelled as AppendString spells it, and
// returns what is between its quotes.
func (c *checker) str() ([]byte, bool) {
	if c.pos >= len(c.data) || c.data[c.pos] != '"' {
		return nil, false
	}
	d := c.data
	start := c.pos + 1
	for i := start; i < len(d); {
		b := d[i]
		switch {
		case b == '"':
			c.pos = i + 1
			return d[start:i], true
		case b < 0x20:
			return nil, false
		case b == '\\':
			if i+1 >= len(d) {
				return nil, false
			}
			switch d[i+1] {
			case '"', '\\', 'n', 'r', 't', 'b', 'f':
				i += 2
			case 'u':
				// Only a control character without a short form.
				if i+6 > len(d) || d[i+2] != '0' || d[i+3] != '0' || (d[i+4] != '0' && d[i+4] != '1') {
					return nil, false
				}
				h := strings.IndexByte(hexDigits, d[i+5])
				if h < 0 {
					return nil, false
				}
				switch ch := (d[i+4]-'0')<<4 | byte(h); ch {
				case '\n', '\r', '\t', '\b', '\f':
					return nil, false
				}
				i += 6
			default:
				return nil, false
			}
		case b < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, false
			}
			i += size
		}
	}
	return nil, false
}

// PlainString returns the string a JSON string literal v holds when it
// has no escape and no control character and is valid UTF-8: its bytes
// between the quotes, as encoding/json decodes them, without a decoder.
// ok is false for any other literal, which a decoder must read.
func PlainString(v []byte) (s string, ok bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	in := v[1 : len(v)-1]
	for _, c := range in {
		if c < 0x20 || c == '\\' || c == '"' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}
