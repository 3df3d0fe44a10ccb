package drivesync

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A store kept below another's root (a folder store inside another's
// folder, an S3 store under a prefix of the bucket's root store) is not
// the outer store's: the outer store's devices list its files, but must
// neither apply them nor, compacting, delete them. Names the engine
// writes sit in the day folder of their time, and only those are taken.
func TestNestedStoreIgnored(t *testing.T) {
	root, outer, inner, _ := nestedSetup(t)
	o := newDevice(t, "dev-o", outer)
	o.sync()
	if got := o.get("x"); got != "" {
		t.Errorf("the outer store's device has %s, a record of the inner store", got)
	}
	o.put("y", `{"v":"outer"}`)
	o.sync()
	if _, err := o.eng.Snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	patches := 0
	filepath.WalkDir(filepath.Join(root, "other"), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), "patch_") {
			patches++
		}
		return nil
	})
	if patches == 0 {
		t.Error("the inner store has no patch file left: the outer store compacted it")
	}
	i2 := newDevice(t, "dev-i2", inner)
	i2.sync()
	if got := i2.get("x"); got != `{"v":"inner"}` {
		t.Errorf("a new device of the inner store has x = %q, want it", got)
	}
	if got := i2.get("y"); got != "" {
		t.Errorf("a new device of the inner store has y = %s, the outer store's", got)
	}
}

// nestedSetup makes a folder store at root with another store nested in
// root/other, whose device dev-i1 wrote record x there. It returns both
// remotes, and the nested file's name as the outer store lists it.
func nestedSetup(t *testing.T) (root string, outer, inner Remote, foreign string) {
	t.Helper()
	root = t.TempDir()
	outer, err := NewFolderRemote(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	inner, err = NewFolderRemote(filepath.Join(root, "other"))
	if err != nil {
		t.Fatal(err)
	}
	i1 := newDevice(t, "dev-i1", inner)
	i1.put("x", `{"v":"inner"}`)
	i1.sync()
	files, err := outer.List(context.Background(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasPrefix(f.Name, "other/") && strings.Contains(f.Name, "/patch_") {
			foreign = f.Name
		}
	}
	if foreign == "" {
		t.Fatal("no nested patch file listed")
	}
	return root, outer, inner, foreign
}
