// Package metrics defines dtimer's Prometheus metrics in one place, so that
// every name, label and bucket is visible together (docs/operations.md lists
// them). Each server registers its own set on its own registry.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is the set of collectors the server updates.
type Metrics struct {
	TimersCreated     prometheus.Counter
	TimersUpdated     prometheus.Counter
	TimersDeleted     prometheus.Counter
	Callbacks         *prometheus.CounterVec // outcome: done, reschedule, retry, permanent
	Retries           prometheus.Counter
	TimersFailed      prometheus.Counter
	FiringLateness    prometheus.Histogram
	CallbackDuration  prometheus.Histogram
	CallbacksInFlight prometheus.Gauge
	QueueLength       *prometheus.GaugeVec // namespace, shard
	WindowAhead       *prometheus.GaugeVec // namespace, shard: seconds the loaded window reaches past now
	WindowLoads       prometheus.Counter
	RangeDeletes      prometheus.Counter
	RangeDeletedRows  prometheus.Counter
	DBOps             *prometheus.CounterVec   // op, result
	DBLatency         *prometheus.HistogramVec // op
	ShardsOwned       prometheus.Gauge
	OwnershipGained   prometheus.Counter
	OwnershipLost     prometheus.Counter
	ClaimConflicts    prometheus.Counter
	Handoff           prometheus.Histogram
	Members           *prometheus.GaugeVec   // state
	Forwarded         *prometheus.CounterVec // result: ok, unavailable
}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		TimersCreated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_timers_created_total", Help: "Timers created or replaced through the API.",
		}),
		TimersUpdated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_timers_updated_total", Help: "Timers updated through the API.",
		}),
		TimersDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_timers_deleted_total", Help: "Timers deleted through the API.",
		}),
		Callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dtimer_callbacks_total", Help: "Callback attempts by outcome (done, reschedule, retry, permanent).",
		}, []string{"outcome"}),
		Retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_callback_retries_scheduled_total", Help: "Retries scheduled after a failed attempt.",
		}),
		TimersFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_timers_failed_total", Help: "Timers that ended FAILED (4xx or retries exhausted).",
		}),
		FiringLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dtimer_firing_lateness_seconds",
			Help:    "Callback start minus the time the attempt was due.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60, 300},
		}),
		CallbackDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dtimer_callback_duration_seconds", Help: "Duration of callback HTTP requests.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		CallbacksInFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dtimer_callbacks_in_flight", Help: "Callbacks running now.",
		}),
		QueueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dtimer_shard_queue_length", Help: "Timers held in a shard's in-memory queue, not yet completed.",
		}, []string{"namespace", "shard"}),
		WindowAhead: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dtimer_shard_window_ahead_seconds", Help: "How far past now a shard's loaded window reaches.",
		}, []string{"namespace", "shard"}),
		WindowLoads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_window_loads_total", Help: "Window reads of due timers from the store.",
		}),
		RangeDeletes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_range_deletes_total", Help: "Range deletes of completed timers.",
		}),
		RangeDeletedRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_range_deleted_rows_total", Help: "Rows removed by range deletes, where the store reports it.",
		}),
		DBOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dtimer_db_operations_total", Help: "Store operations by kind and result (ok, error).",
		}, []string{"op", "result"}),
		DBLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dtimer_db_operation_duration_seconds", Help: "Store operation latency by kind.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2.5, 12),
		}, []string{"op"}),
		ShardsOwned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dtimer_shards_owned", Help: "Shards this node owns and fires.",
		}),
		OwnershipGained: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_shard_ownership_gained_total", Help: "Shards claimed by this node.",
		}),
		OwnershipLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_shard_ownership_lost_total", Help: "Shards this node stopped owning (released or fenced out).",
		}),
		ClaimConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dtimer_shard_claim_conflicts_total", Help: "Claims lost to a concurrent claim (version conflict).",
		}),
		Handoff: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dtimer_shard_handoff_seconds",
			Help:    "From this node starting to want a shard (assignment change, start, fenced out) to its engine running: the failover time as this node sees it.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 30},
		}),
		Members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dtimer_cluster_members", Help: "Cluster members by state (alive, suspect, dead, left, draining) as this node sees them.",
		}, []string{"state"}),
		Forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dtimer_forwarded_requests_total", Help: "API calls forwarded to the shard's owner, by result (ok, unavailable).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.Handoff, m.Members, m.Forwarded,
		m.TimersCreated, m.TimersUpdated, m.TimersDeleted, m.Callbacks, m.Retries, m.TimersFailed,
		m.FiringLateness, m.CallbackDuration, m.CallbacksInFlight, m.QueueLength, m.WindowAhead, m.WindowLoads,
		m.RangeDeletes, m.RangeDeletedRows, m.DBOps, m.DBLatency, m.ShardsOwned, m.OwnershipGained,
		m.OwnershipLost, m.ClaimConflicts)
	return m
}
