package syncserver

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// TestMain removes the server binary a test run built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// serverBinary builds cmd/drivesync-server once per test run.
func serverBinary(t testing.TB) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "drivesync-server-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "drivesync-server")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/drivesync-server").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// process is a drivesync-server process.
type process struct {
	cmd *exec.Cmd
	URL string
	log *syncBuffer
}

func freePort(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startProcess runs the server on spec and waits until it answers.
func startProcess(t testing.TB, spec string) *process {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte("# test users\nalice "+aliceToken+"\nbob "+bobToken+"\n"), 0o600)
	addr := freePort(t)
	p := &process{URL: "http://" + addr, log: &syncBuffer{}}
	p.cmd = exec.Command(serverBinary(t), "-addr", addr, "-store", spec, "-tokens", tokens)
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cmd.Process.Kill(); p.cmd.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; {
		res, err := http.Get(p.URL + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start: %v\n%s", err, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *process) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

// A server killed with SIGKILL while clients push loses no acknowledged
// push, and each client's retry with the same key applies exactly once.
func TestKilledMidPush(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		p := startProcess(t, spec)
		const clients = 4
		type pushed struct {
			key, body string
			acked     bool
		}
		var mu sync.Mutex
		var all []pushed
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("c%d-%d", c, i)
					var ops []string
					for j := range 20 {
						ops = append(ops, fmt.Sprintf(`{"id":null,"tempId":"t%d","push":%q}`, j, key))
					}
					body := `{"ops":{"notes":[` + strings.Join(ops, ",") + `]}}`
					r, err := rawPush(p.URL, key, body)
					mu.Lock()
					all = append(all, pushed{key: key, body: body, acked: err == nil && r == 200})
					mu.Unlock()
					if err != nil {
						return // the server is gone: this push is retried below
					}
				}
			})
		}
		// Kill once pushes are being acknowledged, however slow the
		// machine.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			n := len(all)
			mu.Unlock()
			if n >= 3*clients {
				break
			}
		}
		p.kill()
		close(stop)
		wg.Wait()

		q := startProcess(t, spec)
		acked, retried := 0, 0
		for _, x := range all {
			if x.acked {
				acked++
				continue
			}
			retried++
			if r, err := rawPush(q.URL, x.key, x.body); err != nil || r != 200 {
				t.Fatalf("retry of %s: %d %v", x.key, r, err)
			}
		}
		if acked == 0 || retried == 0 {
			t.Fatalf("%d pushes acknowledged and %d cut by the kill: the test needs both", acked, retried)
		}
		// Every push, acknowledged or retried, applied exactly once.
		rows, _ := pullAll(t, q.URL, aliceToken, "default", "", "rows")
		per := map[string]int{}
		for _, row := range rows["notes"] {
			per[row["push"].(string)]++
		}
		for _, x := range all {
			if per[x.key] != 20 {
				t.Errorf("push %s (acknowledged %v): %d records, want 20", x.key, x.acked, per[x.key])
			}
		}
		if len(per) != len(all) {
			t.Errorf("%d pushes in the store, %d sent", len(per), len(all))
		}
		t.Logf("%d pushes acknowledged before the kill, %d retried after it", acked, retried)
	})
}

func rawPush(base, key, body string) (int, error) {
	req, _ := http.NewRequest("POST", base+"/sync/push", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// Two server processes on one PostgreSQL database: the cursor skips
// nothing when pushes and pulls go to either.
func TestCursorTwoProcesses(t *testing.T) {
	spec := storeSpec(t, "postgres")
	a, b := startProcess(t, spec), startProcess(t, spec)
	cursorRace(t, []string{a.URL, b.URL}, 8, 25, 4)
}
