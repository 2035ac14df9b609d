package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// paceServer serves a handler that reads the whole body and answers its
// length and digest, behind WithBodyPace(p).
func paceServer(t *testing.T, p BodyPace) string {
	srv := httptest.NewServer(WithBodyPace(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, "read: "+err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	})))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// send writes a request whose body comes in chunks of size every, then
// reads the answer (or the connection's end).
func send(t *testing.T, addr string, chunks int, size int, every time.Duration) (status int, body string) {
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /up HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", addr, chunks*size)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		chunk := bytes.Repeat([]byte("x"), size)
		for range chunks {
			if _, err := conn.Write(chunk); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(every):
			}
		}
	}()
	conn.SetReadDeadline(time.Now().Add(time.Minute)) // the test's patience
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A body dribbled a byte at a time is cut with 408 once its grace is
// spent, long before the whole-body limit; a body that keeps up the
// minimum rate, however long, and a large one sent at once are read whole.
func TestBodyPace(t *testing.T) {
	addr := paceServer(t, BodyPace{Grace: 500 * time.Millisecond, MinRate: 100, Max: 5 * time.Minute})

	t.Run("dribbled", func(t *testing.T) {
		begin := time.Now()
		status, body := send(t, addr, 10_000, 1, 100*time.Millisecond)
		assert.Equal(t, http.StatusRequestTimeout, status, body)
		assert.Contains(t, body, "request body too slow")
		assert.Contains(t, body, "--body-min-rate")
		assert.Less(t, time.Since(begin), 30*time.Second, "cut by its pace, not the 5 minutes of --body-timeout")
	})
	t.Run("at ten times the minimum", func(t *testing.T) {
		status, body := send(t, addr, 20, 100, 100*time.Millisecond) // 1000 B/s for 2 s, 4× the grace
		assert.Equal(t, http.StatusOK, status, body)
		assert.True(t, strings.HasPrefix(body, "2000 "), body)
	})
	t.Run("large, at once", func(t *testing.T) {
		status, body := send(t, addr, 64, 1<<20, 0)
		assert.Equal(t, http.StatusOK, status, body)
		assert.True(t, strings.HasPrefix(body, fmt.Sprint(64<<20)+" "), body)
	})
	t.Run("within the whole-body limit", func(t *testing.T) {
		addr := paceServer(t, BodyPace{Grace: 200 * time.Millisecond, MinRate: 1 << 30, Max: 300 * time.Millisecond})
		status, body := send(t, addr, 100, 100, 100*time.Millisecond)
		assert.Equal(t, http.StatusRequestTimeout, status, body)
	})
}

func TestBodyPaceDeadline(t *testing.T) {
	start := time.Unix(1000, 0)
	p := BodyPace{Grace: 10 * time.Second, MinRate: 1000, Max: time.Minute}
	assert.Equal(t, start.Add(10*time.Second), p.deadline(start, 0))
	assert.Equal(t, start.Add(12*time.Second), p.deadline(start, 2000), "a second per minRate bytes")
	assert.Equal(t, start.Add(time.Minute), p.deadline(start, 1<<40), "never past max")
	assert.Equal(t, start.Add(time.Minute), BodyPace{Grace: 10 * time.Second, Max: time.Minute}.deadline(start, 0), "no minimum: max")
}
