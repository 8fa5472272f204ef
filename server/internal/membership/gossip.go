package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// GossipConfig configures a gossip membership.
type GossipConfig struct {
	NodeName string
	// BindAddress is the gossip host:port (UDP and TCP).
	BindAddress string
	// AdvertiseAddress is the host:port peers reach this node's gossip at,
	// when it differs from BindAddress (NAT, 0.0.0.0 binds).
	AdvertiseAddress string
	// HTTPAddress is the host:port peers forward API calls to.
	HTTPAddress string
	// Seeds are host:port peers to join, or DNS names whose SRV or A records
	// list them (a Kubernetes headless service).
	Seeds []string
	// DefaultPort is used for seeds given without one.
	DefaultPort   int
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int
	// SuspicionMaxTimeoutMult bounds the suspicion timeout when no peer
	// confirms it (small clusters): SuspicionMaxTimeoutMult times the base.
	SuspicionMaxTimeoutMult int
	GossipInterval          time.Duration
	PushPullInterval        time.Duration
	// RetryJoinInterval: while a node knows no peer it retries the seeds.
	RetryJoinInterval time.Duration
	Logger            *zap.Logger
}

// Gossip is a memberlist-backed Membership.
type Gossip struct {
	cfg     GossipConfig
	ml      *memberlist.Memberlist
	log     *zap.Logger
	changes chan struct{}

	mu   sync.Mutex
	meta meta
	// members is kept from memberlist's events, which run under its lock;
	// the *Node values it hands out are not safe to read later.
	members map[string]known

	tried     chan struct{} // closed after the first attempt to join the seeds
	triedOnce sync.Once
	stop      chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
}

type known struct {
	m      Member
	goneAt time.Time // when it died or left; zero while live
}

// forgetAfter bounds how long a dead or left member is still listed.
const forgetAfter = 10 * time.Minute

var _ Membership = (*Gossip)(nil)

