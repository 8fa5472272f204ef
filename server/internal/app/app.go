// Package app wires the server together and owns its start and stop order:
// store -> metrics -> callback pool -> ownership (engines) -> routing -> HTTP
// API on the way up, and the reverse on the way down.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/api"
	"github.com/dtimer/dtimer/server/internal/callback"
	"github.com/dtimer/dtimer/server/internal/config"
	"github.com/dtimer/dtimer/server/internal/engine"
	"github.com/dtimer/dtimer/server/internal/membership"
	"github.com/dtimer/dtimer/server/internal/metrics"
	"github.com/dtimer/dtimer/server/internal/ownership"
	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/cassandra"
	"github.com/dtimer/dtimer/server/internal/store/dynamodb"
	"github.com/dtimer/dtimer/server/internal/store/mongodb"
	"github.com/dtimer/dtimer/server/internal/store/mysql"
	"github.com/dtimer/dtimer/server/internal/store/postgres"
	"github.com/dtimer/dtimer/server/internal/store/sqlite"
)

// OpenStore opens the configured driver. It does not migrate.
func OpenStore(ctx context.Context, c config.Store) (store.Store, error) {
	switch c.Driver {
	case "sqlite":
		return sqlite.Open(sqlite.Config{Path: c.SQLite.Path, Synchronous: c.SQLite.Synchronous})
	case "postgres":
		return postgres.New(ctx, postgres.Config{URL: c.Postgres.URL, Schema: c.Postgres.Schema, MaxConns: c.Postgres.MaxConns})
	case "mysql":
		return mysql.New(ctx, mysql.Config{DSN: c.MySQL.DSN, MaxConns: c.MySQL.MaxConns})
	case "mongodb":
		m := c.MongoDB
		return mongodb.New(ctx, mongodb.Config{
			URI: m.URI, Database: m.Database, Collection: m.Collection, MaxPoolSize: m.MaxPoolSize,
			WriteConcern: m.WriteConcern, ReadConcern: m.ReadConcern,
		})
	case "dynamodb":
		d := c.DynamoDB
		return dynamodb.New(ctx, dynamodb.Config{
			Region: d.Region, Endpoint: d.Endpoint, Table: d.Table,
			AccessKeyID: d.AccessKeyID, SecretAccessKey: d.SecretAccessKey,
			BillingMode: d.BillingMode, ReadCapacity: d.ReadCapacity, WriteCapacity: d.WriteCapacity,
			MaxConns: d.MaxConns,
		})
	case "cassandra":
		cs := c.Cassandra
		return cassandra.New(ctx, cassandra.Config{
			Hosts: cs.Hosts, Port: cs.Port, Keyspace: cs.Keyspace, Table: cs.Table,
			Username: cs.Username, Password: cs.Password,
			Consistency: cs.Consistency, SerialConsistency: cs.SerialConsistency,
			LocalDC: cs.LocalDC, Replication: cs.Replication,
			Timeout: cs.Timeout, ConnectTimeout: cs.ConnectTimeout, NumConns: cs.NumConns,
		})
	}
	return nil, fmt.Errorf("unknown store driver %q", c.Driver)
}

// Migrate creates or upgrades the configured store's schema.
func Migrate(ctx context.Context, cfg *config.Config) error {
	st, err := OpenStore(ctx, cfg.Store)
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Migrate(ctx)
}

