package engine

import (
	"container/heap"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// state is where an entry is in its life.
type state int

const (
	// waiting: in the fire heap, fires when due.
	waiting state = iota
	// held: a write for this timer is in flight; it must not fire until the
	// write's outcome is known (then it becomes waiting or gone).
	held
	// firing: its callback is running, or its outcome is being persisted.
	firing
	// fired: the callback completed the timer; its row is left for the next
	// range delete.
	fired
	// gone: its row is no longer at this position (deleted, moved, or never
	// written); nothing to fire, nothing to range-delete.
	gone
)

// entry is one pending timer row the engine knows of, at one position.
type entry struct {
	t       *timer.Timer
	pos     timer.Position
	state   state
	fireIdx int // index in the fire heap; -1 when not in it
	// superseded: a write replaced or deleted the timer while it was firing,
	// so the attempt's outcome must not be persisted over that write.
	superseded bool
}

func (e *entry) open() bool { return e.state != fired && e.state != gone }

// fireHeap holds the waiting entries by position; the top is the next to fire.
type fireHeap []*entry

func (h fireHeap) Len() int           { return len(h) }
func (h fireHeap) Less(i, j int) bool { return h[i].pos.Compare(h[j].pos) < 0 }
func (h fireHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].fireIdx = i
	h[j].fireIdx = j
}
func (h *fireHeap) Push(x any) {
	e := x.(*entry)
	e.fireIdx = len(*h)
	*h = append(*h, e)
}
func (h *fireHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.fireIdx = -1
	return e
}

func (h *fireHeap) add(e *entry) { heap.Push(h, e) }

func (h *fireHeap) remove(e *entry) {
	if e.fireIdx >= 0 {
		heap.Remove(h, e.fireIdx)
	}
}

func (h fireHeap) peek() *entry {
	if len(h) == 0 {
		return nil
	}
	return h[0]
}

// orderHeap holds every entry the engine created, by position, until it is
// popped from the top once no longer open. Popping in order is what finds the
// completed prefix: the fired entries before the first open one.
type orderHeap []*entry

func (h orderHeap) Len() int           { return len(h) }
func (h orderHeap) Less(i, j int) bool { return h[i].pos.Compare(h[j].pos) < 0 }
func (h orderHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *orderHeap) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *orderHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
