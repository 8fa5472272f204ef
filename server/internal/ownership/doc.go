// Package ownership decides which shards this node runs and takes them
// through a versioned claim in the store before any engine starts.
//
// Each shard has one worker goroutine running this state machine:
//
//	         want                 claim ok
//	idle ----------> claiming --------------------> owned (engine running)
//	 ^                 |  ^  conflict / store error     |
//	 |                 |  +--- retry with backoff       | no longer wanted, or
//	 |                 | no longer wanted               | fenced out (engine Lost)
//	 +-----------------+                                v
//	 +------------------------------------------- releasing: stop engine
//	                                               (drain callbacks), release
//	                                               the claim if still held
//
// "Want" comes from the Assigner: the node that should own a shard given the
// current membership. On a single node every shard is wanted; the gossip
// cluster only changes the Assigner.
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
package ownership