// Run serves until ctx is cancelled, then stops gracefully: it stops taking
// requests, lets in-flight callbacks finish within shutdown.drain_timeout,
// and releases its shards. ready, if not nil, receives the API's address once
// it listens.
func Run(ctx context.Context, cfg *config.Config, log *zap.Logger, ready func(addr net.Addr)) error {
	clock := clockwork.NewRealClock()
	raw, err := OpenStore(ctx, cfg.Store)
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer raw.Close()
	if err := migrateWithRetry(ctx, raw, log); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	st := metrics.InstrumentStore(raw, m)

	client := callback.NewClient(cfg.Callback.Concurrency)
	defer client.Close()
	pool := callback.NewPool(cfg.Callback.Concurrency)
	defer pool.Close() // the engines, stopped before it, wait for their callbacks
	deps := engine.Deps{
		Store: st, Clock: clock, Firer: client, Pool: pool,
		Logger: log.Named("engine"), Metrics: m,
	}
	namespaces := make([]ownership.Namespace, len(cfg.Namespaces))
	for i, ns := range cfg.Namespaces {
		namespaces[i] = ownership.Namespace{Name: ns.Name, NumShards: ns.NumShards}
	}

	if cfg.Debug.PprofAddress != "" {
		stopPprof, err := servePprof(cfg.Debug.PprofAddress, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}

	// Listen before joining, so the address peers forward to is known.
	ln, err := net.Listen("tcp", cfg.HTTP.Address)
	if err != nil {
		return fmt.Errorf("listen on %s (http.address): %w", cfg.HTTP.Address, err)
	}
	defer ln.Close()
	members, err := startMembership(cfg, ln.Addr().(*net.TCPAddr), log)
	if err != nil {
		return err
	}
	defer func() {
		if err := members.Leave(2 * time.Second); err != nil {
			log.Warn("leaving the cluster", zap.Error(err))
		}
	}()
	isLive := func(node string) bool {
		for _, m := range members.Members() {
			if m.Name == node {
				return m.Live()
			}
		}
		return false
	}

	e := cfg.Engine
	assigner := ownership.NewRendezvous(cfg.Cluster.NodeName)
	owners := ownership.New(ownership.Config{
		Node:       cfg.Cluster.NodeName,
		Namespaces: namespaces,
		Engine: engine.Config{
			MinLookAhead: e.MinLookAhead, MaxLookAhead: e.MaxLookAhead, BatchReadLimit: e.BatchReadLimit,
			QueueSize: e.QueueSize, DeleteBatch: e.DeleteBatch, DeleteInterval: e.DeleteInterval,
			StoreRetryMin: e.StoreRetryMin, StoreRetryMax: e.StoreRetryMax,
		},
		DrainTimeout:   cfg.Shutdown.DrainTimeout,
		ClaimRetryMin:  e.StoreRetryMin,
		ClaimRetryMax:  e.StoreRetryMax,
		IsLive:         isLive,
		HandoffTimeout: cfg.Cluster.HandoffTimeout,
	}, deps, assigner, log.Named("ownership"))
	owners.Start()
	owners.Follow(members, assigner)

	handler := api.New(api.Options{
		Service:                routing.New(namespaces, owners, assigner, members, st, m),
		Logger:                 log.Named("api"),
		Metrics:                promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}),
		Registerer:             reg,
		MaxBodyBytes:           cfg.HTTP.MaxBodyBytes,
		DefaultRetryPolicy:     cfg.RetryPolicy(),
		DefaultCallbackTimeout: cfg.Callback.DefaultTimeout,
		MaxCallbackTimeout:     cfg.Callback.MaxTimeout,
		Now:                    clock.Now,
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	log.Info("dtimer serving", zap.String("address", ln.Addr().String()), zap.String("node", cfg.Cluster.NodeName),
		zap.String("http_advertise", members.Local().HTTPAddress), zap.String("store", cfg.Store.Driver),
		zap.Int("namespaces", len(namespaces)), zap.Strings("seeds", cfg.Cluster.Seeds))
	if ready != nil {
		ready(ln.Addr())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case <-ctx.Done():
	case err := <-served:
		owners.Stop(context.Background())
		return fmt.Errorf("http server: %w", err)
	}

	log.Info("shutting down: handing shards off, draining callbacks", zap.Duration("timeout", cfg.Shutdown.Timeout))
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.Shutdown.Timeout)
	defer cancel()
	// In a cluster, announce the departure first: peers take no new shards
	// from us, ours are released as their engines drain, and the API keeps
	// forwarding to the new owners meanwhile.
	if err := members.Drain(); err != nil {
		log.Warn("announcing the drain", zap.Error(err))
	}
	handoffCtx, cancelHandoff := context.WithTimeout(stopCtx, cfg.Shutdown.DrainTimeout+time.Second)
	if members.Local().Draining {
		owners.WaitReleased(handoffCtx)
	}
	cancelHandoff()
	if err := srv.Shutdown(stopCtx); err != nil {
		log.Warn("http shutdown incomplete", zap.Error(err))
	}
	drainCtx, cancelDrain := context.WithTimeout(stopCtx, cfg.Shutdown.DrainTimeout)
	defer cancelDrain()
	owners.Stop(drainCtx)
	log.Info("stopped; shards released")
	return nil
}

