package system

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dtimer/dtimer/benchmark/internal/procstat"
	"github.com/dtimer/dtimer/benchmark/internal/stores"
)

// DtimerConfig describes a dtimer deployment under test.
type DtimerConfig struct {
	Bin   string // dtimer-server binary
	Store *stores.Store
	// Nodes is the number of dtimer-server processes (one cluster).
	Nodes int
	// Namespace and Shards are the namespace timers go to and its shard count.
	Namespace string
	Shards    int
	// CallbackURL is the receiver.
	CallbackURL string
	// Env is added to every node's environment after the harness's own
	// settings (DTIMER_ENGINE_..., DTIMER_CALLBACK_... tuning).
	Env []string
	// LogDir receives node-<i>.log.
	LogDir string
	// Clients bounds the API connections kept alive per node.
	Clients int
}

// Dtimer is a dtimer cluster of Nodes processes on one store, or a running
// cluster the harness only sends requests to (NewRemote).
type Dtimer struct {
	cfg    DtimerConfig
	remote bool
	nodes  []*node
	client *http.Client
	next   atomic.Uint64
}

type node struct {
	i        int
	api      string // base URL
	gossip   string
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *os.File
	usageEnd procstat.Sample // last reading, kept once the process exits
}

// NewDtimer prepares a cluster; Start starts it.
func NewDtimer(cfg DtimerConfig) (*Dtimer, error) {
	if cfg.Nodes < 1 {
		cfg.Nodes = 1
	}
	d := &Dtimer{cfg: cfg}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(cfg.Clients, 1) * cfg.Nodes
	tr.MaxIdleConnsPerHost = max(cfg.Clients, 1)
	d.client = &http.Client{Transport: tr, Timeout: 60 * time.Second}
	for i := range cfg.Nodes {
		api, err := freeAddr()
		if err != nil {
			return nil, err
		}
		gossip, err := freeAddr()
		if err != nil {
			return nil, err
		}
		d.nodes = append(d.nodes, &node{i: i, api: "http://" + api, gossip: gossip})
	}
	return d, nil
}

// NewRemote measures the running cluster at url: it cannot be stopped or
// started, and its processes' costs are not read.
func NewRemote(url string, cfg DtimerConfig) *Dtimer {
	d, _ := NewDtimer(DtimerConfig{Nodes: 1, Namespace: cfg.Namespace, CallbackURL: cfg.CallbackURL, Clients: cfg.Clients})
	d.remote = true
	d.nodes[0].api = strings.TrimSuffix(url, "/")
	return d
}

// freeAddr returns a 127.0.0.1 port nothing listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Name implements System.
func (d *Dtimer) Name() string {
	if d.remote {
		return "dtimer/target"
	}
	if d.cfg.Nodes > 1 {
		return fmt.Sprintf("dtimer/%s x%d", d.cfg.Store.Driver, d.cfg.Nodes)
	}
	return "dtimer/" + d.cfg.Store.Driver
}

// Start implements System: it starts every node that is not running and
// waits until each is ready and, in a cluster, every node owns shards.
func (d *Dtimer) Start(ctx context.Context) error {
	if d.remote {
		if !d.ok(ctx, d.nodes[0].api+"/ready") {
			return fmt.Errorf("target %s is not ready", d.nodes[0].api)
		}
		return nil
	}
	for _, n := range d.nodes {
		if n.running() {
			continue
		}
		if err := d.startNode(n); err != nil {
			return err
		}
	}
	return d.waitReady(ctx)
}

func (n *node) running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

func (d *Dtimer) startNode(n *node) error {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DTIMER_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"DTIMER_HTTP_ADDRESS="+strings.TrimPrefix(n.api, "http://"),
		"DTIMER_NAMESPACES="+d.cfg.Namespace+":"+strconv.Itoa(d.cfg.Shards),
		"DTIMER_CLUSTER_NODE_NAME=bench-"+strconv.Itoa(n.i),
		"DTIMER_CLUSTER_BIND_ADDRESS="+n.gossip,
		"DTIMER_CLUSTER_ADVERTISE_ADDRESS="+n.gossip,
		"DTIMER_LOG_LEVEL=warn",
		"DTIMER_LOG_FORMAT=json",
	)
	if len(d.nodes) > 1 {
		// Every node gets the seeds, itself included: a node without seeds
		// runs alone (static membership) and never gossips.
		seeds := make([]string, len(d.nodes))
		for i, o := range d.nodes {
			seeds[i] = o.gossip
		}
		env = append(env, "DTIMER_CLUSTER_SEEDS="+strings.Join(seeds, ","))
	}
	env = append(env, d.cfg.Store.Env...)
	env = append(env, d.cfg.Env...)
	f, err := os.OpenFile(filepath.Join(d.cfg.LogDir, fmt.Sprintf("%s-node-%d.log", d.cfg.Store.Driver, n.i)),
		os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(d.cfg.Bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	cmd.Dir = d.cfg.LogDir
	cmd.WaitDelay = 5 * time.Second
	// A harness that dies (killed, crashed) takes its servers with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", d.cfg.Bin, err)
	}
	n.cmd, n.exited, n.log = cmd, make(chan struct{}), f
	go func() {
		_ = cmd.Wait()
		_ = f.Close()
		close(n.exited)
	}()
	return nil
}

