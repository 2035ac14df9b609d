package lease_test

import (
	"testing"

	"github.com/cellbox/cellbox/sandbox/lease"
	"github.com/cellbox/cellbox/sandbox/lease/leasetest"
)

func TestLocal(t *testing.T) {
	leasetest.Run(t, func(t *testing.T) lease.Leaser { return lease.NewLocal() })
}
