package syncserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drivesync/drivesync/internal/pgtest"
)

// BenchmarkLoad: 50 clients, each pushing a batch of 10 rows and then
// pulling what changed since its last pull, 20 rounds each (1,000 pushes,
// 10,000 changes), against a server on loopback. It reports pushes and
// changes applied per second and the latency of pushes and pulls. With
// stores=50 each client syncs a store of its own (50 users); with
// stores=1 all share one store, whose pushes take its lock one at a time.
//
//	go test -run '^$' -bench Load -benchtime 1x ./syncserver
func BenchmarkLoad(b *testing.B) {
	for _, bench := range []struct {
		kind   string
		stores int
	}{{"sqlite", 50}, {"sqlite", 1}, {"postgres", 50}, {"postgres", 1}} {
		kind := bench.kind
		b.Run(fmt.Sprintf("%s/stores=%d", kind, bench.stores), func(b *testing.B) {
			st := openStore(b, pgtest.Spec(b, kind))
			srv := httptest.NewServer(NewHandler(st, Options{Tokens: map[string]string{aliceToken: "alice"}}))
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			const clients, rounds, batch = 50, 20, 10
			var pushes, pulls []time.Duration
			var elapsed time.Duration
			for i := range b.N {
				store := fmt.Sprintf("load-%d", i)
				var mu sync.Mutex
				pushes, pulls = nil, nil
				var failed atomic.Int64
				start := time.Now()
				var wg sync.WaitGroup
				for c := range clients {
					wg.Go(func() {
						store := fmt.Sprintf("%s-%d", store, c%bench.stores)
						since := ""
						for r := range rounds {
							var ops []string
							for j := range batch {
								// Half the rows are new, half edit the
								// client's rows of the round before.
								id := fmt.Sprintf("c%d-r%d-%d", c, r, j)
								if j%2 == 1 && r > 0 {
									id = fmt.Sprintf("c%d-r%d-%d", c, r-1, j)
								}
								ops = append(ops, fmt.Sprintf(`{"id":%q,"title":"round %d","n":%d}`, id, r, j))
							}
							t0 := time.Now()
							if status := send(client, "POST", srv.URL+"/sync/push?store="+store, `{"ops":{"notes":[`+strings.Join(ops, ",")+`]}}`, nil); status != 200 {
								failed.Add(1)
							}
							d := time.Since(t0)
							t0 = time.Now()
							for {
								q := url.Values{"store": {store}, "limit": {"500"}}
								if since != "" {
									q.Set("since", since)
								}
								var page struct {
									NextCursor *string `json:"nextCursor"`
									ServerTime string  `json:"server_time"`
								}
								if status := send(client, "GET", srv.URL+"/sync/pull?"+q.Encode(), "", &page); status != 200 {
									failed.Add(1)
									break
								}
								if page.NextCursor == nil {
									since = page.ServerTime
									break
								}
								since = *page.NextCursor
							}
							mu.Lock()
							pushes = append(pushes, d)
							pulls = append(pulls, time.Since(t0))
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				elapsed = time.Since(start)
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d requests failed", n)
				}
			}
			n := clients * rounds
			b.ReportMetric(float64(n)/elapsed.Seconds(), "pushes/s")
			b.ReportMetric(float64(n*batch)/elapsed.Seconds(), "changes/s")
			b.ReportMetric(ms(percentile(pushes, 50)), "push-p50-ms")
			b.ReportMetric(ms(percentile(pushes, 99)), "push-p99-ms")
			b.ReportMetric(ms(percentile(pulls, 50)), "pull-p50-ms")
			b.ReportMetric(ms(percentile(pulls, 99)), "pull-p99-ms")
		})
	}
}

func send(c *http.Client, method, u, body string, out any) int {
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	res, err := c.Do(req)
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	if out != nil {
		json.NewDecoder(res.Body).Decode(out)
	} else {
		var sink json.RawMessage
		json.NewDecoder(res.Body).Decode(&sink)
	}
	return res.StatusCode
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkPullMemory pulls a whole store of 10,000 records and one of
// 100,000, page by page, and reports the server's peak heap during each
// pull and their ratio: pulls read a page at a time, so the heap must
// stay flat as the store grows tenfold.
func BenchmarkPullMemory(b *testing.B) {
	for _, kind := range pgtest.Kinds {
		b.Run(kind, func(b *testing.B) {
			st := openStore(b, pgtest.Spec(b, kind))
			srv := httptest.NewServer(NewHandler(st, Options{Tokens: map[string]string{aliceToken: "alice"}}))
			defer srv.Close()
			client := &http.Client{}
			body := strings.Repeat("x", 200)
			fill := func(store string, n int) {
				for i := 0; i < n; i += 1000 {
					var ops []string
					for j := i; j < i+1000 && j < n; j++ {
						ops = append(ops, fmt.Sprintf(`{"id":"r%07d","body":%q}`, j, body))
					}
					if status := send(client, "POST", srv.URL+"/sync/push?store="+store, `{"ops":{"notes":[`+strings.Join(ops, ",")+`]}}`, nil); status != 200 {
						b.Fatalf("push: %d", status)
					}
				}
			}
			fill("small", 10_000)
			fill("large", 100_000)
			peak := func(store string) (uint64, int) {
				runtime.GC()
				var base runtime.MemStats
				runtime.ReadMemStats(&base)
				var top atomic.Uint64
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					var m runtime.MemStats
					for {
						runtime.ReadMemStats(&m)
						if m.HeapInuse > top.Load() {
							top.Store(m.HeapInuse)
						}
						select {
						case <-stop:
							return
						case <-time.After(time.Millisecond):
						}
					}
				}()
				records, since := 0, ""
				for {
					q := url.Values{"store": {store}, "limit": {"1000"}}
					if since != "" {
						q.Set("since", since)
					}
					var page struct {
						Changes    map[string][]json.RawMessage
						NextCursor *string `json:"nextCursor"`
					}
					if status := send(client, "GET", srv.URL+"/sync/pull?"+q.Encode(), "", &page); status != 200 {
						b.Fatalf("pull: %d", status)
					}
					records += len(page.Changes["notes"])
					if page.NextCursor == nil {
						break
					}
					since = *page.NextCursor
				}
				close(stop)
				<-done
				return top.Load() - min(top.Load(), base.HeapInuse), records
			}
			var small, large uint64
			for range b.N {
				var n int
				if small, n = peak("small"); n != 10_000 {
					b.Fatalf("pulled %d of 10000", n)
				}
				if large, n = peak("large"); n != 100_000 {
					b.Fatalf("pulled %d of 100000", n)
				}
			}
			b.ReportMetric(float64(small)/(1<<20), "heap-10k-MiB")
			b.ReportMetric(float64(large)/(1<<20), "heap-100k-MiB")
			b.ReportMetric(float64(large)/float64(max(small, 1)), "heap-ratio")
		})
	}
}