// StartGossip binds the gossip port and starts joining the seeds in the
// background; it does not wait for a peer to answer, so nodes can start in
// any order.
func StartGossip(cfg GossipConfig) (*Gossip, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	g := &Gossip{
		cfg:     cfg,
		log:     cfg.Logger,
		changes: make(chan struct{}, 1),
		meta:    meta{HTTP: cfg.HTTPAddress, Protocol: ProtocolVersion},
		members: make(map[string]known),
		tried:   make(chan struct{}),
		stop:    make(chan struct{}),
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeName
	host, port, err := splitHostPort(cfg.BindAddress)
	if err != nil {
		return nil, fmt.Errorf("cluster.bind_address: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertisePort = port
	if cfg.AdvertiseAddress != "" {
		host, port, err := splitHostPort(cfg.AdvertiseAddress)
		if err != nil {
			return nil, fmt.Errorf("cluster.advertise_address: %w", err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = host, port
	}
	if cfg.ProbeInterval > 0 {
		mc.ProbeInterval = cfg.ProbeInterval
	}
	if cfg.ProbeTimeout > 0 {
		mc.ProbeTimeout = cfg.ProbeTimeout
	}
	if cfg.SuspicionMult > 0 {
		mc.SuspicionMult = cfg.SuspicionMult
	}
	if cfg.SuspicionMaxTimeoutMult > 0 {
		mc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	}
	if cfg.GossipInterval > 0 {
		mc.GossipInterval = cfg.GossipInterval
	}
	if cfg.PushPullInterval > 0 {
		mc.PushPullInterval = cfg.PushPullInterval
	}
	mc.Delegate = &metaDelegate{g}
	mc.Events = &eventDelegate{g}
	mc.Logger = log.New(&logWriter{g.log}, "", 0)
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("start gossip on %s: %w", cfg.BindAddress, err)
	}
	g.ml = ml
	g.wg.Add(1)
	go g.joinLoop()
	return g, nil
}

func splitHostPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", hp)
	}
	return host, port, nil
}

func (g *Gossip) signal() {
	select {
	case g.changes <- struct{}{}:
	default:
	}
}

// Local implements Membership.
func (g *Gossip) Local() Member {
	n := g.ml.LocalNode()
	g.mu.Lock()
	m := g.meta
	g.mu.Unlock()
	return Member{Name: n.Name, GossipAddress: n.Address(), HTTPAddress: m.HTTP, State: StateAlive, Protocol: m.Protocol, Draining: m.Draining}
}

// Members implements Membership, sorted by name. memberlist does not tell
// a suspected node from an alive one, so live members are all "alive"; a
// departed member is "left" if it drained first (a graceful stop) and
// "dead" otherwise.
func (g *Gossip) Members() []Member {
	g.mu.Lock()
	out := make([]Member, 0, len(g.members))
	for name, k := range g.members {
		if !k.goneAt.IsZero() && time.Since(k.goneAt) > forgetAfter {
			delete(g.members, name)
			continue
		}
		out = append(out, k.m)
	}
	g.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func toMember(n *memberlist.Node) Member {
	md := decodeMeta(n.Meta)
	return Member{Name: n.Name, GossipAddress: n.Address(), HTTPAddress: md.HTTP, State: StateAlive, Protocol: md.Protocol, Draining: md.Draining}
}

// Tried is closed once the node has tried its seeds the first time, joined
// or not: a node that starts claiming shards before that would take them
// from live owners it does not know of yet.
func (g *Gossip) Tried() <-chan struct{} { return g.tried }

// Changes implements Membership.
func (g *Gossip) Changes() <-chan struct{} { return g.changes }

// Drain implements Membership: the new metadata reaches peers with the next
// gossip.
func (g *Gossip) Drain() error {
	g.mu.Lock()
	g.meta.Draining = true
	g.mu.Unlock()
	g.signal()
	return g.ml.UpdateNode(5 * time.Second)
}

// Leave implements Membership.
func (g *Gossip) Leave(timeout time.Duration) error {
	g.stopOnce.Do(func() { close(g.stop) })
	g.wg.Wait()
	err := g.ml.Leave(timeout)
	return errors.Join(err, g.ml.Shutdown())
}

// joinLoop joins the seeds, and joins them again whenever this node finds
// itself alone (all peers dead, or none started yet).
func (g *Gossip) joinLoop() {
	defer g.wg.Done()
	defer g.triedOnce.Do(func() { close(g.tried) })
	if len(g.cfg.Seeds) == 0 {
		return
	}
	interval := g.cfg.RetryJoinInterval
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		if g.ml.NumMembers() <= 1 {
			addrs := g.resolveSeeds()
			if len(addrs) > 0 {
				n, err := g.ml.Join(addrs)
				if err != nil && g.ml.NumMembers() <= 1 {
					g.log.Debug("no seed answered yet; retrying", zap.Strings("seeds", addrs), zap.Error(err))
				} else if n > 0 {
					g.log.Info("joined the cluster", zap.Int("members", g.ml.NumMembers()))
				}
			}
		}
		g.triedOnce.Do(func() { close(g.tried) })
		t.Reset(interval)
	}
}

// resolveSeeds expands seeds: host:port as given (names resolved by
// memberlist), a bare name by its SRV records, else by its A/AAAA records on
// the default port.
func (g *Gossip) resolveSeeds() []string {
	self := map[string]bool{}
	if n := g.ml.LocalNode(); n != nil {
		self[n.Address()] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []string
	add := func(a string) {
		if !self[a] {
			out = append(out, a)
		}
	}
	for _, s := range g.cfg.Seeds {
		if _, _, err := net.SplitHostPort(s); err == nil {
			add(s)
			continue
		}
		if _, srvs, err := net.DefaultResolver.LookupSRV(ctx, "", "", s); err == nil && len(srvs) > 0 {
			for _, r := range srvs {
				add(net.JoinHostPort(r.Target, strconv.Itoa(int(r.Port))))
			}
			continue
		}
		hosts, err := net.DefaultResolver.LookupHost(ctx, s)
		if err != nil {
			g.log.Debug("seed does not resolve yet", zap.String("seed", s), zap.Error(err))
			continue
		}
		for _, h := range hosts {
			add(net.JoinHostPort(h, strconv.Itoa(g.cfg.DefaultPort)))
		}
	}
	return out
}

// metaDelegate serves this node's metadata; the other memberlist.Delegate
// hooks are unused (no user messages or state).
type metaDelegate struct{ g *Gossip }

func (d *metaDelegate) NodeMeta(limit int) []byte {
	d.g.mu.Lock()
	b := d.g.meta.encode()
	d.g.mu.Unlock()
	if len(b) > limit {
		return nil // cannot happen with our small fields; never break gossip
	}
	return b
}
func (d *metaDelegate) NotifyMsg([]byte)                           {}
func (d *metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *metaDelegate) LocalState(join bool) []byte                { return nil }
func (d *metaDelegate) MergeRemoteState(buf []byte, join bool)     {}

// eventDelegate records members and signals; it never blocks.
type eventDelegate struct{ g *Gossip }

func (d *eventDelegate) NotifyJoin(n *memberlist.Node)   { d.g.record(toMember(n), false) }
func (d *eventDelegate) NotifyUpdate(n *memberlist.Node) { d.g.record(toMember(n), false) }
func (d *eventDelegate) NotifyLeave(n *memberlist.Node)  { d.g.record(toMember(n), true) }

func (g *Gossip) record(m Member, gone bool) {
	g.mu.Lock()
	k := known{m: m}
	if gone {
		prev := g.members[m.Name].m
		k.m.State = StateDead
		if prev.Draining || m.Draining {
			k.m.State = StateLeft
		}
		k.goneAt = time.Now()
	}
	g.members[m.Name] = k
	g.mu.Unlock()
	g.signal()
}

// logWriter turns memberlist's "[LEVEL] memberlist: ..." lines into zap
// entries at that level.
type logWriter struct{ log *zap.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	switch {
	case bytes.Contains(p, []byte("[ERR]")):
		w.log.Error(line)
	case bytes.Contains(p, []byte("[WARN]")):
		w.log.Warn(line)
	case bytes.Contains(p, []byte("[INFO]")):
		w.log.Info(line)
	default:
		w.log.Debug(line)
	}
	return len(p), nil
}
