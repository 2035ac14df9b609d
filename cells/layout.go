package cells

// Store layout, version 1: the buckets of a KV (see kv.go) that a Store
// keeps, the same in every KV. In bbolt each is a top-level bucket of one
// file, which other state may share (OpenBoltDB): the sandbox service's
// state store (sandbox/state, schema 2) keeps "meta", "records" and
// "reservations".
//
//	"cellbox"  "layout"   -> decimal layout version ("1"); a store with a
//	                         higher number is refused, one without the key
//	                         but with other buckets is not a cellbox store
//	           "version"  -> uint64 BE: the last commit's version; in bbolt
//	                         only: it is boltKV's revision, put by
//	                         every versioned commit (another KV keeps
//	                         its revision its own way)
//	           "event"    -> uint64 BE: the last event id
//	           "logstart" -> uint64 BE: the oldest version still in "log"
//	           "logbytes" -> uint64 BE: the bytes of the entries in "log"
//	                         (counted at the first commit if missing)
//	"cells"    address "space/pattern/name" -> cell record
//	"schemas"  address -> the cell's JSON Schema
//	"events"   address 0x00 id (uint64 BE) -> event record (queued events)
//	"acks"     address -> uint64 BE: the last acked event id (the receipt)
//	"log"      version (uint64 BE) -> the commit's changes (log entry),
//	                         written by the commit it describes
//	"meta.NAME" client buckets (Tx.Meta): the runtime uses
//	           "meta.runtime.nodes", "meta.runtime.memo",
//	           "meta.runtime.services"
//
// Records are binary, integers as Go varints (encoding/binary):
//
//	cell record:  flags byte (1 stream, 2 has schema) · version uvarint ·
//	              changed unix-nanoseconds varint · error length uvarint ·
//	              error · JSON value (the rest)
//	event record: sent unix-nanoseconds varint · payload (the rest)
//	log entry:    commit unix-nanoseconds varint · count uvarint · count ×
//	              (kind byte (0 cell, 1 event, 2 deleted) · address length
//	              uvarint · address · [kinds 0,1: record length uvarint ·
//	              cell record] · [kind 1: event id uvarint · payload length
//	              uvarint · payload])
const layoutVersion = 1

const (
	bucketInfo    = "cellbox"
	bucketCells   = "cells"
	bucketSchemas = "schemas"
	bucketEvents  = "events"
	bucketAcks    = "acks"
	bucketLog     = "log"
	metaPrefix    = "meta."

	keyLayout   = "layout"
	keyVersion  = "version"
	keyEvent    = "event"
	keyLogStart = "logstart"
	keyLogBytes = "logbytes"
)
