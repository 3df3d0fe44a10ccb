package syncserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The seed's example push: records created with tempIds, a reference
// between them, and a soft delete; then the initial snapshot and a delta.
func TestSeedPushPull(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		body := `{"ops":{
			"conversations":[{"op":"upsert","id":null,"tempId":"c_tmp1","title":"새 대화","updated_at":"2025-10-12T11:05:00Z"}],
			"messages":[{"op":"upsert","id":null,"tempId":"m_tmp1","conversation_tempId":"c_tmp1","role":"user","text":"hi","updated_at":"2025-10-12T11:05:10Z"}],
			"deletions":[{"table":"messages","id":"m_123","deleted_at":"2025-10-12T09:10:00Z"}]}}`
		r := ts.push(t, aliceToken, "chat", "k-1", body)
		if r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		m := r.json(t)
		checkTimes(t, m, "")
		idMap := m["idMap"].(map[string]any)
		conv, msg := idMap["c_tmp1"].(string), idMap["m_tmp1"].(string)
		if conv == "" || msg == "" || conv == msg {
			t.Fatalf("idMap %v", idMap)
		}
		if m["ok"] != true || m["applied"].(float64) != 3 {
			t.Errorf("response %s", r.body)
		}

		rows, serverTime := pullAll(t, ts.URL, aliceToken, "chat", "", "rows")
		c := rows["conversations"][conv]
		if c["title"] != "새 대화" || c["deleted_at"] != nil {
			t.Errorf("conversation row %v", c)
		}
		mr := rows["messages"][msg]
		if mr["conversation_id"] != conv || mr["text"] != "hi" || mr["conversation_tempId"] != nil {
			t.Errorf("message row %v: the reference should name the conversation's id", mr)
		}
		if d := rows["messages"]["m_123"]; d == nil || d["deleted_at"] == nil {
			t.Errorf("the deletion should be a row with deleted_at set: %v", d)
		}
		// The server's times, not the client's, order the rows.
		if c["updated_at"] == "2025-10-12T11:05:00Z" {
			t.Errorf("updated_at is the client's time: %v", c)
		}

		// A delta after the snapshot holds only what came later.
		if r := ts.push(t, aliceToken, "chat", "k-2", `{"ops":{"messages":[{"op":"upsert","id":"`+msg+`","text":"hello"}]}}`); r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		delta, _ := pullAll(t, ts.URL, aliceToken, "chat", serverTime, "rows")
		if len(delta) != 1 || len(delta["messages"]) != 1 || delta["messages"][msg]["text"] != "hello" || delta["messages"][msg]["role"] != "user" {
			t.Errorf("delta %v: want only the edited message, with its other fields", delta)
		}
		p := ts.pull(t, aliceToken, "store=chat&since="+url.QueryEscape(serverTime))
		checkTimes(t, p.json(t), "")
	})
}

// A push sent again with its key returns the stored response and applies
// nothing twice; the key with another body is refused; concurrent pushes
// with one key apply once.
func TestIdempotency(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		body := `{"ops":{"notes":[{"id":null,"tempId":"t1","title":"one"}]}}`
		first := ts.push(t, aliceToken, "s", "key-1", body)
		if first.status != 200 {
			t.Fatalf("push: %d %s", first.status, first.body)
		}
		again := ts.push(t, aliceToken, "s", "key-1", body)
		if again.status != 200 || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay: %d %q (replayed %q), want the first response %q", again.status, again.body, again.header.Get("Idempotent-Replayed"), first.body)
		}
		rows, _ := pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		if len(rows["notes"]) != 1 {
			t.Errorf("%d notes after a replayed create, want 1", len(rows["notes"]))
		}

		other := ts.push(t, aliceToken, "s", "key-1", `{"ops":{"notes":[{"id":null,"tempId":"t1","title":"two"}]}}`)
		if other.status != 422 || !strings.Contains(other.header.Get("Content-Type"), "problem+json") {
			t.Errorf("same key, other body: %d %s", other.status, other.body)
		}
		if p := other.json(t); p["type"] != problemType("idempotency-key-reused") || p["status"].(float64) != 422 {
			t.Errorf("problem %s", other.body)
		}
		// Keys are the store's: the same key for another store, or
		// another user's, is another push.
		if r := ts.push(t, aliceToken, "s2", "key-1", body); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("same key and body, other store: %d %s", r.status, r.body)
		}
		if r := ts.push(t, bobToken, "s", "key-1", body); r.status != 200 || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("bob's key-1: %d %s", r.status, r.body)
		}

		// Concurrent pushes with one key: one applies, all get its response.
		const n = 12
		var wg sync.WaitGroup
		got := make([]response, n)
		for i := range n {
			wg.Go(func() {
				got[i] = ts.push(t, aliceToken, "s", "key-2", `{"ops":{"notes":[{"id":null,"tempId":"t","title":"c"}]}}`)
			})
		}
		wg.Wait()
		for i, r := range got {
			if r.status != 200 || string(r.body) != string(got[0].body) {
				t.Errorf("concurrent push %d: %d %s, want %s", i, r.status, r.body, got[0].body)
			}
		}
		rows, _ = pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		count := 0
		for _, row := range rows["notes"] {
			if row["title"] == "c" {
				count++
			}
		}
		if count != 1 {
			t.Errorf("%d records from %d concurrent pushes with one key, want 1", count, n)
		}
	})
}

