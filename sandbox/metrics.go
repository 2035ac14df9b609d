package sandbox

import (
	"sync"
	"time"
)

// metrics are the service's counters (Service.Metrics; sandbox/httpapi
// serves them on /metrics).
type metrics struct {
	mu    sync.Mutex
	calls map[[2]string]uint64 // tool, outcome (ok|error)
	sum   map[string]float64   // tool -> seconds
	// revived counts the boxes restarted after dying behind the pool's back.
	revived uint64
	// warmTaken counts the boxes created from the warm pool.
	warmTaken uint64
}

func newMetrics() *metrics {
	return &metrics{calls: map[[2]string]uint64{}, sum: map[string]float64{}}
}

func (m *metrics) observeTool(tool string, ok bool, d time.Duration) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	m.mu.Lock()
	m.calls[[2]string{tool, outcome}]++
	m.sum[tool] += d.Seconds()
	m.mu.Unlock()
}

func (m *metrics) observeWarmTake() {
	m.mu.Lock()
	m.warmTaken++
	m.mu.Unlock()
}

func (m *metrics) observeRevive() {
	m.mu.Lock()
	m.revived++
	m.mu.Unlock()
}

// Metrics is a snapshot of the service's counters and gauges (sandbox/httpapi
// serves it on /metrics).
type Metrics struct {
	// Tools are the tool calls so far, by tool (sorted by name).
	Tools []ToolMetrics
	// Revived counts the boxes restarted after they died behind the pool's
	// back (agent killed, OOM, container killed).
	Revived uint64
	// WarmTaken counts the boxes created from the warm pool.
	WarmTaken uint64
	// Boxes counts the boxes of sessions by state (running, sleeping,
	// lost, dead; in that order).
	Boxes []Count
	// PoolReady counts the pre-started boxes ready in the warm pool, by
	// image (sorted).
	PoolReady []Count
	// Sessions is the number of sessions.
	Sessions int
}

// ToolMetrics are the calls of one tool (a profile's tool as
// "profile/name").
type ToolMetrics struct {
	Tool      string
	OK, Error uint64  // calls by outcome
	Seconds   float64 // time spent in all of them
}

// Count is a number of things that share a label.
type Count struct {
	Label string
	N     int
}

// Metrics returns a snapshot of the service's metrics.
func (s *Service) Metrics() Metrics {
	var out Metrics
	m := s.metrics
	m.mu.Lock()
	for _, t := range sortedNames(m.sum) {
		out.Tools = append(out.Tools, ToolMetrics{Tool: t, OK: m.calls[[2]string{t, "ok"}], Error: m.calls[[2]string{t, "error"}], Seconds: m.sum[t]})
	}
	out.Revived = m.revived
	out.WarmTaken = m.warmTaken
	m.mu.Unlock()

	states := map[boxState]int{}
	pools := s.pools.Ready()
	s.mu.Lock()
	for _, bx := range s.boxes {
		states[bx.state]++
	}
	out.Sessions = len(s.sessions)
	s.mu.Unlock()
	for _, st := range []boxState{stateRunning, stateSleeping, stateGone, stateDead} {
		out.Boxes = append(out.Boxes, Count{Label: st.String(), N: states[st]})
	}
	for _, image := range sortedNames(pools) {
		out.PoolReady = append(out.PoolReady, Count{Label: image, N: pools[image]})
	}
	return out
}
