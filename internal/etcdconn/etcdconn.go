// Package etcdconn dials the etcd cluster that several cellbox servers
// share, with the settings every part of cellbox on etcd needs: the same
// everywhere, so that a test of a store runs on the client the server
// makes.
package etcdconn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Explain wraps an error of an etcd call made to do what, saying what to
// do where there is something: a request past the server's limits names
// the flag to raise.
func Explain(what string, err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return fmt.Errorf("etcd: %s: more operations than the server's --max-txn-ops allows (raise it: docs/cluster.md asks for 4096): %w", what, err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge), status.Code(err) == codes.ResourceExhausted:
		return fmt.Errorf("etcd: %s: bigger than the server's --max-request-bytes allows (raise it: docs/cluster.md asks for %d; or write less at once): %w", what, MaxRequestBytes, err)
	}
	return fmt.Errorf("etcd: %s: %w", what, err)
}

// MaxRequestBytes is what cellbox asks of the etcd server's
// --max-request-bytes (docs/cluster.md): a cell of 2 MiB is written with
// its change log entry in one commit, which takes twice its bytes. The
// client sends up to this much; a commit the server refuses as too large
// fails saying so.
const MaxRequestBytes = 8 << 20

// Dial connects to the cluster at endpoints and checks that it answers
// within ctx (or 10 s).
func Dial(ctx context.Context, endpoints []string) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("etcd: no endpoints: give --etcd http://HOST:2379[,http://HOST2:2379...]")
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		// Past the server's own limit, so that the server says what is too
		// large (with its flag), not the client.
		MaxCallSendMsgSize: 64 << 20,
		MaxCallRecvMsgSize: math.MaxInt32,
		Logger:             zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Get(cctx, "/cellbox/"); err != nil {
		c.Close()
		return nil, fmt.Errorf("etcd %v does not answer: %w (is the cluster up? check the endpoints and that a majority of its members run)", endpoints, err)
	}
	return c, nil
}