// Keys expire after KeyLifetime: then the same key applies again.
func TestIdempotencyKeyExpires(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		now := time.Now()
		var mu sync.Mutex
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		ts := newServer(t, spec, func(o *Options) { o.Now = clock; o.KeyLifetime = time.Hour })
		body := `{"ops":{"notes":[{"id":null,"tempId":"t1","title":"one"}]}}`
		first := ts.push(t, aliceToken, "s", "k", body)
		mu.Lock()
		now = now.Add(61 * time.Minute)
		mu.Unlock()
		later := ts.push(t, aliceToken, "s", "k", body)
		if first.status != 200 || later.status != 200 || string(first.body) == string(later.body) || later.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("after the key's lifetime: %d %s, then %d %s", first.status, first.body, later.status, later.body)
		}
	})
}

// Pages: limit is bounded, nextCursor leads through every record, and a
// page boundary inside one push's writes loses nothing.
func TestPagination(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		var ops []string
		for i := range 23 {
			ops = append(ops, fmt.Sprintf(`{"id":"r%02d","n":%d}`, i, i))
		}
		if r := ts.push(t, aliceToken, "s", "", `{"ops":{"items":[`+strings.Join(ops, ",")+`]}}`); r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		for _, bad := range []string{"0", "1001", "-1", "x"} {
			r := ts.pull(t, aliceToken, "store=s&limit="+bad)
			if r.status != 400 || !strings.Contains(string(r.body), `"field":"limit"`) {
				t.Errorf("limit=%s: %d %s", bad, r.status, r.body)
			}
		}
		seen := map[string]int{}
		since, pages := "", 0
		for {
			q := "store=s&limit=5"
			if since != "" {
				q += "&since=" + url.QueryEscape(since)
			}
			m := ts.pull(t, aliceToken, q).json(t)
			pages++
			for _, row := range m["changes"].(map[string]any)["items"].([]any) {
				seen[row.(map[string]any)["id"].(string)]++
			}
			if m["nextCursor"] == nil {
				break
			}
			since = m["nextCursor"].(string)
		}
		if len(seen) != 23 || pages != 5 {
			t.Errorf("%d records in %d pages, want 23 in 5", len(seen), pages)
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("%s came %d times", id, n)
			}
		}
	})
}

