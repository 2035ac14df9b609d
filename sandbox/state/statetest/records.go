package statetest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cellbox/cellbox/sandbox/state"
)

// putGet: a put record is read back with its value and a revision > 0; a
// key names a record in each kind apart; a missing record is ErrNotFound;
// keys and values are bytes (NUL, 0xff), and the empty value (nil or
// empty) reads back as an empty, non-nil Value.
func (s *suite) putGet(t *testing.T) {
	st := s.store(t)
	rev := put(t, st, state.Sessions, "s-1", `{"id":"s-1"}`)
	r := get(t, st, state.Sessions, "s-1")
	assert.Equal(t, state.Record{Key: "s-1", Value: []byte(`{"id":"s-1"}`), Revision: rev}, r)
	assert.Greater(t, rev, uint64(0))

	_, err := st.Get(ctx, state.Boxes, "s-1")
	assert.ErrorIs(t, err, state.ErrNotFound, "a key of one kind is not a record of another")
	_, err = st.Get(ctx, state.Sessions, "s-2")
	assert.ErrorIs(t, err, state.ErrNotFound)

	put(t, st, state.Boxes, "s-1", "a box")
	assert.Equal(t, `{"id":"s-1"}`, value(t, st, state.Sessions, "s-1"), "kinds are namespaces")
	assert.Equal(t, "a box", value(t, st, state.Boxes, "s-1"))

	bin := "k\x00\xff\n/"
	put(t, st, state.Previews, bin, "v\x00\xff")
	assert.Equal(t, "v\x00\xff", value(t, st, state.Previews, bin))
	assert.Equal(t, []string{bin}, keys(list(t, st, state.Previews, "")))

	commit(t, st, state.Put(state.MCPSessions, "nil", nil), state.Put(state.MCPSessions, "empty", []byte{}))
	for _, k := range []string{"nil", "empty"} {
		r := get(t, st, state.MCPSessions, k)
		assert.NotNil(t, r.Value, "%s: a Value is never nil", k)
		assert.Empty(t, r.Value, k)
	}
	for _, r := range list(t, st, state.MCPSessions, "") {
		assert.NotNil(t, r.Value, "%s: a listed Value is never nil", r.Key)
	}

	put(t, st, state.Sessions, "s-1", "two")
	assert.Equal(t, "two", value(t, st, state.Sessions, "s-1"), "a put replaces")
}

// list: the records of one kind whose keys start with a prefix, sorted
// bytewise, each as Get has it; none is an empty slice.
func (s *suite) list(t *testing.T) {
	st := s.store(t)
	for _, k := range []string{"b-2", "b-10", "c-1", "b-1", "b", "a\xff", "a\x7f"} {
		put(t, st, state.Boxes, k, "v"+k)
	}
	put(t, st, state.Sessions, "b-3", "other kind")
	assert.Equal(t, []string{"a\x7f", "a\xff", "b", "b-1", "b-10", "b-2", "c-1"}, keys(list(t, st, state.Boxes, "")))
	assert.Equal(t, []string{"b-1", "b-10", "b-2"}, keys(list(t, st, state.Boxes, "b-")))
	assert.Equal(t, []string{"b", "b-1", "b-10", "b-2"}, keys(list(t, st, state.Boxes, "b")))
	assert.Equal(t, []string{"b-1", "b-10"}, keys(list(t, st, state.Boxes, "b-1")))
	assert.Equal(t, []string{"a\xff"}, keys(list(t, st, state.Boxes, "a\xff")))
	assert.Empty(t, list(t, st, state.Boxes, "zz"))
	assert.Empty(t, list(t, st, state.Boxes, "b-100"))
	assert.Empty(t, list(t, st, state.Previews, ""), "a kind never written")
	for _, r := range list(t, st, state.Boxes, "") {
		assert.Equal(t, get(t, st, state.Boxes, r.Key), r, "a listed record is as Get has it")
	}
	assert.Equal(t, []string{"b-3"}, keys(list(t, st, state.Sessions, "")))
}

// revisions: every commit that puts takes a revision above every earlier
// one, and every record it puts has it; a record untouched keeps its
// revision; a record deleted and put again has a revision it never had; a
// commit of deletes only returns a revision no record is above.
func (s *suite) revisions(t *testing.T) {
	st := s.store(t)
	r1 := put(t, st, state.Sessions, "a", "1")
	r2 := commit(t, st, state.Put(state.Sessions, "b", []byte("1")), state.Put(state.Boxes, "x", []byte("1")))
	assert.Greater(t, r2, r1)
	assert.Equal(t, r2, get(t, st, state.Sessions, "b").Revision, "every record of a commit has its revision")
	assert.Equal(t, r2, get(t, st, state.Boxes, "x").Revision)
	assert.Equal(t, r1, get(t, st, state.Sessions, "a").Revision, "a record untouched keeps its revision")

	r3 := put(t, st, state.Sessions, "a", "2")
	assert.Greater(t, r3, r2, "an update takes a new revision")
	assert.Equal(t, r3, get(t, st, state.Sessions, "a").Revision)
	r4 := put(t, st, state.Sessions, "a", "2")
	assert.Greater(t, r4, r3, "a put of the same value takes a new revision too")

	r5 := commit(t, st, state.Delete(state.Sessions, "a"))
	assert.GreaterOrEqual(t, r5, r4, "a commit of deletes returns a revision no record is above")
	r6 := put(t, st, state.Sessions, "a", "2")
	assert.Greater(t, r6, r4, "a record put again after a delete has a revision it never had")

	seen := map[uint64]bool{}
	last := r6
	for i := 0; i < 20; i++ {
		r := put(t, st, state.Boxes, "y", "v")
		assert.Greater(t, r, last)
		assert.False(t, seen[r])
		seen[r], last = true, r
	}
}

