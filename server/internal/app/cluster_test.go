package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/dtimer/dtimer/server/internal/app"
	"github.com/dtimer/dtimer/server/internal/config"
)

// These tests run whole nodes (app.Run) in this process: real memberlist on
// loopback with short timings, one SQLite database file shared by every
// node, and a real callback receiver. Crashes (kill -9) are left to the
// process-level chaos test in e2e.

const numShards = 8

// testCluster is a set of nodes on one store.
type testCluster struct {
	t      *testing.T
	dbPath string
	logs   *syncBuffer
}

func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t, dbPath: filepath.Join(t.TempDir(), "dtimer.db"), logs: &syncBuffer{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node logs:\n%s", c.logs.String())
		}
	})
	return c
}

// node is one app.Run in this process.
type node struct {
	name   string
	gossip string
	url    string
	cancel context.CancelFunc
	done   chan error
}

// start runs a node that joins seeds (none: a single node) and waits until
// it serves. The node stops gracefully when the test ends, if still running.
func (c *testCluster) start(name, gossip string, seeds ...string) *node {
	return c.startWith(nil, name, gossip, seeds...)
}

// startWith is start with tune applied to the configuration.
func (c *testCluster) startWith(tune func(*config.Config), name, gossip string, seeds ...string) *node {
	t := c.t
	t.Helper()
	cfg, err := config.Load("")
	require.NoError(t, err)
	cfg.HTTP.Address = "127.0.0.1:0"
	cfg.Store.Driver, cfg.Store.SQLite.Path, cfg.Store.SQLite.Synchronous = "sqlite", c.dbPath, "NORMAL"
	cfg.Namespaces = []config.Namespace{{Name: "default", NumShards: numShards}}
	cfg.Cluster.NodeName, cfg.Cluster.BindAddress, cfg.Cluster.Seeds = name, gossip, seeds
	cfg.Cluster.ProbeInterval, cfg.Cluster.ProbeTimeout = 100*time.Millisecond, 50*time.Millisecond
	cfg.Cluster.SuspicionMult, cfg.Cluster.GossipInterval = 2, 20*time.Millisecond
	cfg.Engine.DeleteInterval = 100 * time.Millisecond
	cfg.Shutdown.DrainTimeout = 2 * time.Second
	if tune != nil {
		tune(cfg)
	}
	require.NoError(t, cfg.Validate())

	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(c.logs), zap.InfoLevel)).
		With(zap.String("node", name))
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{name: name, gossip: gossip, cancel: cancel, done: make(chan error, 1)}
	addr := make(chan net.Addr, 1)
	go func() { n.done <- app.Run(ctx, cfg, log, func(a net.Addr) { addr <- a }) }()
	select {
	case a := <-addr:
		n.url = "http://" + a.String()
	case err := <-n.done:
		t.Fatalf("node %s did not start: %v", name, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("node %s did not serve within 30s", name)
	}
	t.Cleanup(func() { n.stop(t) })
	return n
}

// stop stops the node gracefully (SIGTERM) and waits for Run to return.
func (n *node) stop(t *testing.T) {
	t.Helper()
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		require.NoError(t, err, "node %s stopped with an error", n.name)
	case <-time.After(30 * time.Second):
		t.Fatalf("node %s did not stop within 30s", n.name)
	}
}

// view is this node's GET /api/v1/cluster.
type view struct {
	Node    string `json:"node"`
	Members []struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		Draining bool   `json:"draining"`
	} `json:"members"`
	Namespaces []struct {
		Shards []struct {
			Owner      string `json:"owner"`
			Version    int64  `json:"version"`
			AssignedTo string `json:"assignedTo"`
		} `json:"shards"`
	} `json:"namespaces"`
}

func (n *node) view(t *testing.T) view {
	t.Helper()
	resp, err := http.Get(n.url + "/api/v1/cluster")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var v view
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return v
}

// owners are the owner and the assignee of each shard in the view.
func (v view) owners() (owned, assigned []string) {
	for _, sh := range v.Namespaces[0].Shards {
		owned = append(owned, sh.Owner)
		assigned = append(assigned, sh.AssignedTo)
	}
	return owned, assigned
}