// waitReady polls /ready on every node (the API has no way to notify), then,
// in a cluster, /metrics until the shards are spread over every node.
func (d *Dtimer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ready := true
		total := 0.0
		for _, n := range d.nodes {
			select {
			case <-n.exited:
				return fmt.Errorf("%s node %d exited at start: see its log in %s", d.Name(), n.i, d.cfg.LogDir)
			default:
			}
			if !d.ok(ctx, n.api+"/ready") {
				ready = false
				break
			}
			if len(d.nodes) > 1 {
				owned, err := d.gauge(ctx, n, "dtimer_shards_owned")
				if err != nil || owned == 0 {
					ready = false
					break
				}
				total += owned
			}
		}
		if ready && (len(d.nodes) == 1 || int(total) == d.cfg.Shards) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (logs in %s)", d.Name(), ctx.Err(), d.cfg.LogDir)
		case <-tick.C:
		}
	}
}

func (d *Dtimer) ok(ctx context.Context, url string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Stop implements System: SIGTERM to every node, in parallel, and wait.
func (d *Dtimer) Stop(ctx context.Context) error {
	if d.remote {
		return errors.New("a --target cluster cannot be stopped by the harness")
	}
	var errs []error
	for _, n := range d.nodes {
		if n.running() {
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, n := range d.nodes {
		if n.cmd == nil {
			continue
		}
		select {
		case <-n.exited:
		case <-ctx.Done():
			_ = n.cmd.Process.Kill()
			<-n.exited
			errs = append(errs, fmt.Errorf("node %d did not stop in time; killed", n.i))
		}
	}
	return errors.Join(errs...)
}

// Create implements System: one POST /api/v1/timers/create, to the nodes in
// turn (a node forwards to the shard's owner).
func (d *Dtimer) Create(ctx context.Context, t Timer) error {
	n := d.nodes[d.next.Add(1)%uint64(len(d.nodes))]
	var buf bytes.Buffer
	buf.Grow(256 + len(t.Payload))
	buf.WriteString(`{"namespace":`)
	writeJSONString(&buf, d.cfg.Namespace)
	buf.WriteString(`,"id":`)
	writeJSONString(&buf, t.ID)
	buf.WriteString(`,"executeAt":"`)
	buf.WriteString(t.ExecuteAt.UTC().Format(Format))
	buf.WriteString(`","callbackUrl":`)
	writeJSONString(&buf, d.cfg.CallbackURL)
	if t.Payload != nil {
		buf.WriteString(`,"payload":`)
		buf.Write(t.Payload)
	}
	buf.WriteString(`}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.api+"/api/v1/timers/create", &buf)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("create %s: %s: %s", t.ID, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

func writeJSONString(buf *bytes.Buffer, s string) {
	b, _ := json.Marshal(s)
	buf.Write(b)
}

// Usage implements System: the sum over the nodes.
func (d *Dtimer) Usage() procstat.Sample {
	var sum procstat.Sample
	for _, n := range d.nodes {
		if n.running() {
			if s, err := procstat.Of(n.cmd.Process.Pid); err == nil {
				n.usageEnd = s
			}
		}
		sum.CPUSeconds += n.usageEnd.CPUSeconds
		sum.RSSBytes += n.usageEnd.RSSBytes
		sum.PeakRSSBytes += n.usageEnd.PeakRSSBytes
	}
	return sum
}

// Counters implements System: dtimer_db_operations_total by op ("db:<op>")
// and dtimer_callbacks_total by outcome ("callbacks:<outcome>"), summed over
// the running nodes.
func (d *Dtimer) Counters(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	for _, n := range d.nodes {
		if !n.running() && !d.remote {
			continue
		}
		fams, err := d.scrape(ctx, n)
		if err != nil {
			return nil, err
		}
		add := func(family, label, prefix string) {
			f, ok := fams[family]
			if !ok {
				return
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == label {
						out[prefix+l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		}
		add("dtimer_db_operations_total", "op", "db:")
		add("dtimer_callbacks_total", "outcome", "callbacks:")
	}
	return out, nil
}

func (d *Dtimer) gauge(ctx context.Context, n *node, name string) (float64, error) {
	fams, err := d.scrape(ctx, n)
	if err != nil {
		return 0, err
	}
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		return 0, fmt.Errorf("no %s", name)
	}
	return f.GetMetric()[0].GetGauge().GetValue(), nil
}

func (d *Dtimer) scrape(ctx context.Context, n *node) (map[string]*dto.MetricFamily, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.api+"/metrics", nil)
	resp, err := d.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bufio.NewReader(resp.Body))
}

// Close implements System.
func (d *Dtimer) Close(ctx context.Context) error {
	if d.remote {
		d.client.CloseIdleConnections()
		return nil
	}
	err := d.Stop(ctx)
	d.client.CloseIdleConnections()
	return errors.Join(err, d.cfg.Store.Drop(ctx))
}

// Kill stops node i at once (SIGKILL), for scaling runs that need a node gone.
func (d *Dtimer) Kill(i int) {
	if n := d.nodes[i]; n.running() {
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}
