package etcdkv

// Loads returns how many times k loaded its prefix: once at Open, once
// more for each reload after a compacted watch.
func (k *KV) Loads() int {
	k.cache.mu.RLock()
	defer k.cache.mu.RUnlock()
	return k.cache.loads
}

// HoldCache makes k's watch stop before it puts the next events into the
// cache, until the returned func is called.
func (k *KV) HoldCache() (release func()) {
	ch := make(chan struct{})
	f := func() { <-ch }
	k.beforeApply.Store(&f)
	return func() { k.beforeApply.Store(nil); close(ch) }
}
