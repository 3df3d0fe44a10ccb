// Package sqliteerr reads SQLite result codes out of the errors that
// database/sql drivers for SQLite return, without importing any driver:
// the app chooses the driver, and each spells the code differently.
//
//   - modernc.org/sqlite: *Error with a method Code() int holding the
//     extended code;
//   - github.com/mattn/go-sqlite3: Error, a struct with the fields
//     Code ErrNo (primary) and ExtendedCode ErrNoExtended;
//   - github.com/ncruces/go-sqlite3: *Error with the methods
//     Code() ErrorCode and ExtendedCode() ExtendedErrorCode, or a bare
//     ExtendedErrorCode (which has Code()) or ErrorCode (which has
//     ExtendedCode()) when SQLite gave no message of its own, sometimes
//     inside an errors.Join.
//
// What they share is a method or an exported struct field named Code or
// ExtendedCode of some integer type, so that is what Code looks for.
package sqliteerr

import "reflect"

// Primary result codes the engine acts on.
const (
	Busy       = 5  // SQLITE_BUSY: another connection holds the lock
	Locked     = 6  // SQLITE_LOCKED: a conflict inside this connection's shared cache
	ReadOnly   = 8  // SQLITE_READONLY: the connection may not write the database
	Constraint = 19 // SQLITE_CONSTRAINT: a UNIQUE, NOT NULL, CHECK, ... refused the row
)

// codeNames are the method and field names a driver's error may carry
// its result code in, most specific driver convention first. An extended
// code keeps the primary code in its low byte, so either will do.
var codeNames = []string{"Code", "ExtendedCode"}

// Code returns the primary result code of the first error in err's tree
// (walked as [errors.As] walks it, through Unwrap() error and
// Unwrap() []error) that carries one, or -1 if none does.
//
// An error carries a code if it has a method Code() or ExtendedCode()
// without arguments returning an integer type, or is a struct (or a
// pointer to one) with an exported integer field of one of those names.
// An error that is itself an integer, such as syscall.Errno, is not taken
// for a result code: errno 5 is EIO, not SQLITE_BUSY. Pass only errors
// from database/sql calls: other libraries' errors have Code fields of
// their own (an HTTP status, say).
func Code(err error) int {
	for err != nil {
		if c, ok := ownCode(err); ok {
			return int(c & 0xff)
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if c := Code(e); c >= 0 {
					return c
				}
			}
			return -1
		default:
			return -1
		}
	}
	return -1
}

// IsBusy reports SQLITE_BUSY or SQLITE_LOCKED, extended codes included:
// the database is locked by another connection and the operation may be
// tried again.
func IsBusy(err error) bool {
	c := Code(err)
	return c == Busy || c == Locked
}

// IsReadOnly reports SQLITE_READONLY, extended codes included: the
// database was opened read-only (mode=ro), or SQLite could not open its
// file for writing and fell back to reading it.
func IsReadOnly(err error) bool { return Code(err) == ReadOnly }

// IsConstraint reports SQLITE_CONSTRAINT, extended codes included.
func IsConstraint(err error) bool { return Code(err) == Constraint }

// ownCode returns the code err itself carries, not looking at what it
// wraps.
func ownCode(err error) (uint64, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return 0, false // its methods could only panic
	}
	for _, name := range codeNames {
		m := v.MethodByName(name)
		if !m.IsValid() {
			continue
		}
		if t := m.Type(); t.NumIn() == 0 && t.NumOut() == 1 && isInteger(t.Out(0).Kind()) {
			return integer(m.Call(nil)[0]), true
		}
	}
	s := v
	if s.Kind() == reflect.Pointer {
		s = s.Elem()
	}
	if s.Kind() != reflect.Struct {
		return 0, false
	}
	for _, name := range codeNames {
		f, ok := s.Type().FieldByName(name)
		if !ok || !f.IsExported() || !isInteger(f.Type.Kind()) {
			continue
		}
		// A promoted field behind a nil embedded pointer has no value.
		if fv, err := s.FieldByIndexErr(f.Index); err == nil {
			return integer(fv), true
		}
	}
	return 0, false
}

func isInteger(k reflect.Kind) bool {
	return reflect.Int <= k && k <= reflect.Uintptr
}

// integer returns v's bits; the low byte is all that Code keeps, so a
// negative value's sign does not matter.
func integer(v reflect.Value) uint64 {
	if v.CanInt() {
		return uint64(v.Int())
	}
	return v.Uint()
}