// settled: the view lists exactly the named live members, and every shard
// is owned by the node the view assigns it to.
func (v view) settled(members ...string) bool {
	var live []string
	for _, m := range v.Members {
		if m.State == "alive" && !m.Draining {
			live = append(live, m.Name)
		}
	}
	slices.Sort(live)
	owned, assigned := v.owners()
	return slices.Equal(live, members) && slices.Equal(owned, assigned) && !slices.Contains(owned, "")
}

// awaitSettled waits until every node's view is settled on the nodes' names
// and they all agree on the assignment.
func awaitSettled(t *testing.T, nodes ...*node) {
	t.Helper()
	var names []string
	for _, n := range nodes {
		names = append(names, n.name)
	}
	slices.Sort(names)
	require.Eventually(t, func() bool {
		var first []string
		for i, n := range nodes {
			v := n.view(t)
			if !v.settled(names...) {
				return false
			}
			if _, assigned := v.owners(); i == 0 {
				first = assigned
			} else if !slices.Equal(first, assigned) {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond, "the views of %v did not settle", names)
}

func TestClusterJoinAndLeaveMoveShards(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t)
	g := gossipAddrs(t, 3)
	a := c.start("a", g[0], g...)
	awaitSettled(t, a)
	owned, _ := a.view(t).owners()
	require.Equal(t, slices.Repeat([]string{"a"}, numShards), owned, "a node alone owns every shard")

	b := c.start("b", g[1], g...)
	cc := c.start("c", g[2], g...)
	awaitSettled(t, a, b, cc)
	before := a.view(t)
	owned, _ = before.owners()
	for _, name := range []string{"a", "b", "c"} {
		require.Contains(t, owned, name, "every node owns some of %d shards: %v", numShards, owned)
	}

	// b leaves gracefully: its shards, and only its, move to a and c, each
	// with a new claim (version+1).
	b.stop(t)
	awaitSettled(t, a, cc)
	after := a.view(t)
	for i, sh := range after.Namespaces[0].Shards {
		prev := before.Namespaces[0].Shards[i]
		if prev.Owner == "b" {
			require.Greater(t, sh.Version, prev.Version, "shard %d was claimed anew", i)
		} else {
			require.Equal(t, prev.Owner, sh.Owner, "shard %d of a surviving node did not move", i)
			require.Equal(t, prev.Version, sh.Version, "shard %d of a surviving node was not re-claimed", i)
		}
	}
}

func TestClusterForwardsToTheOwnerAndFires(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t)
	rcv := newReceiver(t)
	g := gossipAddrs(t, 2)
	a := c.start("a", g[0], g...)
	b := c.start("b", g[1], g...)
	awaitSettled(t, a, b)

	// Timers of every shard, created and updated through a alone: half of
	// them are owned by b, so a forwards those.
	due := time.Now().Add(time.Second).UTC().Truncate(time.Millisecond)
	const n = 40
	for i := range n {
		id := "fwd-" + strconv.Itoa(i)
		code, body := post(t, a.url+"/api/v1/timers/create", map[string]any{
			"namespace": "default", "id": id, "executeAt": due.Add(time.Hour).Format(time.RFC3339Nano), "callbackUrl": rcv.url,
		})
		require.Equal(t, http.StatusOK, code, "create %s through a: %s", id, body)
		code, body = post(t, a.url+"/api/v1/timers/update", map[string]any{
			"namespace": "default", "timerId": id, "executeAt": due.Format(time.RFC3339Nano),
		})
		require.Equal(t, http.StatusOK, code, "update %s through a: %s", id, body)
	}
	require.Positive(t, forwarded(t, a), "a forwarded the calls for b's shards")
	rcv.await(t, n, 20*time.Second)
	for i := range n {
		require.Equal(t, 1, rcv.count("fwd-"+strconv.Itoa(i)), "fwd-%d fired once, from its owner", i)
	}
}

// TestClusterPartitionedOwnersAreFenced: two nodes on one database that
// cannot gossip with each other (each seeds only an address nobody serves)
// both believe they own every shard, and take shards from each other in
// turns of about cluster.handoff_timeout. The version fence must keep every
// acknowledged timer: each fires at least once, none before it is due.
func TestClusterPartitionedOwnersAreFenced(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t)
	rcv := newReceiver(t)
	g := gossipAddrs(t, 4) // g[2] and g[3] are nobody's
	tune := func(cfg *config.Config) { cfg.Cluster.HandoffTimeout = 300 * time.Millisecond }
	a := c.startWith(tune, "a", g[0], g[2])
	b := c.startWith(tune, "b", g[1], g[3])

	// Create through both at once, while their claims fence each other; a
	// 503 (the shard is held by the other side now) is retried, as clients do.
	due := time.Now().Add(2 * time.Second).UTC().Truncate(time.Millisecond)
	const n = 100
	var wg sync.WaitGroup
	acked := make([]bool, n)
	for w, nd := range []*node{a, b} {
		wg.Go(func() {
			for i := w; i < n; i += 2 {
				req := map[string]any{"namespace": "default", "id": "part-" + strconv.Itoa(i),
					"executeAt": due.Add(time.Duration(i) * 5 * time.Millisecond).Format(time.RFC3339Nano), "callbackUrl": rcv.url}
				for deadline := time.Now().Add(20 * time.Second); !acked[i] && time.Now().Before(deadline); {
					code, _ := post(t, nd.url+"/api/v1/timers/create", req)
					if acked[i] = code == http.StatusOK; !acked[i] {
						<-time.After(20 * time.Millisecond) // a client's backoff before it retries
					}
				}
			}
		})
	}
	wg.Wait()
	require.NotContains(t, acked, false, "every create was acknowledged in the end")

	rcv.await(t, n, 30*time.Second)
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, call := range rcv.calls {
		require.False(t, call.arrived.Before(call.executeAt), "%s fired early", call.id)
	}
	av, bv := a.view(t), b.view(t)
	require.Equal(t, []string{"a"}, liveNames(av), "a sees only itself")
	require.Equal(t, []string{"b"}, liveNames(bv), "b sees only itself")
	t.Logf("%d timers, %d callbacks (duplicates from the shards' back and forth)", n, len(rcv.calls))
}