// Each token reaches only its user's stores.
func TestIsolation(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		r := ts.push(t, aliceToken, "notes", "", `{"ops":{"notes":[{"id":"a1","secret":"alice's"}]}}`)
		if r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		aliceStore := r.json(t)["store"].(string)
		rows, _ := pullAll(t, ts.URL, bobToken, "notes", "", "rows")
		if len(rows) != 0 {
			t.Errorf("bob sees %v in his store of the same name", rows)
		}
		// Naming alice's store by its id is refused, to read or to push.
		for _, r := range []response{
			ts.pull(t, bobToken, "store=notes&store_id="+aliceStore),
			do(t, "POST", ts.URL+"/sync/push?store=notes&store_id="+aliceStore, bobToken, `{"ops":{"notes":[{"id":"a1","secret":"bob's"}]}}`),
		} {
			if r.status != 403 || r.json(t)["type"] != problemType("forbidden") {
				t.Errorf("bob naming alice's store: %d %s", r.status, r.body)
			}
		}
		rows, _ = pullAll(t, ts.URL, aliceToken, "notes", "", "rows")
		if rows["notes"]["a1"]["secret"] != "alice's" {
			t.Errorf("alice's record %v", rows["notes"]["a1"])
		}
		for _, tok := range []string{"", "wrong-token-0123456789", aliceToken + "x"} {
			if r := ts.pull(t, tok, "store=notes"); r.status != 401 || r.header.Get("WWW-Authenticate") == "" {
				t.Errorf("token %q: %d %s", tok, r.status, r.body)
			}
		}
		if strings.Contains(ts.log.String(), aliceToken) || strings.Contains(ts.log.String(), bobToken) {
			t.Errorf("a token is in the log:\n%s", ts.log)
		}
	})
}

// Every wrong input is refused with a Problem Details body naming it, and
// nothing of the push is applied.
func TestValidation(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec, func(o *Options) { o.MaxBodyBytes = 4 << 10 })
		long := strings.Repeat("x", 1025)
		cases := []struct{ body, field string }{
			{`[]`, "body"},
			{`{"ops":{"bad table":[{"id":"x"}]}}`, "ops.bad table"},
			{`{"ops":{"sync_states":[{"id":"x"}]}}`, "ops.sync_states"},
			{`{"ops":{"t":[{"id":"` + long + `"}]}}`, "ops.t[0].id"},
			{`{"ops":{"t":[{"id":7}]}}`, "ops.t[0].id"},
			{`{"ops":{"t":[{"title":"no id"}]}}`, "ops.t[0].id"},
			{`{"ops":{"t":[{"id":"a","updated_at":"yesterday"}]}}`, "ops.t[0].updated_at"},
			{`{"ops":{"t":[{"id":"a","op":"merge"}]}}`, "ops.t[0].op"},
			{`{"ops":{"t":[{"id":"a","ref_tempId":"nope"}]}}`, "ops.t[0].ref_tempId"},
			{`{"ops":{"t":[{"id":"a","drivesync":{"version":0,"device":"d","patch":{}}}]}}`, "ops.t[0].drivesync.version"},
			{`{"ops":{"t":[{"id":"a","drivesync":{"version":5,"device":"bad device","patch":{}}}]}}`, "ops.t[0].drivesync.device"},
			{`{"ops":{"t":[{"id":"a","drivesync":{"version":5,"device":"d"}}]}}`, "ops.t[0].drivesync.patch"},
			{`{"ops":{"t":[{"id":"a","drivesync":{"version":9007199254740993,"device":"d","patch":{}}}]}}`, "ops.t[0].drivesync.version"},
			{`{"ops":{"deletions":[{"table":"t","id":"a","deleted_at":"2025-13-01T00:00:00Z"}]}}`, "ops.deletions[0].deleted_at"},
			{`{"ops":{"deletions":[{"id":"a"}]}}`, "ops.deletions[0].table"},
			{`{"ops":{"t":[{"id":"a"}]},"extra":1}`, "extra"},
			{`{"ops":{"t":[{"id":"a"}]}} {}`, "body"},
			{`{"ops":{"t":[{"id":"a"}]`, "body"},
		}
		for _, c := range cases {
			// The first op of each is valid where possible: nothing of a
			// refused push may apply.
			body := strings.Replace(c.body, `{"ops":{`, `{"ops":{"ok":[{"id":"must-not-exist"}],`, 1)
			if !strings.HasPrefix(c.body, `{"ops":{`) {
				body = c.body
			}
			r := ts.push(t, aliceToken, "s", "", body)
			if r.status != 400 || !strings.Contains(r.header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("%s: %d %s", c.body, r.status, r.body)
				continue
			}
			p := r.json(t)
			errs, _ := p["errors"].([]any)
			if len(errs) != 1 || errs[0].(map[string]any)["field"] != c.field || p["status"].(float64) != 400 || p["detail"] == "" {
				t.Errorf("%s: problem %s, want field %s", c.body, r.body, c.field)
			}
		}
		big := `{"ops":{"t":[{"id":"a","v":"` + strings.Repeat("x", 5<<10) + `"}]}}`
		if r := ts.push(t, aliceToken, "s", "", big); r.status != 413 || r.json(t)["type"] != problemType("body-too-large") {
			t.Errorf("a body over the limit: %d %s", r.status, r.body)
		}
		for q, field := range map[string]string{"since=2025-01-01": "since", "since=nope": "since", "view=all": "view", "store=a/b": "store"} {
			r := ts.pull(t, aliceToken, q)
			if r.status != 400 || !strings.Contains(string(r.body), `"field":"`+field+`"`) {
				t.Errorf("pull %s: %d %s", q, r.status, r.body)
			}
		}
		rows, _ := pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		if len(rows) != 0 {
			t.Errorf("refused pushes applied %v", rows)
		}
	})
}

