/*
Package state is the contract of the sandbox service's state: the records
it keeps (sessions, boxes, snapshots and their manifests, and in later
steps previews and MCP sessions), the reservations that count its caps,
and the id of its data. One server keeps them in the bbolt file of its data
directory (OpenBolt); several servers share them in a store they all reach
(etcd, in a later step), and this contract is what every implementation
promises. NewMemory keeps them in memory, for tests, and behaves as a
remote store would.

Package statetest is the conformance suite of this contract: every
implementation runs it from its tests and passes all of it, so a caller
never needs to know which store it holds.

# Basics

A Store holds records. A record is a value (bytes the caller encodes, JSON
in the sandbox service) under a key in a Kind: a kind is a namespace, and
one key may name a record in each kind. Every record has a revision, a
number that says which write made it.

Revisions come from one sequence per store. Every commit that puts at
least one record takes a revision greater than every revision the store
gave before, and every record the commit puts gets that revision. So a
record's revision grows with each write of it, two records written by one
commit have the same revision, and a record deleted and put again comes
back with a revision it never had before (no revision is reused: a caller
holding an old revision never matches a new record). Revision 0 is no
record: it is what a caller means by "does not exist".

Get reads one record and List the records of a kind whose keys start with
a prefix, in key order; List is one consistent view (every record as of one
moment). Commit writes a batch of Ops: puts and deletes, each optionally
guarded by the revision the caller read (Op.If). A commit is atomic: every
guard is checked against the state at the commit, and either every op takes
effect or, when a guard fails, none does and Commit returns an error
wrapping ErrConflict.

Reservations count a cap that several servers share: Reserve adds a holder
(a box id, a session id) to a counter ("boxes", "boxes/SESSION",
"sessions") only while fewer than a limit hold it, so that servers that
each check the same counter never admit more than the limit between them.
A holder holds a counter at most once: reserving again is a no-op that
succeeds. Release removes a holder; Holders lists them.

Instance is the id of the store's data: made at random when the data was
first created and the same ever after (across reopens, and for every server
of a shared store). The sandbox service labels its backend boxes with it,
so two services on one engine never take each other's boxes for orphans.

# Read, change, commit: optimistic concurrency

A caller that changes a record reads it (Get, with its revision), computes
the new value, and commits the put guarded by that revision:

	for {
		r, err := st.Get(ctx, state.Boxes, id)
		if err != nil {
			return err
		}
		v, err := change(r.Value)
		if err != nil {
			return err
		}
		_, err = st.Commit(ctx, state.Put(state.Boxes, id, v).If(r.Revision))
		if !errors.Is(err, state.ErrConflict) {
			return err
		}
		// Another writer changed the record since the Get: nothing of
		// this commit was written; read the new record and try again.
	}

On ErrConflict nothing of the commit was written, and the caller must read
again: the conflict says only that some guarded record has another revision
than the one given (it may name the record; it never carries the new
value). Retrying with the same revisions fails again forever; retrying
without the guard overwrites the other writer's change. A caller that
creates a record guards the put with If(0), so that two creators of one key
never both succeed. An unguarded op does not look at what is there: a put
overwrites, a delete of a missing record does nothing. Guards are how
several servers share records without a lock; a single process that keeps
the records' only copy (the sandbox service today) may write unguarded.

# Caveats

Commit and Reserve are not atomic together. A caller that counts a record
against a cap reserves first and commits after, releasing the reservation
when the commit fails; a process that dies between the two leaves a
reservation without a record (or, releasing after deleting, a record
without a reservation), which the caller reconciles at start by comparing
Holders with its records. Reservations are not leases: they stay until
released, also when the process that made them is gone.

A context ends a call before it starts: a call with a done context returns
the context's error and writes nothing. A call already under way may not
stop (a bbolt transaction is not interruptible), and with a remote store a
commit whose context ends while it is in flight may or may not have been
applied: the error does not say which. A caller that must know reads the
records again; a caller whose in-memory state already assumes the write
(the sandbox service) passes a context that is not cancelled.

Values are copied in and out: Commit keeps no reference to an Op's Value,
and the Values Get and List return are the caller's to keep and change.
The empty value and a nil Value are the same value, and a returned Value is
never nil.

Stores refuse what the contract does not define, with an error wrapping
ErrInvalid and nothing written: a kind that is not 1 to 64 bytes of a-z,
0-9 and '_'; an empty key, counter or holder, or one of more than MaxKey
bytes; two ops of one commit on the same record (a batch names each record
once, as an etcd transaction does). Keys are bytes: any byte may appear,
and they sort bytewise. No value size limit is set by this contract: bbolt
and memory take any size, a remote store may refuse a commit past its
request limit (etcd's default is 1.5 MiB) with an error of its own; large
manifests are that implementation's concern.

A Store is safe for concurrent use by many goroutines, and a shared one by
many processes. Close ends the store's use: every later call fails with an
error wrapping ErrClosed, and Close again returns nil. Close does not wait
for calls under way; it is the one method without a context (io.Closer).
*/
package state
