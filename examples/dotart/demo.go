package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/drivesync/drivesync"
)

// world is one user's three devices syncing through a shared folder, and
// another person's device, which only shows QR payloads.
type world struct {
	devs  [3]*app
	names [3]string
	other *app
}

func newWorld(ctx context.Context, dir string) (*world, error) {
	for _, folder := range []string{"shared", "theirs"} {
		if err := os.Mkdir(filepath.Join(dir, folder), 0o755); err != nil {
			return nil, err
		}
	}
	shared, err := drivesync.NewFolderRemote(filepath.Join(dir, "shared"))
	if err != nil {
		return nil, err
	}
	w := &world{names: [3]string{"laptop", "phone", "tablet"}}
	for i, name := range w.names {
		if w.devs[i], err = openApp(ctx, filepath.Join(dir, name+".db"), shared, name); err != nil {
			return nil, err
		}
	}
	// The other person syncs their own devices elsewhere.
	theirs, err := drivesync.NewFolderRemote(filepath.Join(dir, "theirs"))
	if err != nil {
		return nil, err
	}
	w.other, err = openApp(ctx, filepath.Join(dir, "friend.db"), theirs, "friend")
	return w, err
}

func (w *world) Close() {
	for _, a := range w.devs {
		if a != nil {
			a.Close()
		}
	}
	if w.other != nil {
		w.other.Close()
	}
}

// syncAll syncs the user's devices until none receives anything new.
func (w *world) syncAll(ctx context.Context) error {
	for range 4 {
		moved := false
		for i, a := range w.devs {
			r, err := a.engine.Sync(ctx)
			if err != nil {
				return fmt.Errorf("%s: sync: %w", w.names[i], err)
			}
			if len(r.Unwritten) > 0 {
				return fmt.Errorf("%s: rows not written: %v", w.names[i], r.Unwritten)
			}
			moved = moved || len(r.Downloaded) > 0 || r.Uploaded != ""
		}
		if !moved {
			return nil
		}
	}
	return errors.New("the devices did not settle")
}

// step is one row of the app's scenario table: what one device does.
type step struct {
	name string
	run  func(ctx context.Context, w *world, s *scenarioState) (string, error)
}

// scenarioState carries the pictures the scenario makes.
type scenarioState struct {
	a, b         string // the user's picture, the other person's
	five, six    string // the other person's payloads of b at generations 5 and 6
	forgedFive   string // a payload of b at generation 5 with other pixels
	refusedError error  // what scanning the forged payload returned
}

// scenario is the app's scenario table: New, Edit, Scan (new, update,
// existing, conflict), Show, Delete, each on one of the user's devices,
// all of them syncing after each.
var scenario = []step{
	{"New (laptop draws a picture)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		var err error
		s.a, err = w.devs[0].create(ctx, "my first")
		return s.a, err
	}},
	{"Edit (phone saves an edit)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		gen, err := w.devs[1].edit(ctx, s.a)
		return fmt.Sprintf("generation %d", gen), err
	}},
	{"Scan, new (tablet scans a friend's picture at generation 5)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		var err error
		if s.b, err = w.other.create(ctx, ""); err != nil {
			return "", err
		}
		for range 5 {
			if _, err := w.other.edit(ctx, s.b); err != nil {
				return "", err
			}
		}
		if s.five, err = w.other.show(ctx, s.b); err != nil {
			return "", err
		}
		if _, err := w.other.edit(ctx, s.b); err != nil {
			return "", err
		}
		if s.six, err = w.other.show(ctx, s.b); err != nil {
			return "", err
		}
		d, _ := parsePayload(s.five)
		d.pixels[0] ^= 1
		s.forgedFive = d.payload()
		return w.devs[2].scan(ctx, s.five)
	}},
	{"Scan, update (laptop scans generation 6)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		return w.devs[0].scan(ctx, s.six)
	}},
	{"Scan, existing (phone scans generation 5 again)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		return w.devs[1].scan(ctx, s.five)
	}},
	{"Scan, conflict (tablet scans a different picture as generation 5)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		_, err := w.devs[2].scan(ctx, s.forgedFive)
		if !errors.Is(err, errConflict) {
			return "", fmt.Errorf("a forged payload was taken: %v", err)
		}
		s.refusedError = err
		return "refused: " + err.Error(), nil
	}},
	{"Show (laptop shows its picture)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		payload, err := w.devs[0].show(ctx, s.a)
		if len(payload) > 40 {
			payload = payload[:40] + "…"
		}
		return payload, err
	}},
	{"Delete (phone deletes its picture)", func(ctx context.Context, w *world, s *scenarioState) (string, error) {
		return "", w.devs[1].remove(ctx, s.a)
	}},
}

// demo plays the scenario on three devices in a temporary folder, syncing
// after each step, and prints what every device holds.
func demo(ctx context.Context, out io.Writer) error {
	dir, err := os.MkdirTemp("", "dotart-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	w, err := newWorld(ctx, dir)
	if err != nil {
		return err
	}
	defer w.Close()
	var s scenarioState
	for _, st := range scenario {
		result, err := st.run(ctx, w, &s)
		if err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		fmt.Fprintf(out, "== %s: %s\n", st.name, result)
		if err := w.syncAll(ctx); err != nil {
			return err
		}
		for i, a := range w.devs {
			items, err := a.list(ctx)
			if err != nil {
				return err
			}
			var logs int
			a.db.QueryRowContext(ctx, `SELECT count(*) FROM action_logs`).Scan(&logs)
			fmt.Fprintf(out, "   %-7s %d picture(s), %d log entr(ies)\n", w.names[i], len(items), logs)
			for _, it := range items {
				fmt.Fprintf(out, "           %s\n", strings.TrimSpace(it))
			}
		}
	}
	names := map[string]string{s.a: "A", s.b: "B"}
	want, err := w.devs[0].summary(ctx, names)
	if err != nil {
		return err
	}
	for i, a := range w.devs[1:] {
		got, err := a.summary(ctx, names)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s holds\n%s\nand %s\n%s", w.names[i+1], got, w.names[0], want)
		}
	}
	fmt.Fprintf(out, "all three devices hold the same generations, instances and log (A is the user's picture, B the friend's):\n%s", want)
	return nil
}

// summary is what a device holds, in the scenario table's terms, with the
// pictures' uuids as given names: its generations, its instances and its
// log.
func (a *app) summary(ctx context.Context, names map[string]string) (string, error) {
	var b strings.Builder
	for _, q := range []string{
		`SELECT 'dot ' || uuid || ' ' || gen FROM dots ORDER BY 1`,
		`SELECT 'instance ' || uuid || ' gen ' || current_gen || CASE WHEN is_owner THEN ' mine' ELSE ' scanned' END || CASE WHEN deleted_at IS NULL THEN '' ELSE ' deleted' END FROM dot_instances ORDER BY 1`,
		`SELECT 'log ' || action_type || ' ' || dot_uuid || ' ' || dot_gen FROM action_logs ORDER BY 1`,
	} {
		rows, err := a.db.QueryContext(ctx, q)
		if err != nil {
			return "", err
		}
		var lines []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				rows.Close()
				return "", err
			}
			for id, name := range names {
				line = strings.ReplaceAll(line, id, name)
			}
			lines = append(lines, line)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return "", err
		}
		slices.Sort(lines)
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
	}
	return b.String(), nil
}
