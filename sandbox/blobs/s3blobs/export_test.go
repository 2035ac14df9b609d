package s3blobs

import "time"

// SetSizes sets the sizes of Put's ways (memSpool, maxSinglePut,
// minPartSize) and returns what puts them back.
func SetSizes(mem, single, part int64) (restore func()) {
	m, s, p := memSpool, maxSinglePut, minPartSize
	memSpool, maxSinglePut, minPartSize = mem, single, part
	return func() { memSpool, maxSinglePut, minPartSize = m, s, p }
}

// SetPartHook sets a function multipart calls after each part it uploaded.
func SetPartHook(fn func(part int)) (restore func()) {
	old := partHook
	partHook = fn
	return func() { partHook = old }
}

// SetStale sets the ages past which Open removes leftover uploads and
// probes.
func SetStale(upload, probe time.Duration) (restore func()) {
	u, p := staleUpload, staleProbe
	staleUpload, staleProbe = upload, probe
	return func() { staleUpload, staleProbe = u, p }
}
