// Package membership tells a node who else is in the cluster: their names,
// gossip and HTTP addresses, and whether they are alive, suspected, dead,
// left, or draining (alive but handing their shards off before leaving).
//
// Gossip uses hashicorp/memberlist the way serf does: the memberlist
// delegates are small private adapters that never block and do no I/O; each
// event only records the change and signals a capacity-1 channel, and the one
// consumer (ownership) reconciles from a fresh snapshot.
//
// A node without seeds runs the static membership of one: itself.
package membership

import (
	"encoding/json"
	"time"
)

// ProtocolVersion is carried in node metadata; it changes when nodes of one
// version can no longer serve or forward for nodes of another.
const ProtocolVersion = 1

// State of a member as this node sees it.
type State string

const (
	StateAlive   State = "alive"
	StateSuspect State = "suspect"
	StateDead    State = "dead"
	StateLeft    State = "left"
)

// Member is one node of the cluster.
type Member struct {
	Name          string
	GossipAddress string
	HTTPAddress   string
	State         State
	Protocol      int
	// Draining: the node is leaving; it hands its shards off and takes none.
	Draining bool
}

// Live reports whether the member is still in the cluster (it may hold
// shards): alive or suspected.
func (m Member) Live() bool { return m.State == StateAlive || m.State == StateSuspect }

// Membership is a node's view of the cluster.
type Membership interface {
	// Local is this node.
	Local() Member
	// Members are every node this one knows of, itself included, with the
	// dead and left ones it saw go (forgotten after a while).
	Members() []Member
	// Changes is signalled after the member set, a state or metadata
	// changed. It has capacity 1: read Members after each signal.
	Changes() <-chan struct{}
	// Drain announces that this node is leaving: it stays a member but
	// others stop assigning shards to it.
	Drain() error
	// Leave tells the others this node is gone, then stops gossiping.
	Leave(timeout time.Duration) error
}

// meta is the node metadata peers gossip (memberlist limits it to 512 bytes).
type meta struct {
	HTTP     string `json:"h"`
	Protocol int    `json:"p"`
	Draining bool   `json:"d,omitempty"`
}

func (m meta) encode() []byte {
	b, _ := json.Marshal(m)
	return b
}

func decodeMeta(b []byte) meta {
	var m meta
	_ = json.Unmarshal(b, &m) // a peer with unreadable metadata has no HTTP address
	return m
}

// Static is the membership of a single node with no seeds.
type Static struct {
	local   Member
	changes chan struct{}
}

// NewStatic returns a one-node membership.
func NewStatic(name, httpAddress string) *Static {
	return &Static{
		local:   Member{Name: name, HTTPAddress: httpAddress, State: StateAlive, Protocol: ProtocolVersion},
		changes: make(chan struct{}, 1),
	}
}

// Local implements Membership.
func (s *Static) Local() Member { return s.local }

// Members implements Membership.
func (s *Static) Members() []Member { return []Member{s.local} }

// Changes implements Membership.
func (s *Static) Changes() <-chan struct{} { return s.changes }

// Drain implements Membership: a single node has nobody to hand off to.
func (s *Static) Drain() error { return nil }

// Leave implements Membership.
func (s *Static) Leave(time.Duration) error { return nil }
