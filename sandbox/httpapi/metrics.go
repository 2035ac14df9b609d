package httpapi

import (
	"fmt"
	"net/http"
	"strings"
)

// handleMetrics serves the service's metrics (sandbox.Service.Metrics) in
// the Prometheus text format.
func (s *server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m := s.svc.Metrics()
	var b strings.Builder
	b.WriteString("# HELP cellbox_tool_calls_total Tool calls by tool and outcome.\n# TYPE cellbox_tool_calls_total counter\n")
	for _, t := range m.Tools {
		for _, c := range []struct {
			outcome string
			n       uint64
		}{{"error", t.Error}, {"ok", t.OK}} {
			if c.n > 0 {
				fmt.Fprintf(&b, "cellbox_tool_calls_total{tool=%q,outcome=%q} %d\n", t.Tool, c.outcome, c.n)
			}
		}
	}
	b.WriteString("# HELP cellbox_tool_duration_seconds Tool call latency.\n# TYPE cellbox_tool_duration_seconds summary\n")
	for _, t := range m.Tools {
		fmt.Fprintf(&b, "cellbox_tool_duration_seconds_sum{tool=%q} %g\n", t.Tool, t.Seconds)
		fmt.Fprintf(&b, "cellbox_tool_duration_seconds_count{tool=%q} %d\n", t.Tool, t.OK+t.Error)
	}
	b.WriteString("# HELP cellbox_boxes_revived_total Boxes restarted after they died behind the server's back (agent killed, OOM, container killed).\n# TYPE cellbox_boxes_revived_total counter\n")
	fmt.Fprintf(&b, "cellbox_boxes_revived_total %d\n", m.Revived)
	b.WriteString("# HELP cellbox_boxes Boxes of sessions by state.\n# TYPE cellbox_boxes gauge\n")
	for _, c := range m.Boxes {
		fmt.Fprintf(&b, "cellbox_boxes{state=%q} %d\n", c.Label, c.N)
	}
	b.WriteString("# HELP cellbox_pool_ready Pre-started boxes ready in the warm pool, by image.\n# TYPE cellbox_pool_ready gauge\n")
	for _, c := range m.PoolReady {
		fmt.Fprintf(&b, "cellbox_pool_ready{image=%q} %d\n", c.Label, c.N)
	}
	b.WriteString("# HELP cellbox_sessions Sessions.\n# TYPE cellbox_sessions gauge\n")
	fmt.Fprintf(&b, "cellbox_sessions %d\n", m.Sessions)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.Write([]byte(b.String()))
}