// delete: a deleted record is gone from Get and List, and nothing else
// with it; an unguarded delete of a missing record succeeds.
func (s *suite) delete(t *testing.T) {
	st := s.store(t)
	put(t, st, state.Boxes, "a", "1")
	put(t, st, state.Boxes, "b", "2")
	put(t, st, state.Sessions, "a", "3")
	commit(t, st, state.Delete(state.Boxes, "a"))
	assert.Equal(t, "(none)", value(t, st, state.Boxes, "a"))
	assert.Equal(t, []string{"b"}, keys(list(t, st, state.Boxes, "")))
	assert.Equal(t, "3", value(t, st, state.Sessions, "a"), "the same key of another kind stays")
	commit(t, st, state.Delete(state.Boxes, "a"), state.Delete(state.Previews, "never"))
	assert.Equal(t, []string{"b"}, keys(list(t, st, state.Boxes, "")))
}

// copies: no caller shares a byte with the store: a value changed after
// its commit, or after Get or List returned it, changes nothing stored.
func (s *suite) copies(t *testing.T) {
	st := s.store(t)
	v := []byte("abc")
	commit(t, st, state.Put(state.Boxes, "k", v))
	v[0] = 'X'
	assert.Equal(t, "abc", value(t, st, state.Boxes, "k"), "the op's value changed after the commit")

	r := get(t, st, state.Boxes, "k")
	r.Value[0] = 'Y'
	assert.Equal(t, "abc", value(t, st, state.Boxes, "k"), "Get's value changed")
	rs := list(t, st, state.Boxes, "")
	rs[0].Value[0] = 'Z'
	assert.Equal(t, "abc", value(t, st, state.Boxes, "k"), "List's value changed")

	a, b := get(t, st, state.Boxes, "k"), get(t, st, state.Boxes, "k")
	a.Value[1] = 'Q'
	assert.Equal(t, "abc", string(b.Value), "two Gets share no bytes")
}

// invalid: a bad kind, key, counter or holder, or a commit naming one
// record twice, is refused with ErrInvalid and writes nothing; the longest
// key (MaxKey) is taken.
func (s *suite) invalid(t *testing.T) {
	st := s.store(t)
	put(t, st, state.Boxes, "keep", "v")
	before := dump(t, st)
	long := strings.Repeat("k", state.MaxKey+1)
	for name, ops := range map[string][]state.Op{
		"empty kind":         {state.Put("", "k", nil)},
		"upper-case kind":    {state.Put("Boxes", "k", nil)},
		"kind with a slash":  {state.Put("a/b", "k", nil)},
		"kind of 65 bytes":   {state.Put(state.Kind(strings.Repeat("a", 65)), "k", nil)},
		"empty key":          {state.Put(state.Boxes, "new", nil), state.Put(state.Boxes, "", nil)},
		"long key":           {state.Put(state.Boxes, "new", nil), state.Put(state.Boxes, long, nil)},
		"one record twice":   {state.Put(state.Boxes, "new", nil), state.Put(state.Boxes, "new", []byte("2"))},
		"put and delete":     {state.Put(state.Boxes, "keep", []byte("2")), state.Delete(state.Boxes, "keep")},
		"guarded and not":    {state.Put(state.Boxes, "keep", nil).If(0), state.Put(state.Boxes, "keep", nil)},
		"bad kind of delete": {state.Delete(state.Boxes, "keep"), state.Delete("-", "keep")},
	} {
		_, err := st.Commit(ctx, ops...)
		assert.ErrorIs(t, err, state.ErrInvalid, name)
	}
	assert.Equal(t, before, dump(t, st), "a refused commit writes nothing")

	_, err := st.Get(ctx, "Bad", "k")
	assert.ErrorIs(t, err, state.ErrInvalid, "Get, bad kind")
	_, err = st.Get(ctx, state.Boxes, "")
	assert.ErrorIs(t, err, state.ErrInvalid, "Get, empty key")
	_, err = st.Get(ctx, state.Boxes, long)
	assert.ErrorIs(t, err, state.ErrInvalid, "Get, long key")
	_, err = st.List(ctx, "", "")
	assert.ErrorIs(t, err, state.ErrInvalid, "List, empty kind")
	assert.ErrorIs(t, st.Reserve(ctx, "", "h", 1), state.ErrInvalid, "Reserve, empty counter")
	assert.ErrorIs(t, st.Reserve(ctx, "c", "", 1), state.ErrInvalid, "Reserve, empty holder")
	assert.ErrorIs(t, st.Reserve(ctx, "c", long, 1), state.ErrInvalid, "Reserve, long holder")
	assert.ErrorIs(t, st.Release(ctx, "", "h"), state.ErrInvalid, "Release, empty counter")
	_, err = st.Holders(ctx, "")
	assert.ErrorIs(t, err, state.ErrInvalid, "Holders, empty counter")
	assert.Equal(t, before, dump(t, st), "refused calls write nothing")

	longest := strings.Repeat("k", state.MaxKey)
	kind := state.Kind(strings.Repeat("z", 64))
	put(t, st, kind, longest, "ok")
	assert.Equal(t, "ok", value(t, st, kind, longest), "a key of MaxKey bytes in a kind of 64")
	require.NoError(t, st.Reserve(ctx, longest, longest, 1))
	assert.Equal(t, []string{longest}, holders(t, st, longest))
}

// emptyCommit: a commit of no ops writes nothing and returns 0.
func (s *suite) emptyCommit(t *testing.T) {
	st := s.store(t)
	put(t, st, state.Boxes, "a", "1")
	before := dump(t, st)
	rev, err := st.Commit(ctx)
	require.NoError(t, err)
	assert.Zero(t, rev)
	assert.Equal(t, before, dump(t, st))
}
