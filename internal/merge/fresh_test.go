package merge

import "testing"

// ParseFreshClock takes exactly the clocks FreshClock writes, byte for
// byte, whatever the device id holds, and nothing else.
func TestParseFreshClock(t *testing.T) {
	for _, at := range []Stamp{
		{1, "425af682-b7fd-4220-94ba-bbb2b3ac2d2c"},
		{1 << 40, "dev"},
		{7, `a"b\c`},
		{7, "tab\there"},
		{7, "ünï ✓"},
		{7, "bad\xffutf8"},
		{7, ""},
	} {
		clock := FreshClock(at)
		got, ok := ParseFreshClock([]byte(clock))
		want := at
		if at.Device == "bad\xffutf8" {
			want.Device = "bad\ufffdutf8" // FreshClock writes it replaced
		}
		if !ok || got != want {
			t.Errorf("ParseFreshClock(%s) = %v, %v; want %v", clock, got, ok, want)
		}
	}
	for _, clock := range []string{
		`{"d":["\u0061"],"n":[1,0,{}]}`, // "a", spelled with an escape
		`{"d":["a"],"n":[+1,0,{}]}`,
		`{"d":["a"],"n":[01,0,{}]}`,
		`{"d":["a"],"n":[1,0,{"x":1}]}`,
		`{"d":["a","b"],"n":[1,0,{}]}`,
		`{"d":["a],"n":[1,0,{}]}`,
		`{"d":[a"],"n":[1,0,{}]}`,
		`{"d":[""],"n":[,0,{}]}`,
		"{\"d\":[\"a\x01\"],\"n\":[1,0,{}]}",
		"{\"d\":[\"a\xff\"],\"n\":[1,0,{}]}",
	} {
		if at, ok := ParseFreshClock([]byte(clock)); ok {
			t.Errorf("ParseFreshClock(%s) = %v, true; want false", clock, at)
		}
	}
}