func liveNames(v view) []string {
	var out []string
	for _, m := range v.Members {
		if m.State == "alive" {
			out = append(out, m.Name)
		}
	}
	return out
}

// forwarded is the node's dtimer_forwarded_requests_total{result="ok"}.
func forwarded(t *testing.T, n *node) float64 {
	t.Helper()
	resp, err := http.Get(n.url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(`dtimer_forwarded_requests_total{result="ok"} `)); ok {
			f, err := strconv.ParseFloat(string(v), 64)
			require.NoError(t, err)
			return f
		}
	}
	return 0
}

func post(t *testing.T, url string, body any) (int, string) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(url, "application/json", bytes.NewReader(raw))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// gossipAddrs returns n loopback addresses whose port is free for both UDP
// and TCP at the time of the call.
func gossipAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		held = append(held, l)
		addr := l.Addr().String()
		if u, err := net.ListenPacket("udp", addr); err == nil {
			_ = u.Close()
			out = append(out, addr)
		}
	}
	return out
}

// receiver records callbacks and answers 200.
type receiver struct {
	url    string
	mu     sync.Mutex
	calls  []received
	byID   map[string]int
	signal chan struct{}
}

type received struct {
	id                 string
	executeAt, arrived time.Time
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{byID: map[string]int{}, signal: make(chan struct{}, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived := time.Now()
		var body struct {
			TimerID   string    `json:"timerId"`
			ExecuteAt time.Time `json:"executeAt"`
		}
		if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.calls = append(r.calls, received{id: body.TimerID, executeAt: body.ExecuteAt, arrived: arrived})
		r.byID[body.TimerID]++
		r.mu.Unlock()
		select {
		case r.signal <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func (r *receiver) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// await waits until n distinct timers have called back.
func (r *receiver) await(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		got := len(r.byID)
		r.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-r.signal:
		case <-deadline:
			t.Fatalf("%d of %d timers called back within %s", got, n, timeout)
		}
	}
}

// syncBuffer collects the nodes' logs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
