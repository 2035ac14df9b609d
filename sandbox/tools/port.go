package tools

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/cellbox/cellbox/sandbox/api"
)

// waitPortTool waits for a port in the box to accept connections. The
// probes are connections through the agent (a refused one costs a unix
// socket round trip, no process in the box), at growing intervals.
func waitPortTool(ctx context.Context, c Call, in api.WaitPortInput) (api.WaitPortOutput, error) {
	out := api.WaitPortOutput{Port: in.Port}
	if in.Port < 1 || in.Port > 65535 {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("port %d is out of range 1-65535", in.Port))
	}
	timeout := time.Duration(cmp.Or(in.TimeoutMs, 30000)) * time.Millisecond
	if in.TimeoutMs < 0 || timeout > maxWaitPort {
		return out, api.WithCode(api.CodeInvalidInput, fmt.Errorf("timeout_ms %d: want 1 to %d", in.TimeoutMs, maxWaitPort.Milliseconds()))
	}
	l, err := c.Box(ctx, in.Sandbox)
	if err != nil {
		return out, err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pause := 5 * time.Millisecond
	for wctx.Err() == nil {
		dctx, dcancel := context.WithTimeout(wctx, 2*time.Second)
		conn, err := l.Client.DialPort(dctx, in.Port)
		dcancel()
		if err == nil {
			conn.Close()
			out.Listening = true
			break
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-wctx.Done():
			t.Stop()
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
	out.WaitedMs = time.Since(start).Milliseconds()
	if !out.Listening {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		c.Notice(fmt.Sprintf("nothing listened on port %d in this sandbox within %s; is the server started (and listening on 127.0.0.1 or 0.0.0.0)?", in.Port, timeout))
	}
	return out, nil
}

// maxWaitPort bounds wait_port's timeout_ms.
const maxWaitPort = 10 * time.Minute
