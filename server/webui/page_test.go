package webui

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/cells"
	"github.com/cellbox/cellbox/internal/chromiumtest"
	"github.com/cellbox/cellbox/runtime"
	"github.com/cellbox/cellbox/server/runapi"
)

// TestPageCutValues opens the page in headless Chromium over a pattern
// with a big input cell: the page reads values cut (max_string), shows the
// big one as cut and does not let it be set; loaded whole, it can be.
func TestPageCutValues(t *testing.T) {
	store := cells.NewMemory(cells.Options{})
	rt := runtime.New(store, runtime.Options{})
	api := runapi.New(runapi.Config{Runtime: rt, Store: store, Logger: slog.New(slog.DiscardHandler)})
	var mu sync.Mutex
	var reads, puts []string
	page := Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Owns(r.URL.Path) {
			page.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		switch r.Method {
		case http.MethodPut:
			puts = append(puts, r.URL.Path)
		case http.MethodGet:
			reads = append(reads, r.URL.RequestURI())
		}
		mu.Unlock()
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		api.Shutdown()
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rt.Close(ctx)
		store.Close()
	})
	big := `"` + strings.Repeat("x", 100000) + `"`
	resp, err := http.Post(srv.URL+"/v1/patterns", "application/yaml", strings.NewReader("name: big\ncells:\n  s: "+big+"\n  small: 1\n  exact: 0\nnodes:\n  copy: {computed: '${s}'}\n"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	// A number JavaScript rounds: shown, it is another number already.
	const exact = `{"n":12345678901234567890,"s":"x"}`
	req, err := http.NewRequest(http.MethodPut, srv.URL+"/v1/cells/default/big/exact", strings.NewReader(exact))
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	mu.Lock()
	puts = nil
	mu.Unlock()

	b := chromiumtest.Open(t, srv.URL+"/")
	type row struct {
		ReadOnly, SetDisabled, LoadHidden bool
		Length                            int
		Note, Msg                         string
	}
	const rowJS = `(a => { const r = document.getElementById('row-default/big/' + a); if (!r) return null;
		const bs = [...r.querySelectorAll('button')], ta = r.querySelector('textarea');
		return {readOnly: ta.readOnly, setDisabled: bs[0].disabled, loadHidden: bs[3].hidden, length: ta.value.length,
			note: r.querySelector('.msg.cut').textContent, msg: r.querySelector('.msg:not(.cut)').textContent}; })`
	get := func(name string) (r *row) {
		b.Eval(rowJS+`('`+name+`')`, &r)
		return r
	}
	var s *row
	waitFor(t, "the page to show the big cell cut", func() bool {
		s = get("s")
		var node bool
		b.Eval(`document.getElementById('row-default/big/copy') !== null`, &node)
		return s != nil && s.ReadOnly && node
	})
	assert.True(t, s.SetDisabled, "no Set for a cut value")
	assert.False(t, s.LoadHidden, "it may be loaded whole to edit")
	assert.Less(t, s.Length, 3000, "the field holds the cut value")
	assert.Contains(t, s.Note, "shown cut")
	small := get("small")
	assert.False(t, small.ReadOnly || small.SetDisabled, "a small value is editable")
	var copyText string
	b.Eval(`document.getElementById('row-default/big/copy').textContent`, &copyText)
	assert.Contains(t, copyText, "cut for display")

	// Ctrl+Enter in the field (Set, disabled, does the same) writes nothing back.
	b.Eval(`document.getElementById('row-default/big/s').querySelector('textarea').dispatchEvent(
		new KeyboardEvent('keydown', {key: 'Enter', ctrlKey: true, bubbles: true, cancelable: true}))`, nil)
	waitFor(t, "the page to refuse", func() bool { s = get("s"); return strings.Contains(s.Msg, "not set") })

	// The cell holding 12345678901234567890 is shown but not set back
	// (it would be 12345678901234567000).
	ex := get("exact")
	require.NotNil(t, ex)
	assert.True(t, ex.ReadOnly && ex.SetDisabled, "%+v", ex)
	assert.Contains(t, ex.Note, "cannot hold exactly")
	assert.True(t, ex.LoadHidden, "loading it whole would not help")
	b.Eval(`document.getElementById('row-default/big/exact').querySelector('textarea').dispatchEvent(
		new KeyboardEvent('keydown', {key: 'Enter', ctrlKey: true, bubbles: true, cancelable: true}))`, nil)
	waitFor(t, "the page to refuse the rounded number", func() bool { ex = get("exact"); return strings.Contains(ex.Msg, "not set") })
	mu.Lock()
	assert.Empty(t, puts, "a cut value, or a rounded one, is never written back")
	mu.Unlock()
	c, err := store.Get(context.Background(), cells.Address{Space: "default", Pattern: "big", Name: "exact"})
	require.NoError(t, err)
	assert.JSONEq(t, exact, string(c.Value))
	assert.Contains(t, string(c.Value), "12345678901234567890")

	// Loaded whole, the value is editable, and is set whole.
	b.Eval(`document.getElementById('row-default/big/s').querySelectorAll('button')[3].click(), true`, nil)
	waitFor(t, "the whole value in the field", func() bool { s = get("s"); return !s.ReadOnly })
	assert.Equal(t, len(big)-2, s.Length, "the whole string, as text")
	b.Eval(`document.getElementById('row-default/big/s').querySelector('button').click(), true`, nil)
	waitFor(t, "the page to set it", func() bool { s = get("s"); return strings.HasPrefix(s.Msg, "set (version") })
	c, err = store.Get(context.Background(), cells.Address{Space: "default", Pattern: "big", Name: "s"})
	require.NoError(t, err)
	assert.Equal(t, big, string(c.Value), "set whole")

	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, reads, "/v1/patterns?max_string=2000")
	assert.Contains(t, reads, "/v1/watch?max_string=2000")
	for _, r := range reads {
		if strings.HasPrefix(r, "/v1/patterns") || strings.HasPrefix(r, "/v1/watch") {
			assert.Contains(t, r, "max_string=", "the page reads every list cut")
		}
	}
}

// waitFor polls cond for at most 30 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
