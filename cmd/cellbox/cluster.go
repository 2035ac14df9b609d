//go:build cluster

package main

// Built with -tags cluster (as cellbox-cluster), cellbox serves --etcd,
// --blobs and --backend kubernetes itself (needCluster).
import _ "github.com/cellbox/cellbox/server/cluster"
