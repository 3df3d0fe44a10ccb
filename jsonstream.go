package drivesync

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/drivesync/drivesync/internal/jsonv"
)

// jsonStream reads the JSON of a patch or state file value by value. It
// reads as json.Decoder does, and as the engine read these files with it:
// a device on an older app version must accept and refuse exactly the
// files this one does, and where a file meets a bound that depends on
// how the decoder read it. So it reads as the decoder did, down to its
// buffer:
//
//   - The same reads, of the same sizes: the buffer starts at 512 bytes,
//     grows to twice its size and 512 more when less than 512 are free,
//     and keeps from the start of the token being read (whitespace before
//     a token is kept until the token is found). No read goes past the
//     limit, and a read at the limit fails with errTooLarge, as a reader
//     bounded there fails.
//   - A read's error counts only once its bytes are used up and the token
//     needs more: an error (io.EOF too) that comes with the bytes that
//     complete the token is dropped, and the next token reads again.
//   - An object or array ends at its closing bracket; a string, number or
//     literal ends only when the byte after it has been looked at, or the
//     stream ended, as a scanner that stops on a delimiter must.
//
// What json.Decoder checks byte by byte, it leaves to the callers: each
// value is returned as bytes, found by matching brackets, and must be
// checked (json.Valid, json.Unmarshal, or a scan that accepts only valid
// JSON, see entrydecode.go) before it is trusted.
type jsonStream struct {
	r     io.Reader
	buf   []byte
	i     int   // start of the token being read (json.Decoder's scanp)
	base  int64 // stream offset of buf[0]
	limit int64 // stream offset past which no read goes
	// pending is the error of the token's last read, reported once the
	// token needs bytes past that read's.
	pending error
}

func newJSONStream(r io.Reader) *jsonStream {
	return &jsonStream{r: r, limit: math.MaxInt64}
}

// Offset is the stream offset of the next unread byte.
func (s *jsonStream) Offset() int64 { return s.base + int64(s.i) }

// setLimit lets the reader read the n bytes from the next unread one,
// and no further.
func (s *jsonStream) setLimit(n int64) { s.limit = addCapped(s.Offset(), n) }

