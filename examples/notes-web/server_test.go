package main

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestReview14CrossSiteEdit: any web page the user visits can post a
// plain form to the app on 127.0.0.1 (a "simple" cross-origin request,
// sent without a preflight): the server checks neither Origin nor Host,
// and a note is named by its first 4 characters, so a page can overwrite
// or delete the user's notes by trying the 65,536 prefixes; the next sync
// carries the change to every device.
func TestReview14CrossSiteEdit(t *testing.T) {
	d := startDevice(t, "a", t.TempDir())
	ctx := context.Background()
	id, err := d.srv.app.Add(ctx, "my important note")
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodPost, d.url+"/notes/"+id[:4], strings.NewReader(url.Values{"text": {"pwned"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	notes, err := d.srv.app.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) == 1 && notes[0].Text == "pwned" {
		t.Fatalf("a cross-site form post (Origin https://evil.example, answered %d) overwrote note %s by its first 4 characters: now %q", res.StatusCode, id, notes[0].Text)
	}
}