// Last writer wins per field: a plain client's writes in the server's
// order, an engine's by their stamps, and both together.
func TestLastWriterWins(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		push := func(body string) {
			t.Helper()
			if r := ts.push(t, aliceToken, "s", "", body); r.status != 200 {
				t.Fatalf("push %s: %d %s", body, r.status, r.body)
			}
		}
		push(`{"ops":{"t":[{"id":"a","x":1,"y":1}]}}`)
		push(`{"ops":{"t":[{"id":"a","x":2}]}}`)
		// Two devices edit different fields without seeing each other,
		// and the later-stamped write of one field wins whatever the
		// order of arrival.
		push(`{"ops":{"t":[{"id":"b","drivesync":{"version":7,"device":"dev-a","patch":{"x":"A","z":"A"}}}]}}`)
		push(`{"ops":{"t":[{"id":"b","drivesync":{"version":6,"device":"dev-c","patch":{"y":"C","z":"C"}}}]}}`)
		// A plain write after an engine's is stamped after it.
		push(`{"ops":{"t":[{"id":"b","y":"plain"}]}}`)
		// An engine's write stamped below the plain one loses to it.
		push(`{"ops":{"t":[{"id":"b","drivesync":{"version":8,"device":"dev-c","patch":{"y":"late"}}}]}}`)
		rows, _ := pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		a, b := rows["t"]["a"], rows["t"]["b"]
		if a["x"].(float64) != 2 || a["y"].(float64) != 1 {
			t.Errorf("a = %v, want x 2 (the later write) and y 1", a)
		}
		if b["x"] != "A" || b["z"] != "A" || b["y"] != "plain" {
			t.Errorf("b = %v, want x A, z A (version 7 over 6), y plain", b)
		}
		// Deleted, then written by a plain client: the record comes back
		// whole.
		push(`{"ops":{"deletions":[{"table":"t","id":"a"}]}}`)
		rows, _ = pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		if rows["t"]["a"]["deleted_at"] == nil {
			t.Errorf("a after its deletion: %v", rows["t"]["a"])
		}
		push(`{"ops":{"t":[{"id":"a","y":5}]}}`)
		rows, _ = pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		if a := rows["t"]["a"]; a["deleted_at"] != nil || a["x"].(float64) != 2 || a["y"].(float64) != 5 {
			t.Errorf("a written after its deletion: %v", a)
		}
		// The engine's view carries the state, with every stamp.
		rows, _ = pullAll(t, ts.URL, aliceToken, "s", "", "drivesync")
		ds := rows["t"]["b"]["drivesync"].(map[string]any)
		clock, _ := json.Marshal(ds["clock"])
		if !strings.Contains(string(clock), `"dev-a"`) || !strings.Contains(string(clock), `"server-`) || ds["deleted"] != false {
			t.Errorf("b's state %v", ds)
		}
	})
}

