package sqliteerr

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

// The drivers' real errors are tested in internal/drivertest, run by
// internal/drivers/*; these are the edges of Code's contract that no
// driver produces on demand.

type methodCode struct{ code int8 }

func (e *methodCode) Error() string { return "method" }
func (e *methodCode) Code() int8    { return e.code }

type stringCode struct{}

func (stringCode) Error() string { return "string code" }
func (stringCode) Code() string  { return "19" }

type inner struct{ Code int }

type promoted struct{ *inner }

func (promoted) Error() string { return "promoted" }

func TestCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"errno is not a result code", syscall.Errno(5), -1},
		{"wrapped errno", fmt.Errorf("read: %w", syscall.EIO), -1},
		{"nil pointer with a Code method", (*methodCode)(nil), -1},
		{"Code method of a small integer type", &methodCode{code: 19}, 19},
		{"Code method returning a string", stringCode{}, -1},
		{"promoted field behind a nil pointer", promoted{}, -1},
		{"promoted field", promoted{&inner{Code: 2067}}, 19},
		{"first coded error of a join wins", errors.Join(errors.New("x"), &methodCode{code: 5}, &methodCode{code: 19}), 5},
		{"wrapped", fmt.Errorf("x: %w", &methodCode{code: 6}), 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Code(tt.err); got != tt.want {
				t.Errorf("Code(%T %v) = %d, want %d", tt.err, tt.err, got, tt.want)
			}
		})
	}
}
