package drivesync_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/drivesync/drivesync"
)

// openDevice opens one device's database with the recommended DSN and its
// engine.
func openDevice(dir, name string, remote drivesync.Remote) (*sql.DB, *drivesync.Engine) {
	dsn := "file:" + filepath.Join(dir, name+".db") +
		"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, content JSONB NOT NULL, title TEXT)`); err != nil {
		log.Fatal(err)
	}
	eng, err := drivesync.Open(context.Background(), db, drivesync.Config{
		Remote: remote,
		Tables: []drivesync.Table{{Name: "notes"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	return db, eng
}

// Two devices share a folder; each edits a different field of the same
// note; after they sync, both have both edits.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "drivesync-example")
	defer os.RemoveAll(dir)
	shared := filepath.Join(dir, "shared")
	os.Mkdir(shared, 0o755)
	remote, err := drivesync.NewFolderRemote(shared)
	if err != nil {
		log.Fatal(err)
	}
	laptop, laptopSync := openDevice(dir, "laptop", remote)
	desktop, desktopSync := openDevice(dir, "desktop", remote)
	defer laptop.Close()
	defer desktop.Close()

	laptop.Exec(`INSERT INTO notes (id, content) VALUES ('n1', jsonb('{"title":"groceries","body":"milk"}'))`)
	laptopSync.Sync(ctx)
	desktopSync.Sync(ctx)

	laptop.Exec(`UPDATE notes SET content = jsonb_set(content, '$.body', 'milk, eggs') WHERE id = 'n1'`)
	desktop.Exec(`UPDATE notes SET content = jsonb_set(content, '$.title', 'shopping') WHERE id = 'n1'`)
	laptopSync.Sync(ctx)
	r, _ := desktopSync.Sync(ctx) // receives the laptop's edit, sends its own
	fmt.Println("desktop received", r.ChangesReceived, "sent", r.ChangesSent)
	laptopSync.Sync(ctx)

	for _, db := range []*sql.DB{laptop, desktop} {
		var content, title string
		db.QueryRow(`SELECT json(content), title FROM notes WHERE id = 'n1'`).Scan(&content, &title)
		fmt.Println(content, "| title column:", title)
	}
	// Output:
	// desktop received 1 sent 1
	// {"body":"milk, eggs","title":"shopping"} | title column: shopping
	// {"body":"milk, eggs","title":"shopping"} | title column: shopping
}
