package drivesync

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// jsonStream reads the JSON of a patch or state file value by value. It
// reads as json.Decoder does, and as the engine read these files with it:
// a device on an older app version must accept and refuse exactly the
// files this one does, up to the limits' bounds. So it keeps the
// decoder's rules:
//
//   - Whitespace before a token is consumed when the next token is looked
//     at, and Offset counts it as read.
//   - An object or array ends at its closing bracket; a string, number or
//     literal ends only when the byte after it has been looked at (or the
//     stream ended), as a scanner that stops on a delimiter must.
//   - No byte at or past limit may be looked at: that is errTooLarge, even
//     where the stream would have ended there.
//
// What json.Decoder checks byte by byte, it leaves to the callers: each
// value is returned as bytes, found by matching brackets, and must be
// checked (json.Valid, json.Unmarshal, or a scan that accepts only valid
// JSON, see entrydecode.go) before it is trusted.
type jsonStream struct {
	r     io.Reader
	buf   []byte
	i     int   // next unread byte of buf
	base  int64 // stream offset of buf[0]
	limit int64 // stream offset of the first byte no read may look at
	err   error // the error of the read after buf's bytes, once seen
}

func newJSONStream(r io.Reader) *jsonStream {
	return &jsonStream{r: r, buf: make([]byte, 0, 64<<10), limit: math.MaxInt64}
}

// Offset is the stream offset of the next unread byte.
func (s *jsonStream) Offset() int64 { return s.base + int64(s.i) }

// setLimit lets the reader look at the n bytes from the next unread one,
// and no further.
func (s *jsonStream) setLimit(n int64) { s.limit = addCapped(s.Offset(), n) }

// end is how far into buf the reader may look.
func (s *jsonStream) end() int {
	if room := s.limit - s.base; room < int64(len(s.buf)) {
		return int(max(room, 0))
	}
	return len(s.buf)
}

// more reads at least one byte past buf's end, keeping buf[s.i:]. It
// fails with errTooLarge where that byte is at or past the limit, and
// with the read's error (io.EOF at the end of the stream).
func (s *jsonStream) more() error {
	if s.base+int64(len(s.buf)) >= s.limit {
		return fmt.Errorf("%w: one change is over the record size limit", errTooLarge)
	}
	for s.err == nil {
		if s.i > 0 {
			n := copy(s.buf, s.buf[s.i:])
			s.buf = s.buf[:n]
			s.base += int64(s.i)
			s.i = 0
		}
		if len(s.buf) == cap(s.buf) {
			s.buf = append(make([]byte, 0, 2*cap(s.buf)), s.buf...)
		}
		// Never past the limit, as a reader bounded by it would not.
		room := min(int64(cap(s.buf)-len(s.buf)), s.limit-s.base-int64(len(s.buf)))
		n, err := s.r.Read(s.buf[len(s.buf) : len(s.buf)+int(room)])
		s.buf = s.buf[:len(s.buf)+n]
		s.err = err
		if n > 0 {
			return nil
		}
	}
	return s.err
}

// at returns the byte p bytes past the next unread one, reading as
// needed; ok is false at the end of the stream.
func (s *jsonStream) at(p int) (c byte, ok bool, err error) {
	for s.i+p >= s.end() {
		if err := s.more(); err != nil {
			if err == io.EOF {
				return 0, false, nil
			}
			return 0, false, err
		}
	}
	return s.buf[s.i+p], true, nil
}

// peek consumes whitespace and returns the next byte, unread.
func (s *jsonStream) peek() (byte, error) {
	for {
		c, ok, err := s.at(0)
		switch {
		case err != nil:
			return 0, err
		case !ok:
			return 0, io.EOF
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return c, nil
		}
	}
}

// delim reads the byte want, after whitespace.
func (s *jsonStream) delim(want byte) error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	if c != want {
		return fmt.Errorf("expected %q, found %q at offset %d", want, c, s.Offset())
	}
	s.i++
	return nil
}

// value reads the next value, after whitespace, and returns its bytes,
// valid until the next read.
func (s *jsonStream) value() ([]byte, error) {
	c, err := s.peek()
	if err != nil {
		return nil, err
	}
	// The value is buf[s.i:s.i+p] so far: s.i stays at its start until
	// it is read whole, so that more keeps it.
	p := 1
	switch c {
	case '{', '[', '"':
		depth, inString, escaped := 1, c == '"', false
		if inString {
			depth = 0
		}
		for done := false; !done; {
			end := s.end() - s.i
			for ; p < end; p++ {
				b := s.buf[s.i+p]
				switch {
				case escaped:
					escaped = false
				case inString:
					// Jump to the string's next quote or backslash.
					if k := quoteOrEscape(s.buf[s.i+p : s.i+end]); k < 0 {
						p = end - 1
						continue
					} else {
						p += k
						b = s.buf[s.i+p]
					}
					if b == '\\' {
						escaped = true
					} else {
						inString = false
						done = depth == 0
					}
				case b == '"':
					inString = true
				case b == '{' || b == '[':
					depth++
				case b == '}' || b == ']':
					depth--
					done = depth == 0
				}
				if done {
					p++
					break
				}
			}
			if done {
				break
			}
			if err := s.more(); err != nil {
				if err == io.EOF {
					return nil, io.ErrUnexpectedEOF
				}
				return nil, err
			}
		}
		if c == '"' {
			// A string ends when the byte after it is looked at.
			if _, _, err := s.at(p); err != nil {
				return nil, err
			}
		}
	default:
		end, err := s.scalar(c)
		if err != nil {
			return nil, err
		}
		p = end
	}
	v := s.buf[s.i : s.i+p]
	s.i += p
	return v, nil
}

