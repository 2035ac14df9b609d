package etcdkv

// Loads returns how many times k loaded its prefix: once at Open, once
// more for each reload after a compacted watch.
func (k *KV) Loads() int {
	k.cache.mu.RLock()
	defer k.cache.mu.RUnlock()
	return k.cache.loads
}

// HoldCache makes k's watch stop before it puts the next events into the
// cache. release lets it go on; step lets one response of events in and
// holds the watch before the next.
func (k *KV) HoldCache() (release, step func()) {
	ch := make(chan struct{})
	hold := func() {
		ch = make(chan struct{})
		c := ch
		f := func() { <-c }
		k.beforeApply.Store(&f)
	}
	hold()
	release = func() { k.beforeApply.Store(nil); close(ch) }
	step = func() {
		old := ch
		hold() // before the old one lets go: the next response meets it
		close(old)
	}
	return release, step
}
