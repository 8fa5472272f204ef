package membership

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// startNode runs a gossip node on a loopback port the system picks, with
// timings short enough for tests.
func startNode(t *testing.T, name string, seeds ...string) *Gossip {
	t.Helper()
	g, err := StartGossip(GossipConfig{
		NodeName: name, BindAddress: "127.0.0.1:0", HTTPAddress: "127.0.0.1:1" + name[len(name)-1:],
		Seeds: seeds, ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond,
		SuspicionMult: 2, GossipInterval: 20 * time.Millisecond, PushPullInterval: time.Second,
		RetryJoinInterval: 50 * time.Millisecond, Logger: zap.NewNop(), // memberlist logs after Shutdown returns
	})
	require.NoError(t, err)
	return g
}

// freeTCPAndUDP returns a 127.0.0.1 address whose port is free for both TCP
// and UDP now: memberlist binds both, and a port checked for UDP alone was
// seen taken on the TCP side by the time the seed started.
func freeTCPAndUDP(t *testing.T) string {
	t.Helper()
	for range 50 {
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		a := tl.Addr().String()
		ul, err := net.ListenPacket("udp", a)
		_ = tl.Close()
		if err == nil {
			_ = ul.Close()
			return a
		}
	}
	t.Fatal("no port free for both TCP and UDP")
	return ""
}

func addr(g *Gossip) string {
	n := g.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

func states(g *Gossip) map[string]Member {
	out := map[string]Member{}
	for _, m := range g.Members() {
		out[m.Name] = m
	}
	return out
}

func TestGossipConvergesAndTracksDeparture(t *testing.T) {
	a := startNode(t, "node-1")
	defer a.Leave(time.Second)
	b := startNode(t, "node-2", addr(a))
	c := startNode(t, "node-3", addr(a))
	defer c.Leave(time.Second)

	for _, g := range []*Gossip{a, b, c} {
		require.Eventually(t, func() bool {
			s := states(g)
			return len(s) == 3 && s["node-1"].Live() && s["node-2"].Live() && s["node-3"].Live()
		}, 10*time.Second, 10*time.Millisecond, "%s did not see all three", g.Local().Name)
	}
	m := states(a)["node-2"]
	require.Equal(t, "127.0.0.1:12", m.HTTPAddress, "metadata carries the HTTP address")
	require.Equal(t, ProtocolVersion, m.Protocol)
	require.Equal(t, addr(b), m.GossipAddress)
	select {
	case <-a.Changes():
	default:
		t.Fatal("joins were not signalled")
	}

	// Drain is seen by peers as metadata.
	require.NoError(t, c.Drain())
	require.True(t, c.Local().Draining)
	require.Eventually(t, func() bool { return states(a)["node-3"].Draining }, 10*time.Second, 10*time.Millisecond)

	// A crash (no leave message) is detected as dead; a leave as left.
	require.NoError(t, b.ml.Shutdown())
	b.stopOnce.Do(func() { close(b.stop) })
	b.wg.Wait()
	require.Eventually(t, func() bool { return states(a)["node-2"].State == StateDead }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return states(c)["node-2"].State == StateDead }, 10*time.Second, 10*time.Millisecond)
}

func TestGossipDrainThenLeaveIsSeenAsLeft(t *testing.T) {
	a := startNode(t, "node-1")
	defer a.Leave(time.Second)
	b := startNode(t, "node-2", addr(a))
	require.Eventually(t, func() bool { return len(states(a)) == 2 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.Drain())
	require.Eventually(t, func() bool { return states(a)["node-2"].Draining }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, b.Leave(time.Second))
	require.Eventually(t, func() bool { return states(a)["node-2"].State == StateLeft }, 10*time.Second, 10*time.Millisecond)
}

func TestGossipJoinsASeedThatStartsLater(t *testing.T) {
	// Find a port for the seed, then start the joiner first.
	seedAddr := freeTCPAndUDP(t)

	b := startNode(t, "node-2", seedAddr)
	defer b.Leave(time.Second)
	select {
	case <-b.Tried():
	case <-time.After(10 * time.Second):
		t.Fatal("first join attempt never finished")
	}
	require.Len(t, b.Members(), 1, "alone until the seed starts")

	a, err := StartGossip(GossipConfig{
		NodeName: "node-1", BindAddress: seedAddr, HTTPAddress: "127.0.0.1:11",
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond, SuspicionMult: 2,
		GossipInterval: 20 * time.Millisecond, Logger: zap.NewNop(),
	})
	require.NoError(t, err)
	defer a.Leave(time.Second)
	require.Eventually(t, func() bool { return len(states(b)) == 2 && len(states(a)) == 2 }, 10*time.Second, 10*time.Millisecond)
}

func TestStaticIsOneNode(t *testing.T) {
	s := NewStatic("solo", "127.0.0.1:8080")
	require.Equal(t, []Member{{Name: "solo", HTTPAddress: "127.0.0.1:8080", State: StateAlive, Protocol: ProtocolVersion}}, s.Members())
	require.True(t, s.Local().Live())
	require.NoError(t, s.Drain())
	require.NoError(t, s.Leave(time.Second))
}
