package remotetest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/remotetest"
)

// The suite is only as good as the faults it finds. Each fault below breaks
// one promise of the contract on top of a MemoryRemote; TestSuiteFindsFaults
// runs the suite against it in a child process (a failing suite fails its
// test, which this process must not) and checks that the subtests meant to
// catch the fault fail.

// faultEnv names the fault that TestFaultyRemote injects.
const faultEnv = "REMOTETEST_FAULT"

// A fault is a way for a Remote to break the contract.
type fault struct {
	breakRemote func(m *drivesync.MemoryRemote) *faultyRemote
	caughtBy    []string // subtests that must fail
}

var faults = map[string]fault{
	// Create replaces an existing file instead of refusing the name.
	"overwrites": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, create: func(ctx context.Context, name string, content io.Reader) error {
				m.Delete(ctx, name)
				return m.Create(ctx, name, content)
			}}
		},
		caughtBy: []string{"CreateExisting"},
	},
	// Create writes under the final name as the content arrives, and
	// keeps what it got when the content fails.
	"writes in place": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, create: func(ctx context.Context, name string, content io.Reader) error {
				if _, err := m.Open(ctx, name); err == nil {
					return m.Create(ctx, name, content) // the file's error
				}
				var written []byte
				buf := make([]byte, 64<<10)
				for {
					n, err := content.Read(buf)
					if n > 0 {
						written = append(written, buf[:n]...)
						m.Delete(ctx, name)
						if err := m.Create(ctx, name, bytes.NewReader(written)); err != nil {
							return err
						}
					}
					if err == io.EOF {
						return nil
					}
					if err != nil {
						return err
					}
				}
			}}
		},
		caughtBy: []string{"HiddenWhileWriting", "CreateReaderFails"},
	},
	// Create drops the data a reader returns together with io.EOF.
	"drops data with EOF": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, create: func(ctx context.Context, name string, content io.Reader) error {
				var stored []byte
				buf := make([]byte, 64<<10)
				for {
					n, err := content.Read(buf)
					if err == io.EOF {
						break
					}
					if err != nil {
						return err
					}
					stored = append(stored, buf[:n]...)
				}
				return m.Create(ctx, name, bytes.NewReader(stored))
			}}
		},
		caughtBy: []string{"CreateReaders"},
	},
	// Create stores what it read of content that can seek up to the
	// first read error, as a client does that sizes the content by
	// seeking, then streams it and ends the body well-formed at an error.
	"ends seekable content at an error": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, create: func(ctx context.Context, name string, content io.Reader) error {
				if _, ok := content.(io.Seeker); !ok {
					return m.Create(ctx, name, content)
				}
				var stored []byte
				buf := make([]byte, 64<<10)
				for {
					n, err := content.Read(buf)
					stored = append(stored, buf[:n]...)
					if err != nil {
						break
					}
				}
				return m.Create(ctx, name, bytes.NewReader(stored))
			}}
		},
		caughtBy: []string{"CreateSeekerFails"},
	},
	// Every method ignores its context.
	"ignores the context": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			bg := context.Background()
			return &faultyRemote{
				MemoryRemote: m,
				list: func(_ context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
					return m.List(bg, since)
				},
				open:     func(_ context.Context, name string) (io.ReadCloser, error) { return m.Open(bg, name) },
				create:   func(_ context.Context, name string, content io.Reader) error { return m.Create(bg, name, content) },
				delete:   func(_ context.Context, name string) error { return m.Delete(bg, name) },
				now:      func(context.Context) (time.Time, error) { return m.Now(bg) },
				identity: func(context.Context) (string, error) { return m.Identity(bg) },
			}
		},
		caughtBy: []string{"CancelledContext", "DeadlineExceeded", "CancelDuringCreate"},
	},
	// Now reports any done context as cancelled.
	"reports deadlines as cancellations": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, now: func(ctx context.Context) (time.Time, error) {
				if ctx.Err() != nil {
					return time.Time{}, context.Canceled
				}
				return m.Now(ctx)
			}}
		},
		caughtBy: []string{"DeadlineExceeded"},
	},
	// List reads since's wall clock as if it were UTC.
	"ignores since's time zone": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, list: func(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
				if !since.IsZero() {
					since = time.Date(since.Year(), since.Month(), since.Day(), since.Hour(), since.Minute(), since.Second(), since.Nanosecond(), time.UTC)
				}
				return m.List(ctx, since)
			}}
		},
		caughtBy: []string{"ListSince"},
	},
	// List returns absolute names.
	"lists absolute names": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, list: func(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
				files, err := m.List(ctx, since)
				for i := range files {
					files[i].Name = "/" + files[i].Name
				}
				return files, err
			}}
		},
		caughtBy: []string{"ListAll", "NestedNames"},
	},
	// Now reads Unix seconds as milliseconds.
	"clock in the wrong unit": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, now: func(ctx context.Context) (time.Time, error) {
				at, err := m.Now(ctx)
				return time.UnixMilli(at.Unix()).UTC(), err
			}}
		},
		caughtBy: []string{"Now"},
	},
	// Delete only hides a file, whose name stays taken.
	"keeps deleted names": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			var trash sync.Map // names deleted
			return &faultyRemote{
				MemoryRemote: m,
				create: func(ctx context.Context, name string, content io.Reader) error {
					if _, ok := trash.Load(name); ok {
						return fs.ErrExist
					}
					return m.Create(ctx, name, content)
				},
				delete: func(ctx context.Context, name string) error {
					trash.Store(name, true)
					return m.Delete(ctx, name)
				},
			}
		},
		caughtBy: []string{"Delete"},
	},
	// Identity changes on every call.
	"unstable identity": {
		breakRemote: func(m *drivesync.MemoryRemote) *faultyRemote {
			return &faultyRemote{MemoryRemote: m, identity: func(ctx context.Context) (string, error) {
				return "memory:" + rand.Text(), ctx.Err()
			}}
		},
		caughtBy: []string{"Identity", "Concurrent"},
	},
}