// servePprof serves net/http/pprof on its own listener (debug.pprof_address),
// on a mux of its own rather than http.DefaultServeMux, so that nothing else
// registered there is exposed with it. It returns the function that stops it.
func servePprof(addr string, log *zap.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (debug.pprof_address): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("pprof serving", zap.String("address", ln.Addr().String()))
	return func() { _ = srv.Close() }, nil
}

// migrateWithRetry migrates at start, waiting for a database that is still
// coming up (a common order problem under compose or Kubernetes).
func migrateWithRetry(ctx context.Context, st store.Store, log *zap.Logger) error {
	delay := 200 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		err := st.Migrate(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || errors.Is(err, context.Canceled) {
			return fmt.Errorf("migrate store: %w", err)
		}
		log.Warn("store not ready; retrying migration", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// startMembership joins the cluster when seeds are configured, and otherwise
// runs the static membership of one.
func startMembership(cfg *config.Config, httpAddr *net.TCPAddr, log *zap.Logger) (membership.Membership, error) {
	c := cfg.Cluster
	httpAdvertise := c.HTTPAdvertiseAddress
	if httpAdvertise == "" {
		httpAdvertise = advertisedHTTP(c, httpAddr)
	}
	if len(c.Seeds) == 0 {
		return membership.NewStatic(c.NodeName, httpAdvertise), nil
	}
	_, bindPort, _ := net.SplitHostPort(c.BindAddress)
	port, _ := strconv.Atoi(bindPort)
	g, err := membership.StartGossip(membership.GossipConfig{
		NodeName: c.NodeName, BindAddress: c.BindAddress, AdvertiseAddress: c.AdvertiseAddress,
		HTTPAddress: httpAdvertise, Seeds: c.Seeds, DefaultPort: port,
		ProbeInterval: c.ProbeInterval, ProbeTimeout: c.ProbeTimeout, SuspicionMult: c.SuspicionMult, SuspicionMaxTimeoutMult: c.SuspicionMaxMult,
		GossipInterval: c.GossipInterval, PushPullInterval: c.PushPullInterval,
		Logger: log.Named("membership"),
	})
	if err != nil {
		return nil, err
	}
	select {
	case <-g.Tried():
	case <-time.After(5 * time.Second):
		log.Warn("seeds did not answer within 5s; starting alone, peers join later")
	}
	return g, nil
}

// advertisedHTTP is the API address peers can reach: the listener's port on
// the first specific host among http.address, the gossip advertise address,
// the gossip bind address, and this machine's private IP.
func advertisedHTTP(c config.Cluster, httpAddr *net.TCPAddr) string {
	port := strconv.Itoa(httpAddr.Port)
	if !httpAddr.IP.IsUnspecified() {
		return net.JoinHostPort(httpAddr.IP.String(), port)
	}
	for _, hp := range []string{c.AdvertiseAddress, c.BindAddress} {
		if host, _, err := net.SplitHostPort(hp); err == nil && host != "" {
			if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
				return net.JoinHostPort(host, port)
			}
		}
	}
	if ip, err := sockaddr.GetPrivateIP(); err == nil && ip != "" {
		return net.JoinHostPort(ip, port)
	}
	return net.JoinHostPort("127.0.0.1", port)
}
