package drivesync

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"
)

// A MemoryRemote is a Remote that keeps its files in memory, for tests and
// examples. Several engines given the same MemoryRemote behave like devices
// sharing one drive. It follows the same contract and name rules as the
// real remotes, so code that works against it works against them.
//
// Unlike FolderRemote, List honours since exactly, by the MemoryRemote's own
// clock, which SetClock lets a test move.
//
// The zero value is an empty remote using time.Now. A MemoryRemote is safe
// for concurrent use.
type MemoryRemote struct {
	mu    sync.Mutex
	now   func() time.Time
	files map[string]memoryFile
	id    string // see Identity; "" until asked
}

type memoryFile struct {
	data    []byte // never modified once stored, so readers may share it
	created time.Time
}

var _ IdentifiedRemote = (*MemoryRemote)(nil)

// NewMemoryRemote returns an empty MemoryRemote using time.Now as its clock.
func NewMemoryRemote() *MemoryRemote {
	return &MemoryRemote{}
}

// SetClock makes now the remote's clock, used by Now and to stamp the files
// Create stores, so a test can simulate a remote whose clock differs from the
// device's, or step time without sleeping. A nil now restores time.Now.
func (m *MemoryRemote) SetClock(now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = now
}

// clock reads the current clock. It calls it without holding m.mu so that a
// test's clock function may itself use the remote.
func (m *MemoryRemote) clock() time.Time {
	m.mu.Lock()
	now := m.now
	m.mu.Unlock()
	if now == nil {
		return time.Now().UTC()
	}
	return now()
}

// List returns the files created at or after since by the remote's clock.
func (m *MemoryRemote) List(ctx context.Context, since time.Time) ([]RemoteFile, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory remote: list: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var files []RemoteFile
	for name, f := range m.files {
		if !f.created.Before(since) {
			files = append(files, RemoteFile{Name: name, Size: int64(len(f.data))})
		}
	}
	return files, nil
}

// Open returns a reader over the named file's content.
func (m *MemoryRemote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := checkRemoteName(name); err != nil {
		return nil, fmt.Errorf("memory remote: open: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memory remote: open %s: %w", name, err)
	}
	m.mu.Lock()
	f, ok := m.files[name]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("memory remote: open %s: %w", name, fs.ErrNotExist)
	}
	return io.NopCloser(bytes.NewReader(f.data)), nil
}

// Create stores a copy of content, stamped with the remote's clock. Content
// is read in full before the file appears, so no reader sees it half-written.
func (m *MemoryRemote) Create(ctx context.Context, name string, content io.Reader) error {
	if err := checkRemoteName(name); err != nil {
		return fmt.Errorf("memory remote: create: %w", err)
	}
	var buf bytes.Buffer
	if err := copyWithContext(ctx, &buf, content); err != nil {
		return fmt.Errorf("memory remote: create %s: %w", name, err)
	}
	created := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[name]; ok {
		return fmt.Errorf("memory remote: create %s: %w", name, fs.ErrExist)
	}
	if m.files == nil {
		m.files = make(map[string]memoryFile)
	}
	m.files[name] = memoryFile{data: buf.Bytes(), created: created}
	return nil
}

// Delete removes the named file.
func (m *MemoryRemote) Delete(ctx context.Context, name string) error {
	if err := checkRemoteName(name); err != nil {
		return fmt.Errorf("memory remote: delete: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory remote: delete %s: %w", name, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.files, name)
	return nil
}

// Identity returns an id drawn at random for this MemoryRemote: every
// MemoryRemote is a storage of its own.
func (m *MemoryRemote) Identity(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("memory remote: identity: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.id == "" {
		m.id = "memory:" + rand.Text()
	}
	return m.id, nil
}

// Now returns the remote's clock, as set by SetClock.
func (m *MemoryRemote) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, fmt.Errorf("memory remote: now: %w", err)
	}
	return m.clock(), nil
}
