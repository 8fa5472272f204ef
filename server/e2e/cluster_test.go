package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClusterChaos runs three dtimer-server processes on one PostgreSQL
// database, fires timers through them at a steady rate, and meanwhile kills
// one with SIGKILL and restarts it, stops another with SIGTERM, and adds a
// fourth. Every acknowledged timer must fire at least once, none before its
// due time. It measures and logs failover and join times, duplicates and
// lateness; it asserts no speed. `make test-cluster` runs it alone.
func TestClusterChaos(t *testing.T) {
	storeEnv := postgresStore(t) // a cluster needs a shared database
	rcv := newReceiver(t)
	const (
		numTimers = 20000
		spread    = 60 * time.Second // timers are due evenly over this span
		lead      = 5 * time.Second  // each is created this long before it is due
		shardsNum = 16
	)
	c := newCluster(t, storeEnv, 4, "DTIMER_NAMESPACES=default:"+strconv.Itoa(shardsNum))
	for i := range 3 {
		c.start(i)
	}
	took := c.settle(t, c.nodes[0], "n1 n2 n3")
	t.Logf("3 nodes settled (every shard owned by its assigned node) %s after the last was ready", took)

	t0 := time.Now().Add(lead + time.Second).Truncate(time.Millisecond)
	load := startLoad(c, rcv, t0, numTimers, spread, lead)

	// The disruptions, at fixed offsets into the firing span.
	var events []string
	waitUntil := func(d time.Duration) { <-time.After(time.Until(t0.Add(d))) }

	waitUntil(10 * time.Second)
	c.setTarget(0, false)
	killedAt := time.Now()
	c.nodes[0].kill()
	c.settle(t, c.nodes[1], "n2 n3")
	failKill := time.Since(killedAt)
	events = append(events, fmt.Sprintf("kill -9 n1: its shards owned by n2/n3 after %s", failKill.Round(time.Millisecond)))

	waitUntil(20 * time.Second)
	restartAt := time.Now()
	c.nodes[0].restart()
	c.setTarget(0, true)
	c.settle(t, c.nodes[0], "n1 n2 n3")
	joinRestart := time.Since(restartAt)
	events = append(events, fmt.Sprintf("restart n1: ready and shards rebalanced after %s", joinRestart.Round(time.Millisecond)))

	waitUntil(30 * time.Second)
	termAt := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- c.nodes[1].stopErr() }()
	c.settle(t, c.nodes[2], "n1 n3")
	failTerm := time.Since(termAt)
	c.setTarget(1, false)
	events = append(events, fmt.Sprintf("SIGTERM n2: its shards owned by n1/n3 after %s", failTerm.Round(time.Millisecond)))
	require.NoError(t, <-stopped, "n2 after SIGTERM")
	events = append(events, fmt.Sprintf("SIGTERM n2: process exited after %s", time.Since(termAt).Round(time.Millisecond)))

	waitUntil(40 * time.Second)
	joinAt := time.Now()
	c.start(3)
	c.settle(t, c.nodes[3], "n1 n3 n4")
	joinNew := time.Since(joinAt)
	events = append(events, fmt.Sprintf("start n4: ready and shards rebalanced after %s", joinNew.Round(time.Millisecond)))

	acked := load.wait()
	require.Empty(t, load.refused, "creates refused with a 4xx")
	require.Empty(t, load.gaveUp, "creates that never got a 200 in 30s of retries")

	// Every acknowledged timer fires: wait for all, with a minute to spare.
	ok := rcv.wait(time.Until(t0.Add(spread+time.Minute)), func() bool {
		if len(rcv.byID) < len(acked) { // cheap, as every callback calls it
			return false
		}
		for id := range acked {
			if len(rcv.byID[id]) == 0 {
				return false
			}
		}
		return true
	})
	var lost []string
	for id := range acked {
		if rcv.count(id) == 0 {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	require.True(t, ok, "%d acknowledged timers never fired, e.g. %v", len(lost), lost[:min(10, len(lost))])

	stats := arrivals(t, rcv, "chaos-") // also requires that none fired early
	require.Len(t, stats.lateness, len(acked))
	for _, e := range events {
		t.Logf("event: %s", e)
	}
	t.Logf("%d timers due over %s through %d creates (%d retried after an error or 503, %d acknowledged after their due time)",
		len(acked), spread, load.attempts, load.retried, load.late)
	t.Logf("lost: %d; duplicates: %d callbacks of %d timers", len(lost), stats.duplicates, stats.duplicated)
	t.Logf("lateness (first arrival - executeAt): %s", stats.summary())
	for _, w := range []struct {
		name string
		from time.Time
		took time.Duration
	}{{"kill -9 n1", killedAt, failKill}, {"SIGTERM n2", termAt, failTerm}} {
		t.Logf("lateness of timers due in the %s failover: %s", w.name, lateIn(t, rcv, w.from, w.from.Add(w.took)))
	}
}

// lateIn summarises the lateness of the first callbacks of timers due in
// [from, to].
func lateIn(t *testing.T, rcv *receiver, from, to time.Time) string {
	var s arrivalStats
	seen := map[string]bool{}
	for _, c := range rcv.all() {
		due := parseTS(t, c.Body.ExecuteAt)
		if seen[c.Body.TimerID] || due.Before(from) || due.After(to) {
			continue
		}
		seen[c.Body.TimerID] = true
		s.lateness = append(s.lateness, c.Arrived.Sub(due))
	}
	slices.Sort(s.lateness)
	return fmt.Sprintf("%d timers, %s", len(s.lateness), s.summary())
}

// cluster is a set of dtimer-server processes sharing one store, each with
// a fixed gossip port and every other node as a seed.
type cluster struct {
	t      *testing.T
	store  []string
	env    []string
	gossip []string // gossip address of node i
	nodes  []*server

	mu      sync.Mutex
	targets []string // API base URL of each node clients send calls to; "" for none
}

func newCluster(t *testing.T, storeEnv []string, n int, env ...string) *cluster {
	c := &cluster{t: t, store: storeEnv, env: env, nodes: make([]*server, n), targets: make([]string, n)}
	for _, p := range freePorts(t, n) {
		c.gossip = append(c.gossip, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
	return c
}

func nodeLabel(i int) string { return "n" + strconv.Itoa(i+1) }

// start starts node i and waits until it is ready (its shards owned).
func (c *cluster) start(i int) {
	c.t.Helper()
	env := append([]string{
		"DTIMER_CLUSTER_NODE_NAME=" + nodeLabel(i),
		"DTIMER_CLUSTER_BIND_ADDRESS=" + c.gossip[i],
		"DTIMER_CLUSTER_SEEDS=" + strings.Join(c.gossip, ","),
	}, c.env...)
	c.nodes[i] = startNode(c.t, c.store, env...)
	c.setTarget(i, true)
}

// setTarget makes clients send calls to node i, or stop doing so.
func (c *cluster) setTarget(i int, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets[i] = ""
	if on {
		c.targets[i] = c.nodes[i].URL
	}
}

// target picks the node to send the k-th call to, and its URL, skipping
// avoid (-1: none) when another node is up.
func (c *cluster) target(k, avoid int) (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var up []int
	for i, u := range c.targets {
		if u != "" && i != avoid {
			up = append(up, i)
		}
	}
	if len(up) == 0 {
		if avoid < 0 {
			return -1, ""
		}
		return avoid, c.targets[avoid]
	}
	i := up[k%len(up)]
	return i, c.targets[i]
}

// settle waits until via's view of the cluster has exactly the named
// members alive and eligible, and every shard is owned by the node the view
// assigns it to, and returns how long that took. Polling is the only way to
// observe ownership from outside.
func (c *cluster) settle(t *testing.T, via *server, members string) time.Duration {
	t.Helper()
	want := strings.Fields(members)
	start := time.Now()
	var last string
	ok := poll(60*time.Second, func() bool {
		r, err := via.do(http.MethodGet, "/api/v1/cluster", "", nil)
		if err != nil || r.status != http.StatusOK {
			last = fmt.Sprintf("%v %d %s", err, r.status, r.body)
			return false
		}
		var v clusterView
		if err := json.Unmarshal(r.body, &v); err != nil {
			last = err.Error()
			return false
		}
		last = string(r.body)
		return v.settled(want)
	})
	require.True(t, ok, "the cluster did not settle on %v within 60s; last view: %s", want, last)
	return time.Since(start)
}

type clusterView struct {
	Members []struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		Draining bool   `json:"draining"`
	} `json:"members"`
	Namespaces []struct {
		Shards []struct {
			Owner      string `json:"owner"`
			AssignedTo string `json:"assignedTo"`
		} `json:"shards"`
	} `json:"namespaces"`
}

func (v clusterView) settled(want []string) bool {
	var eligible []string
	for _, m := range v.Members {
		if m.State == "alive" && !m.Draining {
			eligible = append(eligible, m.Name)
		}
	}
	slices.Sort(eligible)
	if !slices.Equal(eligible, want) {
		return false
	}
	for _, ns := range v.Namespaces {
		for _, sh := range ns.Shards {
			if sh.Owner == "" || sh.Owner != sh.AssignedTo {
				return false
			}
		}
	}
	return true
}

// freePorts returns n distinct loopback ports free for both UDP and TCP (a
// gossip port needs both) at the time of the call.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
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
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // the UDP port is taken; keep the TCP one held and try another
		}
		_ = u.Close()
		out = append(out, port)
	}
	return out
}

