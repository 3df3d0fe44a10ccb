package drivefake

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/api/drive/v3"
)

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

// A sortKey holds what orderBy can sort on. The creation counter seq breaks
// ties, so every listing has one well-defined order.
type sortKey struct {
	name     string
	folder   bool
	created  time.Time
	modified time.Time
	seq      int64
}

type orderTerm struct {
	field string // createdTime, modifiedTime, name or folder
	desc  bool
}

// pageState is what a nextPageToken stands for: the listing it continues
// and the sort key of the last file it returned. The next page starts after
// that key, so files created or deleted between pages neither shift nor
// repeat the files that were already there.
type pageState struct {
	listing string // q, spaces and orderBy of the listing
	after   sortKey
}

// handleList serves files.list. The fields parameter is ignored: every
// field is always returned.
func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	params := r.URL.Query()

	q, err := parseQuery(params.Get("q"))
	if err != nil {
		s.t.Logf("drivefake: files.list: bad q %q: %v", params.Get("q"), err)
		writeError(w, invalid("q"))
		return
	}
	spaces := splitList(params.Get("spaces"))
	if len(spaces) == 0 {
		spaces = []string{SpaceDrive}
	}
	for _, sp := range spaces {
		if !isSpace(sp) {
			writeError(w, invalid("spaces"))
			return
		}
	}
	order, ok := parseOrderBy(params.Get("orderBy"))
	if !ok {
		s.t.Logf("drivefake: files.list: unsupported orderBy %q", params.Get("orderBy"))
		writeError(w, invalid("orderBy"))
		return
	}
	pageSize := defaultPageSize
	if v := params.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			writeError(w, newError(http.StatusBadRequest, "invalid",
				"Invalid value '"+v+"'. Values must be within the range: [1, 1000]").at("pageSize"))
			return
		}
		pageSize = n
	}
	listing := params.Get("q") + "\x00" + strings.Join(spaces, ",") + "\x00" + params.Get("orderBy")

	s.mu.Lock()
	defer s.mu.Unlock()

	var after *sortKey
	if token := params.Get("pageToken"); token != "" {
		st, ok := s.pages[token]
		if !ok || st.listing != listing {
			writeError(w, invalid("pageToken"))
			return
		}
		after = &st.after
	}

	var hits []*file
	for _, f := range s.files {
		if f.hiddenLists > 0 {
			f.hiddenLists--
			continue
		}
		if slices.Contains(spaces, f.space) && q.match(s.queryFileOf(f)) {
			hits = append(hits, f)
		}
	}
	slices.SortFunc(hits, func(a, b *file) int { return compareKeys(keyOf(a), keyOf(b), order) })
	if after != nil {
		i, _ := slices.BinarySearchFunc(hits, *after, func(f *file, k sortKey) int {
			if compareKeys(keyOf(f), k, order) <= 0 {
				return -1
			}
			return 1
		})
		hits = hits[i:]
	}

	list := &drive.FileList{Kind: "drive#fileList", Files: []*drive.File{}}
	if len(hits) > pageSize {
		hits = hits[:pageSize]
		token := newID()
		s.pages[token] = pageState{listing: listing, after: keyOf(hits[len(hits)-1])}
		list.NextPageToken = token
	}
	for _, f := range hits {
		list.Files = append(list.Files, s.resource(f))
	}
	writeJSON(w, http.StatusOK, list)
}

// parseOrderBy parses an orderBy parameter such as "folder,name" or
// "createdTime desc". name_natural is taken as name.
func parseOrderBy(s string) ([]orderTerm, bool) {
	var order []orderTerm
	for _, item := range splitList(s) {
		fields := strings.Fields(item)
		t := orderTerm{field: fields[0]}
		switch {
		case len(fields) == 1:
		case len(fields) == 2 && fields[1] == "desc":
			t.desc = true
		case len(fields) == 2 && fields[1] == "asc":
		default:
			return nil, false
		}
		switch t.field {
		case "createdTime", "modifiedTime", "name", "folder":
		case "name_natural":
			t.field = "name"
		default:
			return nil, false
		}
		order = append(order, t)
	}
	return order, true
}

func keyOf(f *file) sortKey {
	return sortKey{
		name:     f.name,
		folder:   f.mimeType == FolderMimeType,
		created:  f.created,
		modified: f.modified,
		seq:      f.seq,
	}
}

// compareKeys orders two files by the orderBy terms, then by creation.
// Names compare case-insensitively first; folders sort before files.
func compareKeys(a, b sortKey, order []orderTerm) int {
	for _, t := range order {
		var c int
		switch t.field {
		case "createdTime":
			c = a.created.Compare(b.created)
		case "modifiedTime":
			c = a.modified.Compare(b.modified)
		case "name":
			c = cmp.Or(cmp.Compare(strings.ToLower(a.name), strings.ToLower(b.name)), cmp.Compare(a.name, b.name))
		case "folder":
			c = -compareBool(a.folder, b.folder)
		}
		if t.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Compare(a.seq, b.seq)
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}