// The trace id of a request's traceparent is in its response's
// traceparent and in its log line; without one, the server starts a
// trace.
func TestTraceparent(t *testing.T) {
	ts := newServer(t, storeSpec(t, "sqlite"))
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	r := do(t, "GET", ts.URL+"/sync/pull?store=s", aliceToken, "", "traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	got := r.header.Get("traceparent")
	if !strings.HasPrefix(got, "00-"+trace+"-") || strings.Contains(got, "00f067aa0ba902b7") || !strings.HasSuffix(got, "-01") {
		t.Errorf("response traceparent %q", got)
	}
	for _, bad := range []string{"", "00-" + strings.Repeat("0", 32) + "-00f067aa0ba902b7-01", "garbage", "00-" + trace + "-00f067aa0ba902b7-01-extra"} {
		r := do(t, "GET", ts.URL+"/sync/pull?store=s", aliceToken, "", "traceparent", bad)
		tp := r.header.Get("traceparent")
		if len(tp) != 55 || strings.Contains(tp, trace) {
			t.Errorf("traceparent %q gave %q, want a new trace", bad, tp)
		}
	}
	r = do(t, "GET", ts.URL+"/sync/pull?store=bad/name", aliceToken, "", "traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
	if r.json(t)["trace_id"] != trace {
		t.Errorf("problem %s lacks the trace id", r.body)
	}
	lines := strings.Split(strings.TrimSpace(ts.log.String()), "\n")
	if len(lines) != 6 {
		t.Errorf("%d log lines for 6 requests:\n%s", len(lines), ts.log)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["trace_id"] == nil || len(m["trace_id"].(string)) != 32 {
			t.Errorf("log line without a trace id: %s", l)
		}
	}
	if !strings.Contains(lines[0], trace) {
		t.Errorf("the first request's log line lacks its trace id: %s", lines[0])
	}
	if r := do(t, "GET", ts.URL+"/healthz", "", ""); r.status != 200 {
		t.Errorf("healthz: %d %s", r.status, r.body)
	}
}

// The cursor never skips a change: pushes commit in any order while
// pulls run, and every puller, following nextCursor and then server_time,
// sees every write.
func TestCursorNeverSkips(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		servers := []string{newServer(t, spec).URL}
		if strings.HasPrefix(spec, "postgres") {
			// Two servers, each with its own connections, on one database.
			servers = append(servers, newServer(t, spec).URL)
		}
		cursorRace(t, servers, 8, 25, 4)
	})
}

// cursorRace runs pushers pushing batches of new records while pullers
// pull, spread over servers, and checks that every puller saw every
// record.
func cursorRace(t *testing.T, servers []string, pushers, pushes, batch int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var pushWG, pullWG sync.WaitGroup
	for p := range pushers {
		pushWG.Go(func() {
			base := servers[p%len(servers)]
			for i := range pushes {
				var ops []string
				for j := range batch {
					ops = append(ops, fmt.Sprintf(`{"id":"p%d-%d-%d","v":%d}`, p, i, j, j))
				}
				if r := do(t, "POST", base+"/sync/push?store=race", aliceToken, `{"ops":{"items":[`+strings.Join(ops, ",")+`]}}`); r.status != 200 {
					t.Errorf("push: %d %s", r.status, r.body)
					return
				}
			}
		})
	}
	const pullers = 4
	seen := make([]map[string]bool, pullers)
	for p := range pullers {
		seen[p] = map[string]bool{}
		pullWG.Go(func() {
			base := servers[(p+1)%len(servers)]
			since := ""
			for round := 0; ; round++ {
				done := ctx.Err() != nil
				// Page through, then keep server_time.
				for {
					q := url.Values{"store": {"race"}, "limit": {"9"}}
					if since != "" {
						q.Set("since", since)
					}
					r := do(t, "GET", base+"/sync/pull?"+q.Encode(), aliceToken, "")
					if r.status != 200 {
						t.Errorf("pull: %d %s", r.status, r.body)
						return
					}
					var m struct {
						Changes    map[string][]map[string]any
						NextCursor *string
						ServerTime string `json:"server_time"`
					}
					json.Unmarshal(r.body, &m)
					for _, row := range m.Changes["items"] {
						seen[p][row["id"].(string)] = true
					}
					if m.NextCursor == nil {
						since = m.ServerTime
						break
					}
					since = *m.NextCursor
				}
				if done {
					return // a last round after every push was acknowledged
				}
			}
		})
	}
	pushWG.Wait()
	cancel()
	pullWG.Wait()
	want := pushers * pushes * batch
	for p, s := range seen {
		if len(s) != want {
			t.Errorf("puller %d saw %d of %d records", p, len(s), want)
		}
	}
}

