package main

// indexHTML is the app's one page, a page of notes at a time. Forms post
// and come back to it; the script only drives the Sync button: it posts
// /sync, shows the progress the engine sends on /events, and reloads the
// page when the sync ends.
const indexHTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Notes</title>
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 46em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.bar { display: flex; align-items: center; gap: 1em; }
progress { width: 18em; height: 1.1em; }
ul { list-style: none; padding: 0; }
li { display: flex; gap: .5em; margin: .3em 0; }
li input[type=text] { flex: 1; }
input[type=text] { padding: .3em; font: inherit; }
button { font: inherit; padding: .3em .8em; }
.status { background: #f4f4f4; padding: .6em 1em; border-radius: 6px; }
.status dt { float: left; width: 9em; color: #666; } .status dd { margin: 0 0 .2em 9em; }
.conflict { background: #fff4e0; padding: .5em .8em; border-radius: 6px; margin: .4em 0; }
.error { color: #a00; }
.pages { display: flex; justify-content: space-between; margin: .6em 0; }
</style>
</head>
<body{{if .Syncing}} data-syncing="1"{{end}}>
<h1>Notes</h1>
{{with .Error}}<p class="error" id="error">{{.}}</p>{{end}}
<div class="bar">
  <button id="sync" type="button"{{if .Syncing}} disabled{{end}}>Sync now</button>
  <progress id="progress" max="1" value="0"></progress>
  <span id="sync-state">{{if .Syncing}}A sync is running…{{end}}</span>
</div>

<h2>Your notes, newest first</h2>
<form method="post" action="/notes{{.Here}}" class="bar">
  <input type="text" name="text" id="new-text" placeholder="A new note" style="flex:1">
  <button type="submit" id="add">Add</button>
</form>
<ul id="notes">
{{range .Notes}}
  <li class="note" data-id="{{.ID}}">
    <form method="post" action="/notes/{{.ID}}{{$.Here}}" style="display:flex;flex:1;gap:.5em">
      <input type="text" name="text" value="{{.Text}}" aria-label="note text">
      <button type="submit" class="save">Save</button>
    </form>
    <form method="post" action="/notes/{{.ID}}/delete{{$.Here}}"><button type="submit" class="delete">Delete</button></form>
  </li>
{{else}}
  <li id="empty">{{if .Newer}}No older notes.{{else}}No notes yet.{{end}}</li>
{{end}}
</ul>
{{if or .Newer .Older}}<nav class="pages">
  {{with .Newer}}<a id="newer" href="{{.}}">← Newer notes</a>{{else}}<span></span>{{end}}
  {{with .Older}}<a id="older" href="{{.}}">Older notes →</a>{{end}}
</nav>{{end}}

<h2>Conflicts</h2>
<div id="conflicts">
{{range .Conflicts}}
  <div class="conflict" data-id="{{.ID}}">
    Another device overwrote <b>{{join .Path "."}}</b> of a note:
    yours was <code class="loser">{{printf "%s" .Loser}}</code>,
    theirs is <code class="winner">{{printf "%s" .Winner}}</code> (from {{.WinnerDevice}}).
    <form method="post" action="/conflicts/{{.ID}}/mine{{$.Here}}" style="display:inline"><button type="submit" class="keep-mine">Keep mine</button></form>
    <form method="post" action="/conflicts/{{.ID}}/theirs{{$.Here}}" style="display:inline"><button type="submit" class="keep-theirs">Keep theirs</button></form>
  </div>
{{else}}
  <p id="no-conflicts">No conflicts.</p>
{{end}}
</div>

<h2>Status</h2>
<dl class="status" id="status">
  <dt>Device</dt><dd>{{.Status.DeviceID}}</dd>
  <dt>Pending</dt><dd id="pending">{{.Status.Pending}}</dd>
  <dt>Last sync</dt><dd id="last-sync" data-at="{{if not .Status.LastSync.IsZero}}{{.Status.LastSync.UnixNano}}{{end}}">{{ago .Status.LastSync}}{{if .Status.LastError}} — failed: {{.Status.LastError}}{{else if not .Status.LastSync.IsZero}} — ok{{end}}</dd>
  <dt>Store</dt><dd>{{or .Status.Store "none yet"}}</dd>
  {{with .Status.Remote}}<dt>Remote</dt><dd>{{.}}</dd>{{end}}
  {{if .Status.OutboxWaiting}}<dt>Outbox</dt><dd>an upload waits: the next sync sends it first</dd>{{end}}
  {{if .Status.Encrypted}}<dt>Encrypted</dt><dd>yes</dd>{{end}}
  {{if ge .Status.RemoteBytes 0}}<dt>Remote size</dt><dd>{{.Status.RemoteBytes}} bytes (as of {{ago .Status.RemoteBytesAt}})</dd>{{end}}
  {{with .Status.ClockWarning}}<dt>Clock</dt><dd class="error">{{.}}</dd>{{end}}
</dl>

<script>
const button = document.getElementById("sync");
const bar = document.getElementById("progress");
const state = document.getElementById("sync-state");
const events = new EventSource("/events");
events.onopen = () => { document.body.dataset.live = "1"; };
// The bar fills against the bytes, else the changes (an apply, an upload,
// a sync server's pull at its end), else the files; with no total known
// yet (a sync server's pull) it shows no value, which a browser draws as
// a bar that is busy.
events.addEventListener("progress", e => {
  const p = JSON.parse(e.data);
  const frac = p.totalBytes > 0 ? p.bytes / p.totalBytes
    : p.totalRecords > 0 ? p.records / p.totalRecords
    : p.total > 0 ? p.done / p.total : null;
  if (frac === null) {
    bar.removeAttribute("value");
  } else {
    bar.value = Math.min(Math.max(frac, 0), 1);
  }
  state.textContent = p.step === "list" ? "listing the remote" : p.step + " " + (p.totalRecords > 0 ? p.records + "/" + p.totalRecords + " changes"
    : p.total > 0 ? p.done + "/" + p.total + " files" : p.records + " changes");
});
events.addEventListener("synced", e => {
  const r = JSON.parse(e.data);
  reload(r.error ? "Sync failed: " + r.error : "");
});
events.addEventListener("state", e => {
  // The stream opens saying whether a sync runs: if so its progress and
  // end follow; a sync this page showed running has ended if not.
  if (JSON.parse(e.data).syncing) {
    button.disabled = true;
  } else if (document.body.dataset.syncing) {
    reload("");
  }
});
// reload shows this page of notes again, with error if there is one.
function reload(error) {
  const u = new URL(location.href);
  u.searchParams.delete("error");
  if (error) u.searchParams.set("error", error);
  location.href = u;
}
button.addEventListener("click", () => {
  button.disabled = true;
  state.textContent = "syncing…";
  fetch("/sync", {method: "POST"}).catch(err => { state.textContent = String(err); button.disabled = false; });
});
</script>
</body>
</html>
`
