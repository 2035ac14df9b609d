package agent

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// outPipe reads one output pipe of a command on a goroutine of its own and
// hands each chunk to its sink, in order.
//
// settle answers once every byte written to the pipe before it was called
// has reached the sink, however late that goroutine gets to run: it ends a
// blocked read with a read deadline, and the goroutine then reads what the
// pipe still holds (FIONREAD) before it answers. A read deadline alone is
// not enough: once it has passed, os.File.Read fails without reading, and
// the bytes still buffered in the pipe were dropped (an agent starved of
// CPU for a moment lost the whole output of a command that had exited).
//
// Hand-written because no library reads a pipe up to a point in time: the
// standard library's deadlines are the closest, and they are what lost it.
type outPipe struct {
	f    *os.File
	sink func([]byte) // the reading goroutine's own; nil once a settle stopped it

	mu   sync.Mutex
	reqs []settleReq
	eof  chan struct{} // closed when every writer has closed (or the read failed)
}

type settleReq struct {
	stop bool      // drop what comes after
	done chan bool // gets whether every writer had closed
}

// pipeReadDelay, when set (tests only), is slept before each read of an
// outPipe: an agent starved of CPU between a command's exit and the read.
var pipeReadDelay atomic.Int64

func newOutPipe(f *os.File, sink func([]byte)) *outPipe {
	p := &outPipe{f: f, sink: sink, eof: make(chan struct{})}
	go p.run()
	return p
}

func (p *outPipe) run() {
	defer func() {
		p.f.Close()
		p.mu.Lock()
		close(p.eof)
		p.mu.Unlock()
	}()
	buf := make([]byte, chunkSize)
	for {
		if d := pipeReadDelay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		n, err := p.f.Read(buf)
		if n > 0 && p.sink != nil {
			p.sink(buf[:n])
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || p.settleRound(buf) {
			return
		}
	}
}

// settleRound answers the settle requests made so far; it reports whether
// the pipe has ended.
func (p *outPipe) settleRound(buf []byte) bool {
	p.mu.Lock()
	reqs := p.reqs
	p.reqs = nil
	p.f.SetReadDeadline(time.Time{}) // a later request sets it again
	p.mu.Unlock()
	ended := p.readBuffered(buf)
	for _, r := range reqs {
		if r.stop {
			p.sink = nil
		}
	}
	for _, r := range reqs {
		r.done <- ended
	}
	return ended
}

// readBuffered hands the sink what the pipe holds now, and reports whether
// every writer has closed it (then it reads it to the end).
func (p *outPipe) readBuffered(buf []byte) (ended bool) {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return true
	}
	give := func(b []byte) {
		if p.sink != nil {
			p.sink(b)
		}
	}
	cerr := rc.Control(func(fd uintptr) {
		// The file is non-blocking: a read with nothing left returns
		// EAGAIN, never waits.
		read := func(limit int) bool { // false when nothing more can be read
			for limit > 0 {
				n, err := unix.Read(int(fd), buf[:min(limit, len(buf))])
				if n > 0 {
					give(buf[:n])
					limit -= n
				}
				if err == unix.EINTR {
					continue
				}
				if err != nil || n <= 0 {
					return n == 0 && err == nil // 0, nil: end of file
				}
			}
			return false
		}
		n, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
		if err != nil {
			ended = true
			return
		}
		if read(n) { // it ended within what was buffered
			ended = true
			return
		}
		// Whether any writer still holds it: when none does, what came
		// since is bounded by the pipe's size, and is read too.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, 0); err == nil && fds[0].Revents&unix.POLLHUP != 0 {
			read(1 << 30)
			ended = true
		}
	})
	return ended || cerr != nil
}

// settle returns once every byte written to the pipe before the call has
// reached the sink, and says whether every writer has closed the pipe.
// With stop, nothing later reaches the sink (the pipe is still drained, so
// a writer never blocks on it).
func (p *outPipe) settle(stop bool) (ended bool) {
	done := make(chan bool, 1)
	p.mu.Lock()
	select {
	case <-p.eof:
		p.mu.Unlock()
		return true
	default:
	}
	p.reqs = append(p.reqs, settleReq{stop: stop, done: done})
	p.f.SetReadDeadline(time.Unix(1, 0)) // long past: a blocked read returns now
	p.mu.Unlock()
	select {
	case ended := <-done:
		return ended
	case <-p.eof:
		return true
	}
}

// ended is closed when every writer has closed the pipe.
func (p *outPipe) ended() <-chan struct{} { return p.eof }