// A push's answer names the store's clock before and after it: a client
// whose cursor is at the clock before may pull next from the clock after,
// and gets none of its own writes back, also from the replay of the push;
// after another client's write its cursor is behind the clock before, and
// it keeps its cursor, which brings that write.
func TestPushCursor(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		_, cursor := pullAll(t, ts.URL, aliceToken, "s", "", "rows") // a store with no writes yet
		body := `{"ops":{"items":[{"id":"a1","v":1},{"id":"a2","v":2}]}}`
		r := ts.push(t, aliceToken, "s", "k-1", body)
		if r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		m := r.json(t)
		checkTimes(t, m, "")
		if m["previous_time"] != cursor {
			t.Fatalf("the first push's previous_time is %v, want the store's clock %s", m["previous_time"], cursor)
		}
		next := m["cursor"].(string)
		if rows, _ := pullAll(t, ts.URL, aliceToken, "s", next, "rows"); len(rows) != 0 {
			t.Errorf("a pull from the push's cursor brought %v, want nothing", rows)
		}
		if rows, _ := pullAll(t, ts.URL, aliceToken, "s", cursor, "rows"); len(rows["items"]) != 2 {
			t.Errorf("a pull from before the push brought %v, want its 2 records", rows)
		}
		replay := ts.push(t, aliceToken, "s", "k-1", body).json(t)
		if replay["previous_time"] != m["previous_time"] || replay["cursor"] != next {
			t.Errorf("the replay answered %v, want the first answer's times %v", replay, m)
		}

		// Another client's write, then this client's push: its cursor
		// is behind previous_time, and pulling from it brings both.
		if r := ts.push(t, aliceToken, "s", "", `{"ops":{"items":[{"id":"b1","v":3}]}}`); r.status != 200 {
			t.Fatalf("push: %d %s", r.status, r.body)
		}
		m = ts.push(t, aliceToken, "s", "", `{"ops":{"items":[{"id":"a3","v":4}]}}`).json(t)
		if follows(t, next, m["previous_time"].(string)) {
			t.Fatalf("previous_time %v is not after the cursor %s: another write came between", m["previous_time"], next)
		}
		rows, _ := pullAll(t, ts.URL, aliceToken, "s", next, "rows")
		if len(rows["items"]) != 2 || rows["items"]["b1"] == nil || rows["items"]["a3"] == nil {
			t.Errorf("a pull from the kept cursor brought %v, want b1 and a3", rows)
		}
		// A push that changes nothing takes no time: its cursor is its
		// previous_time, and follows on.
		state := `{"ops":{"items":[{"op":"upsert","id":"a1","drivesync":{"state":{"data":{},"clock":{},"deleted":false}}}]}}`
		m = ts.push(t, aliceToken, "s", "", state).json(t)
		if m["cursor"] != m["previous_time"] {
			t.Errorf("a push that changed nothing answered %v, want cursor = previous_time", m)
		}
	})
}

// follows reports whether a client at cursor may take a push's cursor:
// its cursor is at or after the push's previous_time.
func follows(t testing.TB, cursor, previous string) bool {
	t.Helper()
	c, err1 := time.Parse(time.RFC3339Nano, cursor)
	p, err2 := time.Parse(time.RFC3339Nano, previous)
	if err1 != nil || err2 != nil {
		t.Errorf("times %q, %q: %v %v", cursor, previous, err1, err2)
		return false
	}
	return !c.Before(p)
}

