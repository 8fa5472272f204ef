package river

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/stores"
)

// freshDB is a throw-away database on the server at
// DTIMER_TEST_POSTGRES_URL (the test is skipped if it is unset).
func freshDB(t *testing.T) string {
	t.Helper()
	base := os.Getenv("DTIMER_TEST_POSTGRES_URL")
	if base == "" {
		t.Skip("DTIMER_TEST_POSTGRES_URL not set")
	}
	u, drop, err := stores.FreshPostgresDatabase(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = drop(context.Background()) })
	return u
}

func TestDescribe(t *testing.T) {
	got := WorkerConfig{}.Describe()
	t.Log(got)
	for _, want := range []string{" defaults: 100 workers", "fetch cooldown 100ms", "fetch poll interval 1s", "scheduler interval 5s"} {
		if !strings.Contains(got, want) {
			t.Errorf("defaults Describe() = %q, want it to contain %q", got, want)
		}
	}
	got = WorkerConfig{Tuned: true, PoolSize: 20}.Describe()
	for _, want := range []string{" tuned: 1000 workers", "fetch cooldown 1ms", "fetch poll interval 1ms", "pool 20"} {
		if !strings.Contains(got, want) {
			t.Errorf("tuned Describe() = %q, want it to contain %q", got, want)
		}
	}
	// The defaults config must leave River's fetch settings unset.
	rc := WorkerConfig{FetchCooldown: time.Millisecond, FetchPollInterval: time.Millisecond}.clientConfig(nil)
	if rc.FetchCooldown != 0 || rc.FetchPollInterval != 0 || rc.Queues["default"].MaxWorkers != 100 {
		t.Errorf("defaults client config = %+v", rc)
	}
}

type delivery struct {
	body callbackBody
	at   time.Time
}

// TestWorkerDelivers inserts 50 jobs (half one by one, half in bulk) due in
// about a second, runs a tuned worker and checks that every callback
// arrives, not before its time, with the expected body; the first answer
// for one job is a 500, which River must retry.
func TestWorkerDelivers(t *testing.T) {
	pgURL := freshDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for i := range 2 {
		if err := Migrate(ctx, pgURL); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}

	const n = 50
	const failOnce = "t-7"
	var (
		mu     sync.Mutex
		got    = map[string][]delivery{}
		failed bool
		done   = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		var b callbackBody
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %s with Content-Type %q", r.Method, r.Header.Get("Content-Type"))
		}
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			t.Errorf("decode body: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if b.TimerID == failOnce && !failed {
			failed = true
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		got[b.TimerID] = append(got[b.TimerID], delivery{b, at})
		if len(got) == n {
			close(done)
		}
	}))
	defer srv.Close()

	ins, err := NewInserter(ctx, pgURL, 4)
	if err != nil {
		t.Fatalf("NewInserter: %v", err)
	}
	defer ins.Close()
	due := time.Now().Add(time.Second)
	jobs := make(map[string]Job, n)
	var bulk []Job
	for i := range n {
		j := Job{
			ID:        fmt.Sprintf("t-%d", i),
			ExecuteAt: due.Add(time.Duration(i) * 7 * time.Millisecond),
			URL:       srv.URL + "/cb",
			Payload:   json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
		}
		jobs[j.ID] = j
		if i%2 == 0 {
			if err := ins.Insert(ctx, j); err != nil {
				t.Fatalf("Insert: %v", err)
			}
		} else {
			bulk = append(bulk, j)
		}
	}
	if err := ins.InsertMany(ctx, bulk); err != nil {
		t.Fatalf("InsertMany: %v", err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ready := make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		runErr <- RunWorker(wctx, WorkerConfig{PGURL: pgURL, Tuned: true, Workers: 20, PoolSize: 8}, ready)
	}()
	select {
	case <-ready:
	case err := <-runErr:
		t.Fatalf("RunWorker ended before ready: %v", err)
	case <-ctx.Done():
		t.Fatal("worker not ready")
	}
	select {
	case <-done:
	case err := <-runErr:
		t.Fatalf("RunWorker ended early: %v", err)
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("only %d of %d callbacks arrived", len(got), n)
	}
	stop()
	select {
	case err := <-runErr:
		if err != nil {
			t.Errorf("RunWorker: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("RunWorker did not return after cancel")
	}

	mu.Lock()
	defer mu.Unlock()
	if !failed {
		t.Errorf("job %s was never answered 500", failOnce)
	}
	var maxLate time.Duration
	for id, j := range jobs {
		ds := got[id]
		if len(ds) != 1 {
			t.Errorf("%s: %d deliveries, want 1", id, len(ds))
			continue
		}
		d := ds[0]
		wantAttempt := 1
		if id == failOnce {
			wantAttempt = 2
		}
		if d.body.Namespace != "river" || d.body.Attempt != wantAttempt ||
			d.body.ExecuteAt != j.ExecuteAt.UTC().Format(time.RFC3339Nano) {
			t.Errorf("%s: body %+v, want namespace river, attempt %d, executeAt %s", id, d.body, wantAttempt, j.ExecuteAt.UTC().Format(time.RFC3339Nano))
		}
		var p struct{ I int }
		if err := json.Unmarshal(d.body.Payload, &p); err != nil || fmt.Sprintf("t-%d", p.I) != id {
			t.Errorf("%s: payload %s", id, d.body.Payload)
		}
		if d.at.Before(j.ExecuteAt) {
			t.Errorf("%s: arrived %s before its time", id, j.ExecuteAt.Sub(d.at))
		}
		if late := d.at.Sub(j.ExecuteAt); late > maxLate && id != failOnce {
			maxLate = late
		}
	}
	t.Logf("max lateness (first attempts) %s", maxLate)
}

func TestRunWorkerRejectsSchedulerInterval(t *testing.T) {
	err := RunWorker(context.Background(), WorkerConfig{Tuned: true, SchedulerInterval: 100 * time.Millisecond}, nil)
	if err == nil || !strings.Contains(err.Error(), "SchedulerInterval") {
		t.Fatalf("RunWorker = %v, want a SchedulerInterval error", err)
	}
}