// refill reads once more, keeping buf[s.i:], as json.Decoder.refill does.
func (s *jsonStream) refill() error {
	if s.i > 0 {
		n := copy(s.buf, s.buf[s.i:])
		s.buf = s.buf[:n]
		s.base += int64(s.i)
		s.i = 0
	}
	const minRead = 512
	if cap(s.buf)-len(s.buf) < minRead {
		s.buf = append(make([]byte, 0, 2*cap(s.buf)+minRead), s.buf...)
	}
	p := s.buf[len(s.buf):cap(s.buf)]
	room := s.limit - s.base - int64(len(s.buf))
	if room <= 0 {
		return fmt.Errorf("%w: one change is over the record size limit", errTooLarge)
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := s.r.Read(p)
	s.buf = s.buf[:len(s.buf)+n]
	return err
}

// at returns the byte p bytes past the token's start, reading as needed:
// ok is false where the stream ended before it.
func (s *jsonStream) at(p int) (c byte, ok bool, err error) {
	for s.i+p >= len(s.buf) {
		if s.pending != nil {
			if s.pending == io.EOF {
				return 0, false, nil
			}
			return 0, false, s.pending
		}
		s.pending = s.refill()
	}
	return s.buf[s.i+p], true, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// peek returns the next byte that is not whitespace, unread; the
// whitespace before it is read.
func (s *jsonStream) peek() (byte, error) {
	s.pending = nil
	for p := 0; ; p++ {
		c, ok, err := s.at(p)
		switch {
		case err != nil:
			return 0, err
		case !ok:
			return 0, io.EOF
		case !isSpace(c):
			s.i += p
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

// token reads the byte want where a value may come instead (the file's
// first token, a member's value), as json.Decoder's Token does: a string,
// number or literal found there is read whole before it is refused.
func (s *jsonStream) token(want byte) error {
	c, err := s.peek()
	if err != nil {
		return err
	}
	if c == want {
		s.i++
		return nil
	}
	return s.unwanted(fmt.Errorf("expected %q, found %q at offset %d", want, c, s.Offset()))
}

// unwanted returns err for the token at the next byte, after reading it
// whole if it is a string, number or literal, as Token reads it.
func (s *jsonStream) unwanted(err error) error {
	switch c := s.buf[s.i]; c {
	case '{', '}', '[', ']', ':', ',':
		return err
	}
	if _, verr := s.value(); verr != nil {
		return verr
	}
	return err
}

// more peeks at what follows in an array or object, as json.Decoder's
// More did: a read that fails there is tried again by the Token that
// followed More, which then takes only the closing byte.
func (s *jsonStream) more(closing byte) (byte, error) {
	c, err := s.peek()
	if err == nil {
		return c, nil
	}
	if c, err = s.peek(); err != nil {
		return 0, err
	}
	if c != closing {
		return 0, fmt.Errorf("expected %q, found %q at offset %d", closing, c, s.Offset())
	}
	return c, nil
}

// value reads the next value, after whitespace, and returns its bytes,
// valid until the next read.
func (s *jsonStream) value() ([]byte, error) {
	s.pending = nil
	// The token is buf[s.i:s.i+p] so far, whitespace first: s.i stays at
	// its start until it is read whole, so that refill keeps it.
	p := 0
	var c byte
	for {
		b, ok, err := s.at(p)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, io.ErrUnexpectedEOF
		}
		if !isSpace(b) {
			c = b
			break
		}
		p++
	}
	start := p
	p++
	switch c {
	case '{', '[', '"':
		depth, inString, escaped := 1, c == '"', false
		if inString {
			depth = 0
		}
		for done := false; !done; {
			for ; s.i+p < len(s.buf); p++ {
				b := s.buf[s.i+p]
				switch {
				case escaped:
					escaped = false
				case inString:
					// Jump to the string's next quote or backslash.
					k := quoteOrEscape(s.buf[s.i+p:])
					if k < 0 {
						p = len(s.buf) - s.i - 1
						continue
					}
					p += k
					if s.buf[s.i+p] == '\\' {
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
			if _, ok, err := s.at(p); err != nil {
				return nil, err
			} else if !ok {
				return nil, io.ErrUnexpectedEOF
			}
		}
		if c == '"' {
			// A string ends when the byte after it is looked at.
			if _, _, err := s.at(p); err != nil {
				return nil, err
			}
		}
	default:
		n, err := s.scalar(start, c)
		if err != nil {
			return nil, err
		}
		p = start + n
	}
	v := s.buf[s.i+start : s.i+p]
	s.i += p
	return v, nil
}

// scalar reads a number or a literal, which starts with c start bytes
// past the token's start, as a
// scanner does: it ends at the first byte its grammar cannot take once it
// is whole (that byte is looked at, not read), and is malformed at the
// first byte its grammar cannot take before. It returns its length.
func (s *jsonStream) scalar(start int, c byte) (int, error) {
	bad := func(p int, b byte) error {
		return fmt.Errorf("invalid character %q in a number or literal at offset %d", b, s.Offset()+int64(start+p))
	}
	at := func(p int) (byte, bool, error) { return s.at(start + p) }
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
			b, ok, err := at(p)
			switch {
			case err != nil:
				return 0, err
			case !ok:
				return 0, io.ErrUnexpectedEOF
			case b != lit[p]:
				return 0, bad(p, b)
			}
		}
		if _, _, err := at(len(lit)); err != nil {
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
		b, ok, err := at(p)
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
	return bytes.IndexAny(b, `"\`)
}

// atEnd checks that only whitespace follows, to the end of the stream.
func (s *jsonStream) atEnd() error {
	switch _, err := s.peek(); {
	case err == io.EOF:
		return nil
	case err != nil:
		return err
	}
	return s.unwanted(errors.New("data after the end of the file"))
}

// member reads the key of an object's next member, after the comma that
// must come before every member but the first (n > 0); ok is false at
// the object's end, whose brace it reads.
func (s *jsonStream) member(n int) (key string, ok bool, err error) {
	c, err := s.more('}')
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
	if key, ok := jsonv.PlainString(raw); ok {
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
// a member's value, after its colon (what names a value in errors), in
// order, on the caller's goroutine. bound is how far the reader may look
// for one element: it is set before each, from the comma before it (the
// bracket before the first). The bytes are each's to keep.
//
// The array is read a batch ahead of each, on a goroutine of its own
// (see readAhead): inflating and scanning the elements on one core,
// decoding, checking and spooling them on the other. The first error of
// either side, in the elements' order, ends the read.
func (s *jsonStream) elements(bound int64, what string, each func(i int, raw []byte) error) error {
	if err := s.delim(':'); err != nil {
		return err
	}
	if err := s.token('['); err != nil {
		return err
	}
	n := 0 // the elements each has had
	return readAhead(func(send func([]byte, int) bool) error {
		for i := 0; ; i++ {
			c, err := s.more(']')
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
			if !send(bytes.Clone(raw), len(raw)) {
				return nil
			}
		}
	}, func(raw *[]byte) error {
		n++
		return each(n-1, *raw)
	})
}
