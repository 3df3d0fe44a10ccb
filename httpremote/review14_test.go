package httpremote_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/httpremote"
	"github.com/drivesync/drivesync/syncserver"
)

// TestReview14SnapshotOverServerFileLimit: an encrypted store on the
// server, whose devices lowered Limits.MaxFileSize below the server's
// MaxFileBytes as the README asks. Snapshots are bounded by
// MaxSnapshotSize (16 GiB), not MaxFileSize, so once the store's state
// outgrows the server's file limit, the month's snapshot is refused
// (413) at every sync, and every Sync of every device fails from then on.
func TestReview14SnapshotOverServerFileLimit(t *testing.T) {
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC).UnixMicro())
	url, _ := serve(t, "sqlite:"+t.TempDir()+"/s.db", func(o *syncserver.Options) {
		o.MaxFileBytes = 256 << 10
		o.Now = func() time.Time {
			return time.UnixMicro(now.Add(1000)) // a millisecond per reading
		}
	})
	key := x25519Key(t)
	cfg := func(c *drivesync.Config) {
		c.Encryption = key
		c.Limits = drivesync.Limits{MaxFileSize: 128 << 10, MaxExpandedSize: 128 << 10}
	}
	srv := func() *httpremote.Client {
		return httpremote.New(url, aliceToken, httpremote.Options{Store: "big", MinSleep: 1, MaxSleep: 2})
	}
	a := openDevice(t, "a", srv(), cfg)
	b := openDevice(t, "b", srv(), cfg)
	// About 1 MB of data that barely compresses, written in small syncs,
	// each patch file within the limits.
	for i := range 8 {
		for j := range 30 {
			a.exec(fmt.Sprintf(`INSERT INTO notes VALUES ('n%d-%d', json_object('t', hex(randomblob(2000))))`, i, j))
		}
		a.sync()
	}
	b.sync()
	// A new month: the first sync writes the month's snapshot.
	now.Store(time.Date(2026, 2, 2, 12, 0, 0, 0, time.UTC).UnixMicro())
	ctx := context.Background()
	for i := range 3 {
		a.exec(fmt.Sprintf(`INSERT INTO notes VALUES ('later-%d', '{"t":"x"}')`, i))
		if _, err := a.eng.Sync(ctx); err != nil {
			t.Errorf("a's sync %d in the new month: %v", i, err)
		}
		if _, err := b.eng.Sync(ctx); err != nil {
			t.Errorf("b's sync %d in the new month: %v", i, err)
		}
	}
}

// TestReview14JoinMergeFileOverServerFileLimit: a device whose records
// outgrow the server's file limit joins another store on the server
// (JoinRemote, after ErrRemoteChanged). Its merge file, bounded only by
// MaxSnapshotSize, was refused (413) at every sync as a remote failure,
// "try again later", and its records never reached the store. Now the
// sync says the server's file limit is too small for the store's
// (ErrFileTooLarge, naming MaxFileBytes and MaxSnapshotSize); nothing of
// the device's is lost, and once the server's limit is raised the join
// completes.
func TestReview14JoinMergeFileOverServerFileLimit(t *testing.T) {
	st, err := syncserver.Open(context.Background(), "sqlite:"+t.TempDir()+"/s.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tokens := map[string]string{aliceToken: "alice"}
	var h atomic.Pointer[syncserver.Handler]
	h.Store(syncserver.NewHandler(st, syncserver.Options{Tokens: tokens, MaxFileBytes: 256 << 10}))
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.Load().ServeHTTP(w, r) }))
	t.Cleanup(ts.Close)
	key := x25519Key(t)
	cfg := func(c *drivesync.Config) {
		c.Encryption = key
		c.Limits = drivesync.Limits{MaxFileSize: 128 << 10, MaxExpandedSize: 128 << 10}
	}
	client := func(store string) *httpremote.Client {
		return httpremote.New(ts.URL, aliceToken, httpremote.Options{Store: store, MinSleep: 1, MaxSleep: 2})
	}
	other := openDevice(t, "other", client("target"), cfg)
	other.exec(`INSERT INTO notes VALUES ('o', '{"t":"x"}')`)
	other.sync()

	d := openDevice(t, "d", client("old"), cfg)
	for i := range 8 {
		for j := range 30 {
			d.exec(fmt.Sprintf(`INSERT INTO notes VALUES ('n%d-%d', json_object('t', hex(randomblob(2000))))`, i, j))
		}
		d.sync()
	}
	d.eng.Close()
	eng, err := drivesync.Open(context.Background(), d.db, drivesync.Config{Server: client("target"), DeviceID: "d", Encryption: key,
		Tables: []drivesync.Table{{Name: "notes"}, {Name: "items", UniqueIntegerKey: true}}})
	if err != nil {
		t.Fatal(err)
	}
	d2 := &device{t: t, db: d.db, eng: eng}
	ctx := context.Background()
	if _, err := d2.eng.Sync(ctx); err == nil {
		t.Fatal("sync against another store: no error")
	}
	if err := d2.eng.JoinRemote(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = d2.eng.Sync(ctx)
	if !errors.Is(err, drivesync.ErrFileTooLarge) || !strings.Contains(err.Error(), "MaxFileBytes") || !strings.Contains(err.Error(), "MaxSnapshotSize") {
		t.Fatalf("the merge file over the server's limit: got %v, want ErrFileTooLarge naming MaxFileBytes and MaxSnapshotSize", err)
	}
	var n int
	d.db.QueryRow(`SELECT count(*) FROM notes`).Scan(&n)
	if n != 241 {
		t.Fatalf("d holds %d notes after the refused merge file, want its 240 and the store's", n)
	}
	// The server's limit raised: the join completes.
	h.Store(syncserver.NewHandler(st, syncserver.Options{Tokens: tokens}))
	if _, err := d2.eng.Sync(ctx); err != nil {
		t.Fatalf("d's sync after the server's limit was raised: %v", err)
	}
	other.sync()
	other.db.QueryRow(`SELECT count(*) FROM notes`).Scan(&n)
	if n != 241 {
		t.Errorf("the store's other device holds %d notes, want 241", n)
	}
}
