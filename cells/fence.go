package cells

import (
	"context"
	"errors"
)

// Fence makes the commits of an Update conditional on a lease: a KV that
// several servers share commits a transaction whose context carries a
// Fence (WithFence) only while Key (the lease's own key in that store)
// still has the create revision Rev, that is, while the lease the writer
// holds is the one it took. A server that lost its lease, and was paused
// past it (a stopped process, a frozen machine), then writes nothing:
// its commit fails with ErrFenced. A KV of one process ignores fences:
// one process is the only writer there is.
type Fence struct {
	Key string
	Rev int64
}

type fenceKey struct{}

// WithFence returns ctx carrying f for the commits made under it.
func WithFence(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceOf returns the Fence ctx carries, if any: a KV's Commit reads it.
func FenceOf(ctx context.Context) (Fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(Fence)
	return f, ok
}

// ErrFenced: a commit's fence no longer holds (its lease is another's
// now); nothing was written, and running the transaction again would not
// help, so Update returns it.
var ErrFenced = errors.New("the lease this write was made under is no longer held")
