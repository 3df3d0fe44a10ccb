package s3remote

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"filippo.io/age"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/drivesync/drivesync"
)

// TestEncryptedStore: two devices sync an encrypted store through a
// bucket; no object in the bucket shows the rows, and every object but
// the marker is an age file.
func TestEncryptedStore(t *testing.T) {
	ctx := context.Background()
	bucket := newBucket(t)
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	key := func(cfg *drivesync.Config) { cfg.Encryption = drivesync.X25519Key(id) }
	a, ea := openDevice(t, newClient(), bucket, Options{Prefix: "secret"}, "dev-a", `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, data BLOB)`, key)
	b, eb := openDevice(t, newClient(), bucket, Options{Prefix: "secret"}, "dev-b", `CREATE TABLE items (id TEXT PRIMARY KEY, title TEXT, data BLOB)`, key)
	if _, err := a.Exec(`INSERT INTO items VALUES ('S3-SECRET-ID', 'S3-SECRET-TITLE', CAST('S3-SECRET-BLOB' AS BLOB))`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(`INSERT INTO items VALUES ('b1', 'S3-SECRET-FROM-B', NULL)`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, e := range []*drivesync.Engine{ea, eb} {
			if _, err := e.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := ea.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	var title string
	if err := b.QueryRow(`SELECT title FROM items WHERE id = 'S3-SECRET-ID'`).Scan(&title); err != nil || title != "S3-SECRET-TITLE" {
		t.Fatalf("b holds %q, %v", title, err)
	}
	client := newClient()
	out, err := client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String("secret/")})
	if err != nil {
		t.Fatal(err)
	}
	sealed := 0
	for _, o := range out.Contents {
		obj, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: o.Key})
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(obj.Body)
		obj.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(body, []byte("S3-SECRET")) {
			t.Errorf("%s holds the row in plain", *o.Key)
		}
		if strings.HasSuffix(*o.Key, ".json.gz") {
			if !bytes.HasPrefix(body, []byte("age-encryption.org/v1\n")) {
				t.Errorf("%s is not an age file", *o.Key)
			}
			sealed++
		}
	}
	if sealed < 3 {
		t.Fatalf("%d encrypted objects of %d, want the patch files and the snapshot", sealed, len(out.Contents))
	}
}
