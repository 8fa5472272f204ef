// Package engine runs one owned shard: it keeps the shard's due timers in
// memory, fires each at its due time through the node's callback pool, and
// removes completed timers from the store in range deletes instead of one by
// one.
//
// # Window, queue, gate
//
// The engine reads the shard's pending timers in Position order (due time,
// then UUID) in windows: one read returns up to BatchReadLimit rows due
// within MaxLookAhead of now, starting after loadedUpTo, the position the
// previous read ended at. A short read means the window now reaches
// now+MaxLookAhead; a full one means more rows wait, and the engine reads on
// while its queue (QueueSize open entries) has room. The next read happens
// when the window reaches less than MinLookAhead past now. An idle shard thus
// costs one read per MaxLookAhead-MinLookAhead, and a busy one one read per
// BatchReadLimit timers.
//
// Timers live in two heaps ordered by Position: the fire heap of waiting
// entries, whose top arms the loop's single timer gate, and the order heap of
// every entry until it is popped.
//
//	         read / API write            due                 callback
//	(store) ----------------> waiting ---------> firing -----------------> fired
//	                            |  ^               |  outcome: retry,        |
//	               write begins |  | write fails   |  reschedule, fail       | popped in order,
//	                            v  |               v  (fenced move)          v range-deleted
//	                           held ---------->  gone  <------------------- (row removed)
//	                                write applies
//
// # Invariants
//
//  1. Complete view: every pending row of the shard at or before loadedUpTo
//     is in memory as an open entry, or was fired and completed. Reads add
//     rows; API writes add their new row before the write (held, not yet
//     fireable) when it falls at or before the horizon (loadedUpTo, or the
//     end of the read in flight); a read that ends while a write is in
//     flight adds the write's row and holds the row it replaces.
//  2. Range deletes remove only fired rows: the order heap is popped from
//     the front while its top is fired or gone and not past loadedUpTo; the
//     last fired entry popped is deletableUpTo, and a range delete removes
//     rows at or before it. By (1) every row there is fired or gone.
//  3. Nothing is written behind the fired prefix: a write whose position is
//     at or before deletableUpTo is due already and is moved to one
//     millisecond after it, so no range delete can reach an unfired row.
//  4. A timer never fires while a write of it is in flight (held), and an
//     outcome is never persisted over a write made while its callback ran
//     (superseded).
//  5. A retry, reschedule or failure moves the row (fenced, conditional on
//     its old due time) before its old entry stops being open, so the old
//     position can be range-deleted only after the row left it. An outcome
//     whose write may or may not have applied is resolved by reading the row.
//  6. Every write is fenced by the shard version: once another node claims
//     the shard, this engine's writes fail, it stops, and the new owner,
//     which read the store after its claim, has the complete view.
//
// A timer is fired when the clock reaches its due time, never before; after
// a crash the next owner fires again what was fired but not yet
// range-deleted (at-least-once), and nothing that was not yet due twice.
package engine
