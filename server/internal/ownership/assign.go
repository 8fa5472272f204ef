package ownership

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/membership"
	"github.com/dtimer/dtimer/server/internal/store"
)

// Rendezvous assigns each shard to the eligible node with the highest
// weight hash(node, namespace, shard) (highest random weight hashing): nodes
// with the same view agree, and adding or removing one of N nodes moves only
// the shards it wins or held, about 1/N of them.
type Rendezvous struct {
	mu    sync.RWMutex
	nodes []string
}

// NewRendezvous returns an assigner over nodes.
func NewRendezvous(nodes ...string) *Rendezvous {
	r := &Rendezvous{}
	r.Set(nodes)
	return r
}

// Set replaces the eligible nodes and reports whether they changed.
func (r *Rendezvous) Set(nodes []string) bool {
	nodes = slices.Clone(nodes)
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Equal(nodes, r.nodes) {
		return false
	}
	r.nodes = nodes
	return true
}

// Nodes returns the eligible nodes, sorted.
func (r *Rendezvous) Nodes() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Clone(r.nodes)
}

// Owner implements Assigner; "" when no node is eligible.
func (r *Rendezvous) Owner(k store.ShardKey) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var best string
	var bestW uint64
	for _, n := range r.nodes {
		if w := weight(n, k); best == "" || w > bestW || (w == bestW && n < best) {
			best, bestW = n, w
		}
	}
	return best
}

// weight is FNV-1a 64 of node, NUL, namespace, NUL, shard (big endian).
func weight(node string, k store.ShardKey) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(k.Namespace))
	_, _ = h.Write([]byte{0})
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(k.Shard))
	_, _ = h.Write(b[:])
	return mix(h.Sum64())
}

// mix is a 64-bit finaliser (splitmix64): FNV's low-entropy high bits would
// otherwise make a node win shards in runs.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Eligible are the members that may be assigned shards: live and not
// draining.
func Eligible(members []membership.Member) []string {
	var out []string
	for _, m := range members {
		if m.Live() && !m.Draining {
			out = append(out, m.Name)
		}
	}
	return out
}

// Follow keeps r in step with the membership until the controller stops,
// telling the workers whenever the assignment may have changed. It is the
// one consumer of m.Changes(); call it after Start.
func (c *Controller) Follow(m membership.Membership, r *Rendezvous) {
	ctx := c.ctx
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			members := m.Members()
			c.countMembers(members)
			if r.Set(Eligible(members)) {
				c.log.Info("cluster membership changed", zap.Strings("eligible", r.Nodes()))
			}
			// Liveness of current owners matters to claims even when the
			// eligible set is unchanged (a draining owner that left).
			c.Reassign()
			select {
			case <-m.Changes():
			case <-ctx.Done():
				return
			}
		}
	}()
}

func (c *Controller) countMembers(members []membership.Member) {
	counts := map[string]float64{"alive": 0, "suspect": 0, "dead": 0, "left": 0, "draining": 0}
	for _, mb := range members {
		if mb.Draining && mb.Live() {
			counts["draining"]++
		} else {
			counts[string(mb.State)]++
		}
	}
	for state, n := range counts {
		c.m.Members.WithLabelValues(state).Set(n)
	}
}