// scalar reads a number or a literal, which starts with c, as a
// scanner does: it ends at the first byte its grammar cannot take once it
// is whole (that byte is looked at, not read), and is malformed at the
// first byte its grammar cannot take before. It returns its length.
func (s *jsonStream) scalar(c byte) (int, error) {
	bad := func(p int, b byte) error {
		return fmt.Errorf("invalid character %q in a number or literal at offset %d", b, s.Offset()+int64(p))
	}
	lit := ""
	switch c {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	case 'n':
		lit = "null"
	}
	if lit != "" {
		for p := 1; p < len(lit); p++ {
			b, ok, err := s.at(p)
			switch {
			case err != nil:
				return 0, err
			case !ok:
				return 0, io.ErrUnexpectedEOF
			case b != lit[p]:
				return 0, bad(p, b)
			}
		}
		if _, _, err := s.at(len(lit)); err != nil {
			return 0, err
		}
		return len(lit), nil
	}
	// The states of a number: after its sign, its leading zero, its
	// other integer digits, its point, its fraction digits, its e, the
	// sign of its exponent, and its exponent's digits.
	const (
		sign = iota
		zero
		digits
		point
		fraction
		e
		expSign
		exponent
	)
	state := sign
	switch {
	case c == '0':
		state = zero
	case c >= '1' && c <= '9':
		state = digits
	case c != '-':
		return 0, bad(0, c)
	}
	for p := 1; ; p++ {
		b, ok, err := s.at(p)
		if err != nil {
			return 0, err
		}
		digit := ok && b >= '0' && b <= '9'
		next := -1
		switch state {
		case sign:
			if digit {
				next = digits
				if b == '0' {
					next = zero
				}
			}
		case zero, digits:
			switch {
			case digit && state == digits:
				next = digits
			case ok && b == '.':
				next = point
			case ok && (b == 'e' || b == 'E'):
				next = e
			}
		case point, fraction:
			if digit {
				next = fraction
			} else if state == fraction && ok && (b == 'e' || b == 'E') {
				next = e
			}
		case e:
			if digit {
				next = exponent
			} else if ok && (b == '+' || b == '-') {
				next = expSign
			}
		case expSign, exponent:
			if digit {
				next = exponent
			}
		}
		if next >= 0 {
			state = next
			continue
		}
		switch state {
		case zero, digits, fraction, exponent:
			return p, nil // whole: b ends it
		}
		if !ok {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, bad(p, b)
	}
}

// quoteOrEscape is the index in b of the first '"' or '\\', or -1.
func quoteOrEscape(b []byte) int {
	q := bytes.IndexByte(b, '"')
	if q < 0 {
		q = len(b)
	}
	if e := bytes.IndexByte(b[:q], '\\'); e >= 0 {
		return e
	}
	if q == len(b) {
		return -1
	}
	return q
}

// atEnd checks that only whitespace follows, to the end of the stream.
func (s *jsonStream) atEnd() error {
	switch _, err := s.peek(); {
	case err == io.EOF:
		return nil
	case err != nil:
		return err
	}
	return errors.New("data after the end of the file")
}

// member reads the key of an object's next member, after the comma that
// must come before every member but the first (n > 0); ok is false at
// the object's end, whose brace it reads.
func (s *jsonStream) member(n int) (key string, ok bool, err error) {
	c, err := s.peek()
	if err != nil {
		return "", false, err
	}
	if c == '}' {
		s.i++
		return "", false, nil
	}
	if n > 0 {
		if c != ',' {
			return "", false, fmt.Errorf("expected ',' or '}' after a member, found %q at offset %d", c, s.Offset())
		}
		s.i++
		if c, err = s.peek(); err != nil {
			return "", false, err
		}
	}
	if c != '"' {
		return "", false, fmt.Errorf("expected a member name, found %q at offset %d", c, s.Offset())
	}
	raw, err := s.value()
	if err != nil {
		return "", false, err
	}
	if key, ok := plainString(raw); ok {
		return key, true, nil
	}
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", false, err
	}
	return key, true, nil
}

// decode reads a member's value, after its colon, into v as json.Unmarshal
// does.
func (s *jsonStream) decode(v any) error {
	if err := s.delim(':'); err != nil {
		return err
	}
	raw, err := s.value()
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

// skip reads a member's value, after its colon, and checks that it is
// JSON.
func (s *jsonStream) skip() error {
	if err := s.delim(':'); err != nil {
		return err
	}
	raw, err := s.value()
	if err != nil {
		return err
	}
	if !json.Valid(raw) {
		return fmt.Errorf("invalid JSON before offset %d", s.Offset())
	}
	return nil
}

// elements calls each with the bytes of every value of the array that is
// a member's value, after its colon (what names a value in errors). bound is how far the reader may
// look for one element: it is set before each, from the comma before it
// (the bracket before the first). The bytes are each's to keep.
func (s *jsonStream) elements(bound int64, what string, each func(i int, raw []byte) error) error {
	if err := s.delim(':'); err != nil {
		return err
	}
	if err := s.delim('['); err != nil {
		return err
	}
	for i := 0; ; i++ {
		c, err := s.peek()
		if err != nil {
			return err
		}
		if c == ']' {
			s.i++
			return nil
		}
		s.setLimit(bound)
		if i > 0 {
			if c != ',' {
				return fmt.Errorf("expected ',' or ']' after %s %d, found %q at offset %d", what, i-1, c, s.Offset())
			}
			s.i++
		}
		raw, err := s.value()
		if err != nil {
			return fmt.Errorf("%s %d: %w", what, i, err)
		}
		if err := each(i, bytes.Clone(raw)); err != nil {
			return err
		}
	}
}
