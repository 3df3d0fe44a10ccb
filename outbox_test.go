package drivesync

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"google.golang.org/api/googleapi"

	"github.com/drivesync/drivesync/internal/drivefake"
)

// TestOutboxRecoveryRetriedOverDrive: an upload whose retries all failed
// stays in the outbox, and the sync's error still names Drive's answer.
// The next sync publishes it from the outbox, and a 503 and a 429 on that
// upload are retried like any other upload's.
func TestOutboxRecoveryRetriedOverDrive(t *testing.T) {
	ctx := context.Background()
	srv := drivefake.New(t)
	a := driveDevice(t, srv, "dev-a")
	a.put("warm", `{"v":0}`)
	a.sync() // the marker and today's folders exist

	a.put("n", `{"v":1}`)
	srv.Fail(drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusServiceUnavailable, Times: 8})
	_, err := a.eng.Sync(ctx)
	var ge *googleapi.Error
	if !errors.Is(err, ErrRemote) || !errors.As(err, &ge) || ge.Code != http.StatusServiceUnavailable {
		t.Fatalf("sync with every upload attempt refused: %v; want ErrRemote carrying Drive's 503", err)
	}
	srv.ClearFaults()

	srv.Fail(
		drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusServiceUnavailable, Times: 1},
		drivefake.Fault{Method: "POST", PathPrefix: "/upload", Status: http.StatusTooManyRequests, RetryAfter: "0", Times: 1},
	)
	r, err := a.eng.Sync(ctx)
	if err != nil || r.Recovered == "" {
		t.Fatalf("recovery sync: %+v, %v; want the outbox published after retries", r, err)
	}
	b := driveDevice(t, srv, "dev-b")
	b.sync()
	if got, want := b.get("n"), `{"v":1}`; got != want {
		t.Fatalf("another device got %q, want %s", got, want)
	}
}

// TestOutboxReaderSeeks: the stored upload reads back the same from any
// position, across chunk boundaries.
func TestOutboxReaderSeeks(t *testing.T) {
	d := newDevice(t, "dev-a", NewMemoryRemote())
	data := make([]byte, 2*outboxChunk+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	conn, err := d.db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for seq := 0; seq*outboxChunk < len(data); seq++ {
		chunk := data[seq*outboxChunk : min((seq+1)*outboxChunk, len(data))]
		if _, err := conn.ExecContext(context.Background(), `INSERT INTO sync_outbox (name, seq, data) VALUES ('f', ?, ?)`, seq, chunk); err != nil {
			t.Fatal(err)
		}
	}
	r := &outboxReader{ctx: context.Background(), q: conn, name: "f"}
	s, _ := any(r).(io.ReadSeeker)
	if s == nil {
		t.Fatal("the outbox reader cannot seek")
	}
	for _, tc := range []struct {
		offset int64
		whence int
		want   int64
	}{
		{0, io.SeekStart, 0},
		{outboxChunk - 1, io.SeekStart, outboxChunk - 1},
		{-10, io.SeekEnd, int64(len(data)) - 10},
		{5, io.SeekCurrent, int64(len(data)) - 5},
		{outboxChunk + 1, io.SeekStart, outboxChunk + 1},
		{0, io.SeekStart, 0},
	} {
		pos, err := s.Seek(tc.offset, tc.whence)
		if err != nil || pos != tc.want {
			t.Fatalf("Seek(%d, %d) = %d, %v; want %d", tc.offset, tc.whence, pos, err, tc.want)
		}
		got, err := io.ReadAll(s)
		if err != nil || !bytes.Equal(got, data[pos:]) {
			t.Fatalf("after Seek(%d, %d): read %d bytes, %v; want the %d bytes from %d", tc.offset, tc.whence, len(got), err, len(data)-int(pos), pos)
		}
		if _, err := s.Seek(tc.want, io.SeekStart); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Seek(-1, io.SeekStart); err == nil {
		t.Fatal("Seek to a negative position succeeded")
	}
}
