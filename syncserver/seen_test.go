package syncserver

import (
	"strings"
	"testing"
)

// TestSeenKept checks what a record keeps of its writes' seen lists: an
// engine's write leaves an entry for each path it set (the stamp it had
// seen there, or none), a later write of a path replaces its entry, a
// plain client's write drops it, and a write that lost a path leaves the
// winner's entry. A bad list is refused, naming the member.
func TestSeenKept(t *testing.T) {
	eachStore(t, func(t *testing.T, spec string) {
		ts := newServer(t, spec)
		seenOf := func() string {
			t.Helper()
			r := ts.pull(t, aliceToken, "store=s&view=drivesync")
			if r.status != 200 {
				t.Fatalf("pull: %d %s", r.status, r.body)
			}
			body := string(r.body)
			if !strings.Contains(body, `"features":["seen"]`) {
				t.Fatalf("the pull does not list the feature seen: %s", body)
			}
			if i := strings.Index(body, `"seen":`); i >= 0 {
				return body[i+len(`"seen":`) : strings.Index(body[i:], "]]}")+i+2]
			}
			return ""
		}
		push := func(body string) {
			t.Helper()
			if r := ts.push(t, aliceToken, "s", "", body); r.status != 200 {
				t.Fatalf("push %s: %d %s", body, r.status, r.body)
			}
		}
		push(`{"ops":{"notes":[{"op":"upsert","id":"n","drivesync":{"version":1,"device":"a","patch":{"title":"t","body":"b"},"seen":[]}}]}}`)
		if got, want := seenOf(), `[[["body"],0,"",1,"a"],[["title"],0,"",1,"a"]]`; got != want {
			t.Fatalf("after a's first write: seen %s, want %s", got, want)
		}
		push(`{"ops":{"notes":[{"op":"upsert","id":"n","drivesync":{"version":3,"device":"b","patch":{"title":"from b"},"seen":[[["title"],1,"a"]]}}]}}`)
		if got, want := seenOf(), `[[["title"],1,"a",3,"b"],[["body"],0,"",1,"a"]]`; got != want {
			t.Fatalf("after b's write: seen %s, want %s", got, want)
		}
		// A write that loses its path changes nothing of it.
		push(`{"ops":{"notes":[{"op":"upsert","id":"n","drivesync":{"version":2,"device":"c","patch":{"title":"late"},"seen":[]}}]}}`)
		if got, want := seenOf(), `[[["title"],1,"a",3,"b"],[["body"],0,"",1,"a"]]`; got != want {
			t.Fatalf("after a write that lost: seen %s, want %s", got, want)
		}
		// A plain client's write of the title: nothing known of it.
		push(`{"ops":{"notes":[{"op":"upsert","id":"n","title":"plain"}]}}`)
		if got, want := seenOf(), `[[["body"],0,"",1,"a"]]`; got != want {
			t.Fatalf("after a plain write: seen %s, want %s", got, want)
		}
		r := ts.push(t, aliceToken, "s", "", `{"ops":{"notes":[{"op":"upsert","id":"n","drivesync":{"version":9,"device":"a","patch":{"x":1},"seen":[["x"]]}}]}}`)
		if r.status != 400 || !strings.Contains(string(r.body), "ops.notes[0].drivesync.seen") {
			t.Fatalf("a bad seen list: %d %s, want 400 naming it", r.status, r.body)
		}
	})
}
