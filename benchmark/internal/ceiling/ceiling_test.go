package ceiling

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

func checkResult(t *testing.T, r Result, name string, concurrency int) {
	t.Helper()
	t.Logf("%+v", r)
	if r.Name != name || r.Concurrency != concurrency || r.Ops <= 0 || r.Seconds <= 0 ||
		r.PerSecond <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
		t.Errorf("implausible result %+v", r)
	}
}

func TestHTTPPost(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		n.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	r, err := HTTPPost(context.Background(), srv.URL, []byte(`{"a":1}`), 4, 300*time.Millisecond)
	if err != nil {
		t.Fatalf("HTTPPost: %v", err)
	}
	checkResult(t, r, "http-post", 4)
	if int64(r.Ops) != n.Load() {
		t.Errorf("ops %d, server saw %d", r.Ops, n.Load())
	}

	fail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	defer fail.Close()
	if _, err := HTTPPost(context.Background(), fail.URL, nil, 2, 100*time.Millisecond); err == nil {
		t.Error("HTTPPost against a 503 server: no error")
	}
}

func TestPGInsertDelete(t *testing.T) {
	pgURL := freshDB(t)
	ctx := context.Background()

	ins, del, err := PGInsertDelete(ctx, pgURL, 4, 300*time.Millisecond)
	if err != nil {
		t.Fatalf("PGInsertDelete: %v", err)
	}
	checkResult(t, ins, "pg-insert", 4)
	checkResult(t, del, "pg-delete", 4)
	if del.Ops > ins.Ops {
		t.Errorf("deleted %d rows, inserted only %d", del.Ops, ins.Ops)
	}

	ins, err = PGInsert(ctx, pgURL, 2, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("PGInsert: %v", err)
	}
	checkResult(t, ins, "pg-insert", 2)

	// Both runs dropped their tables.
	conn, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var tables int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ceiling_timers_%'").Scan(&tables); err != nil {
		t.Fatalf("count tables: %v", err)
	}
	if tables != 0 {
		t.Errorf("%d ceiling tables left behind", tables)
	}
}

func TestRunStopsWhenOutOfWork(t *testing.T) {
	durs, elapsed, err := run(context.Background(), 3, time.Minute, func(_ context.Context, _, n int) (bool, error) {
		return n < 5, nil
	})
	if err != nil || len(durs) != 15 || elapsed > 10*time.Second {
		t.Errorf("run = %d ops in %s, %v; want 15 ops at once", len(durs), elapsed, err)
	}
}