// Clients that take a push's cursor when it follows on from theirs, as
// the drivesync engine does, pushing and pulling at once through several
// server processes, each see every record the others wrote.
func TestPushCursorNeverSkips(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		servers := []string{newServer(t, spec).URL}
		if strings.HasPrefix(spec, "postgres") {
			servers = append(servers, newServer(t, spec).URL)
		}
		const clients, rounds, batch = 6, 15, 3
		seen := make([]map[string]bool, clients)
		var own, followed atomic.Int64
		var wg sync.WaitGroup
		pull := func(c int, base, since string) string {
			for {
				q := url.Values{"store": {"race"}, "limit": {"5"}, "since": {since}}
				r := do(t, "GET", base+"/sync/pull?"+q.Encode(), aliceToken, "")
				if r.status != 200 {
					t.Errorf("pull: %d %s", r.status, r.body)
					return since
				}
				var m struct {
					Changes    map[string][]map[string]any
					NextCursor *string
					ServerTime string `json:"server_time"`
				}
				json.Unmarshal(r.body, &m)
				for _, row := range m.Changes["items"] {
					id := row["id"].(string)
					seen[c][id] = true
					if strings.HasPrefix(id, fmt.Sprintf("c%d-", c)) {
						own.Add(1)
					}
				}
				if m.NextCursor == nil {
					return m.ServerTime
				}
				since = *m.NextCursor
			}
		}
		cursors := make([]string, clients)
		for c := range clients {
			seen[c] = map[string]bool{}
			wg.Go(func() {
				base := servers[c%len(servers)]
				cursor := pull(c, base, "1970-01-01T00:00:00Z")
				defer func() { cursors[c] = cursor }()
				for i := range rounds {
					var ops []string
					for j := range batch {
						id := fmt.Sprintf("c%d-%d-%d", c, i, j)
						ops = append(ops, fmt.Sprintf(`{"id":%q,"v":%d}`, id, j))
						seen[c][id] = true
					}
					r := do(t, "POST", base+"/sync/push?store=race", aliceToken, `{"ops":{"items":[`+strings.Join(ops, ",")+`]}}`)
					if r.status != 200 {
						t.Errorf("push: %d %s", r.status, r.body)
						return
					}
					var m struct {
						Previous string `json:"previous_time"`
						Cursor   string
					}
					json.Unmarshal(r.body, &m)
					if follows(t, cursor, m.Previous) {
						cursor = m.Cursor
						followed.Add(1)
					}
					cursor = pull(c, base, cursor)
				}
			})
		}
		wg.Wait()
		t.Logf("pushes that followed on: %d of %d; own records pulled back: %d of %d", followed.Load(), clients*rounds, own.Load(), clients*rounds*batch)
		for c := range clients {
			// Each client's next pull, from its cursor, completes its view.
			pull(c, servers[c%len(servers)], cursors[c])
			if len(seen[c]) != clients*rounds*batch {
				t.Errorf("client %d saw %d of %d records", c, len(seen[c]), clients*rounds*batch)
			}
		}
	})
}

// A stamp names one write: the same stamped write again is applied (and
// changes nothing), another write under that stamp is refused whole (two
// databases sync under one device id), whatever path it meets the first
// at.
func TestStampReused(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		first := `{"ops":{"t":[{"id":"a","drivesync":{"version":5,"device":"dev-a","patch":{"x":1,"o":{"p":"q"}}}}]}}`
		for range 2 {
			if r := ts.push(t, aliceToken, "s", "", first); r.status != 200 {
				t.Fatalf("push: %d %s", r.status, r.body)
			}
		}
		for _, other := range []string{
			`{"ops":{"ok":[{"id":"z","n":1}],"t":[{"id":"a","drivesync":{"version":5,"device":"dev-a","patch":{"x":2}}}]}}`,
			`{"ops":{"t":[{"id":"a","drivesync":{"version":5,"device":"dev-a","patch":{"o":{"p":"r"}}}}]}}`,
			`{"ops":{"t":[{"id":"a","drivesync":{"version":5,"device":"dev-a","patch":{"x":null}}}]}}`,
			`{"ops":{"deletions":[{"table":"t","id":"a","drivesync":{"version":5,"device":"dev-a"}}]}}`,
		} {
			r := ts.push(t, aliceToken, "s", "", other)
			if r.status != 409 || r.json(t)["type"] != problemType("stamp-reused") {
				t.Errorf("%s: %d %s, want 409 stamp-reused", other, r.status, r.body)
			}
		}
		// Another path under the same stamp is another part of the
		// same change: taken.
		if r := ts.push(t, aliceToken, "s", "", `{"ops":{"t":[{"id":"a","drivesync":{"version":5,"device":"dev-a","patch":{"y":3,"o":{"s":4}}}}]}}`); r.status != 200 {
			t.Errorf("another path under the stamp: %d %s", r.status, r.body)
		}
		rows, _ := pullAll(t, ts.URL, aliceToken, "s", "", "rows")
		if a := rows["t"]["a"]; a["x"].(float64) != 1 || a["y"].(float64) != 3 || rows["ok"] != nil {
			t.Errorf("after the refusals: %v", rows)
		}
	})
}
