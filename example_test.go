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

// A row of an ordinary table, whose key has three columns, edited on two
// devices at once. The device whose values lost finds them in the
// conflict log: the row's key as Go values, which select the row, and
// each column's two values decoded from the engine's typed JSON.
func ExampleEngine_Conflicts_ordinaryTable() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "drivesync-example")
	defer os.RemoveAll(dir)
	remote := drivesync.NewMemoryRemote()
	open := func(name string) (*sql.DB, *drivesync.Engine) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, name+".db")+
			"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_txlock=immediate")
		if err != nil {
			log.Fatal(err)
		}
		if _, err := db.Exec(`CREATE TABLE readings (sensor BLOB NOT NULL, label TEXT NOT NULL, day INTEGER NOT NULL,
			value REAL, photo BLOB, PRIMARY KEY (sensor, label, day))`); err != nil {
			log.Fatal(err)
		}
		eng, err := drivesync.Open(ctx, db, drivesync.Config{Remote: remote, Tables: []drivesync.Table{{Name: "readings"}}})
		if err != nil {
			log.Fatal(err)
		}
		return db, eng
	}
	laptop, laptopSync := open("laptop")
	phone, phoneSync := open("phone")
	defer laptop.Close()
	defer phone.Close()
	sync := func(engines ...*drivesync.Engine) {
		for _, eng := range engines {
			if _, err := eng.Sync(ctx); err != nil {
				log.Fatal(err)
			}
		}
	}

	laptop.Exec(`INSERT INTO readings VALUES (X'00FF', 'it''s "day", 1', -7, 20.5, X'01')`)
	sync(laptopSync, phoneSync)
	// Both change the same columns before syncing; the phone syncs later
	// and wins. (9e999 is SQLite's +Inf.)
	laptop.Exec(`UPDATE readings SET value = 9e999, photo = X'AAAA'`)
	phone.Exec(`UPDATE readings SET value = NULL, photo = X'BB'`)
	sync(laptopSync, phoneSync, laptopSync)

	cs, err := laptopSync.Conflicts(ctx, drivesync.ConflictFilter{Table: "readings"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("record:", cs[0].Record)
	for i, v := range cs[0].Key {
		fmt.Printf("key %d: %T %#v\n", i, v, v)
	}
	for _, c := range cs {
		mine, err := drivesync.DecodeColumnValue(c.Loser)
		if err != nil {
			log.Fatal(err)
		}
		theirs, err := drivesync.DecodeColumnValue(c.Winner)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: yours %s = %#v, theirs %s = %#v\n", c.Path[0], c.Loser, mine, c.Winner, theirs)
	}
	var value, photo string
	err = laptop.QueryRow(`SELECT quote(value), quote(photo) FROM readings WHERE sensor = ? AND label = ? AND day = ?`, cs[0].Key...).Scan(&value, &photo)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("the laptop's row now holds value", value, "and photo", photo)
	// Output:
	// record: X'00FF','it''s "day", 1',-7
	// key 0: []uint8 []byte{0x0, 0xff}
	// key 1: string "it's \"day\", 1"
	// key 2: int64 -7
	// value: yours ["real","inf"] = +Inf, theirs ["null"] = <nil>
	// photo: yours ["blob","qqo="] = []byte{0xaa, 0xaa}, theirs ["blob","uw=="] = []byte{0xbb}
	// the laptop's row now holds value NULL and photo X'BB'
}
