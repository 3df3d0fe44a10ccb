package syncserver

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// ReadTokens reads a tokens file: one "USER TOKEN" pair per line, blank
// lines and lines starting with # skipped. It returns a map from token to
// user for Options.Tokens. A user may have several tokens; a token may
// not appear twice. Errors name the line, never the token.
func ReadTokens(r io.Reader) (map[string]string, error) {
	tokens := map[string]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) != 2:
			return nil, fmt.Errorf("line %d: want USER TOKEN, two words", n)
		case len(f[1]) < 16:
			return nil, fmt.Errorf("line %d: the token of %s is shorter than 16 characters; use a long random one (openssl rand -hex 32)", n, f[0])
		}
		if _, dup := tokens[f[1]]; dup {
			return nil, fmt.Errorf("line %d: the token of %s is used twice", n, f[0])
		}
		tokens[f[1]] = f[0]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("no tokens: add a line USER TOKEN")
	}
	return tokens, nil
}
