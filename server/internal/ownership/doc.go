// Package ownership decides which shards this node runs and takes them
// through a versioned claim in the store before any engine starts.
//
// Each shard has one worker goroutine running this state machine:
//
//	         want                 claim ok
//	idle ----------> claiming --------------------> owned (engine running)
//	 ^                 |  ^  conflict / store error     |
//	 |                 |  +--- retry with backoff       | no longer wanted, or
//	 |                 |  +--- live owner: wait for     | fenced out (engine Lost)
//	 |                 |       its release (bounded)    v
//	 |                 | no longer wanted          releasing: stop engine
//	 +-----------------+                           (drain callbacks), release
//	 +-------------------------------------------- the claim if still held
//
// "Want" comes from the Assigner: Rendezvous hashing over the eligible
// members (live, not draining) of this node's membership view, which Follow
// keeps current. On a single node every shard is wanted.
//
// Handoff: when the assignment moves a shard from A to B, A stops wanting it
// and releases it once its engine has drained; B, seeing A still live and
// named as owner, waits for that release (up to HandoffTimeout) and then
// claims. If A is dead, B claims at once. Either way B's claim increments the
// version, so whatever A still tries to write is fenced out.
//
// A node fenced out of a shard it still wants (a node it cannot see claimed
// it: a partition, or views not yet converged) waits up to HandoffTimeout
// for that claimer to release it before claiming it back. Two sides of a
// partition thus hold a shard in turns of about HandoffTimeout instead of
// fencing each other at every write.
//
// Invariants:
//  1. An engine runs only for a shard this node claimed, with the version it
//     claimed; its writes are fenced by that version.
//  2. A claim always reads the shard row first and increments the version it
//     read, so claiming a shard from a stale owner (crashed, partitioned, or
//     still shutting down) fences that owner out.
//  3. A shard is published to routing only while its engine runs; writes for
//     unpublished shards get ErrShardUnavailable and are retried by clients.
//  4. A shard is released (owner cleared) only after its engine stopped, and
//     only if the claim is still ours: releasing never disturbs a newer owner.
//  5. Two nodes that briefly both want a shard (views not yet converged) are
//     resolved by the version: each claim fences the previous claimer, whose
//     engine stops at its next write; acknowledged timers are never lost,
//     only possibly fired again (at-least-once).
package ownership
