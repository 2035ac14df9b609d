package sandbox

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// metrics are the service's counters, served in the Prometheus text format.
type metrics struct {
	mu    sync.Mutex
	calls map[[2]string]uint64 // tool, outcome (ok|error)
	sum   map[string]float64   // tool -> seconds
	count map[string]uint64
	// revived counts the boxes restarted after dying behind the pool's back.
	revived uint64
}

func newMetrics() *metrics {
	return &metrics{calls: map[[2]string]uint64{}, sum: map[string]float64{}, count: map[string]uint64{}}
}

func (m *metrics) observeTool(tool string, ok bool, d time.Duration) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	m.mu.Lock()
	m.calls[[2]string{tool, outcome}]++
	m.sum[tool] += d.Seconds()
	m.count[tool]++
	m.mu.Unlock()
}

func (m *metrics) observeRevive() {
	m.mu.Lock()
	m.revived++
	m.mu.Unlock()
}

func (s *Service) handleMetrics(w http.ResponseWriter, r *http.Request) {
	var b strings.Builder
	m := s.metrics
	m.mu.Lock()
	b.WriteString("# HELP cellbox_tool_calls_total Tool calls by tool and outcome.\n# TYPE cellbox_tool_calls_total counter\n")
	keys := make([][2]string, 0, len(m.calls))
	for k := range m.calls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		fmt.Fprintf(&b, "cellbox_tool_calls_total{tool=%q,outcome=%q} %d\n", k[0], k[1], m.calls[k])
	}
	b.WriteString("# HELP cellbox_tool_duration_seconds Tool call latency.\n# TYPE cellbox_tool_duration_seconds summary\n")
	for _, t := range sortedNames(m.count) {
		fmt.Fprintf(&b, "cellbox_tool_duration_seconds_sum{tool=%q} %g\n", t, m.sum[t])
		fmt.Fprintf(&b, "cellbox_tool_duration_seconds_count{tool=%q} %d\n", t, m.count[t])
	}
	b.WriteString("# HELP cellbox_boxes_revived_total Boxes restarted after they died behind the server's back (agent killed, OOM, container killed).\n# TYPE cellbox_boxes_revived_total counter\n")
	fmt.Fprintf(&b, "cellbox_boxes_revived_total %d\n", m.revived)
	m.mu.Unlock()

	states := map[string]int{}
	s.mu.Lock()
	for _, bx := range s.boxes {
		states[bx.state.String()]++
	}
	pools := map[string]int{}
	for image, p := range s.pools {
		pools[image] = len(p.ready)
	}
	sessions := len(s.sessions)
	s.mu.Unlock()
	b.WriteString("# HELP cellbox_boxes Boxes of sessions by state.\n# TYPE cellbox_boxes gauge\n")
	for _, st := range []boxState{stateRunning, stateSleeping, stateGone, stateDead} {
		fmt.Fprintf(&b, "cellbox_boxes{state=%q} %d\n", st, states[st.String()])
	}
	b.WriteString("# HELP cellbox_pool_ready Pre-started boxes ready in the warm pool, by image.\n# TYPE cellbox_pool_ready gauge\n")
	for _, image := range sortedNames(pools) {
		fmt.Fprintf(&b, "cellbox_pool_ready{image=%q} %d\n", image, pools[image])
	}
	b.WriteString("# HELP cellbox_sessions Sessions.\n# TYPE cellbox_sessions gauge\n")
	fmt.Fprintf(&b, "cellbox_sessions %d\n", sessions)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(b.String()))
}