// A faultyRemote is a MemoryRemote with some methods replaced.
type faultyRemote struct {
	*drivesync.MemoryRemote
	list     func(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error)
	open     func(ctx context.Context, name string) (io.ReadCloser, error)
	create   func(ctx context.Context, name string, content io.Reader) error
	delete   func(ctx context.Context, name string) error
	now      func(ctx context.Context) (time.Time, error)
	identity func(ctx context.Context) (string, error)
}

func (f *faultyRemote) List(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
	if f.list != nil {
		return f.list(ctx, since)
	}
	return f.MemoryRemote.List(ctx, since)
}

func (f *faultyRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if f.open != nil {
		return f.open(ctx, name)
	}
	return f.MemoryRemote.Open(ctx, name)
}

func (f *faultyRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if f.create != nil {
		return f.create(ctx, name, content)
	}
	return f.MemoryRemote.Create(ctx, name, content)
}

func (f *faultyRemote) Delete(ctx context.Context, name string) error {
	if f.delete != nil {
		return f.delete(ctx, name)
	}
	return f.MemoryRemote.Delete(ctx, name)
}

func (f *faultyRemote) Now(ctx context.Context) (time.Time, error) {
	if f.now != nil {
		return f.now(ctx)
	}
	return f.MemoryRemote.Now(ctx)
}

func (f *faultyRemote) Identity(ctx context.Context) (string, error) {
	if f.identity != nil {
		return f.identity(ctx)
	}
	return f.MemoryRemote.Identity(ctx)
}

// TestFaultyRemote runs the suite against the Remote with the fault that
// faultEnv names. It is meant to fail; TestSuiteFindsFaults runs it.
func TestFaultyRemote(t *testing.T) {
	f, ok := faults[os.Getenv(faultEnv)]
	if !ok {
		t.Skip("run by TestSuiteFindsFaults, which sets " + faultEnv)
	}
	remotetest.Run(t, func(t *testing.T) drivesync.Remote {
		return f.breakRemote(drivesync.NewMemoryRemote())
	})
}

func TestSuiteFindsFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite once per fault")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("cannot run the test binary again: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(faults)) {
		f := faults[name]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(exe,
				"-test.run=^TestFaultyRemote$/^("+strings.Join(f.caughtBy, "|")+")$",
				"-test.count=1", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), faultEnv+"="+name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatalf("running the suite: %v\n%s", err, out)
			}
			if err == nil {
				t.Fatalf("the suite passed a Remote that %s; want %v to fail\n%s", name, f.caughtBy, out)
			}
			for _, sub := range f.caughtBy {
				if !bytes.Contains(out, []byte("--- FAIL: TestFaultyRemote/"+sub+" (")) {
					t.Errorf("subtest %s passed a Remote that %s, want it to fail\n%s", sub, name, out)
				}
			}
			if testing.Verbose() {
				t.Logf("%s", out)
			}
		})
	}
}