// load creates timers chaos-00000... due evenly over a span, each created
// lead before its due time through the cluster's target nodes, retrying on
// another node after a transport error or a 5xx, as a client of a cluster
// does.
type load struct {
	done chan struct{}

	mu       sync.Mutex
	acked    map[string]time.Time // id -> when the create was acknowledged
	refused  []string
	gaveUp   []string
	attempts int
	retried  int
	late     int // acknowledged after the timer was due
}

const loadClients = 32

func startLoad(c *cluster, rcv *receiver, t0 time.Time, n int, spread, lead time.Duration) *load {
	l := &load{done: make(chan struct{}), acked: make(map[string]time.Time, n)}
	work := make(chan int, 1024)
	var wg sync.WaitGroup
	for range loadClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				due := t0.Add(time.Duration(i) * spread / time.Duration(n))
				l.create(c, i, newTimer(rcv, "default", fmt.Sprintf("chaos-%05d", i), due, nil), due)
			}
		}()
	}
	go func() {
		for i := range n {
			due := t0.Add(time.Duration(i) * spread / time.Duration(n))
			<-time.After(time.Until(due.Add(-lead))) // pacing, not synchronisation
			work <- i
		}
		close(work)
		wg.Wait()
		close(l.done)
	}()
	return l
}

// create sends one create until a node acknowledges it, for up to 30s.
func (l *load) create(c *cluster, k int, req obj, due time.Time) {
	id := req["id"].(string)
	deadline := time.Now().Add(30 * time.Second)
	avoid := -1
	for attempt := 0; ; attempt++ {
		node, url := c.target(k+attempt, avoid)
		var (
			r   response
			err = errors.New("no node to send to")
		)
		if url != "" {
			r, err = request(url, http.MethodPost, pathCreate, "application/json", req)
		}
		l.mu.Lock()
		l.attempts++
		switch {
		case err == nil && r.status == http.StatusOK:
			now := time.Now()
			l.acked[id] = now
			if now.After(due) {
				l.late++
			}
			l.mu.Unlock()
			return
		case err == nil && r.status < 500:
			l.refused = append(l.refused, fmt.Sprintf("%s: HTTP %d %s", id, r.status, r.body))
			l.mu.Unlock()
			return
		case time.Now().After(deadline):
			l.gaveUp = append(l.gaveUp, fmt.Sprintf("%s: %v %d %s", id, err, r.status, r.body))
			l.mu.Unlock()
			return
		}
		if attempt == 0 {
			l.retried++
		}
		l.mu.Unlock()
		avoid = node
		<-time.After(50 * time.Millisecond) // back off before the retry, as clients do
	}
}

// wait waits until every create is done and returns the acknowledged ids.
func (l *load) wait() map[string]time.Time {
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acked
}
