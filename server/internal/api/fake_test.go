package api

import (
	"context"
	"sync"
	"time"

	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// fakeService is an in-memory routing.Service that records its calls. The
// real service is covered by the end-to-end tests; here only what the API
// sends and how it answers matter.
type fakeService struct {
	now time.Time

	mu     sync.Mutex
	timers map[timer.Key]*timer.Timer
	// err, when set, is what every timer operation returns.
	err      error
	readyErr error
	calls    []string
	created  []*timer.Timer
	patches  []timer.Patch
	keys     []timer.Key
	// forwarded records, per Create call, whether its ctx was marked as
	// serving a forwarded call.
	forwarded []bool
	// Forward's answer and what it was asked to send.
	relay      *routing.Relayed
	relayErr   error
	sentTo     *routing.NotLocalError
	sentPath   string
	sentBody   []byte
	clusterV   *routing.ClusterView
	clusterErr error
}

var _ routing.Service = (*fakeService)(nil)

func newFakeService(now time.Time) *fakeService {
	return &fakeService{now: now, timers: map[timer.Key]*timer.Timer{}}
}

func (f *fakeService) record(call string) error {
	f.calls = append(f.calls, call)
	return f.err
}

func (f *fakeService) Create(ctx context.Context, t *timer.Timer) (*timer.Timer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, t.Clone())
	f.forwarded = append(f.forwarded, routing.IsForwarded(ctx))
	if err := f.record("Create"); err != nil {
		return nil, err
	}
	n := t.Clone()
	n.UUID = timer.UUIDOf(n.Namespace, n.ID)
	n.DueAt = n.ExecuteAt
	n.CreatedAt = f.now
	n.UpdatedAt = f.now
	n.Status = timer.StatusPending
	f.timers[n.Key()] = n
	return n.Clone(), nil
}

func (f *fakeService) Get(_ context.Context, key timer.Key) (*timer.Timer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	if err := f.record("Get"); err != nil {
		return nil, err
	}
	t, ok := f.timers[key]
	if !ok {
		return nil, store.ErrTimerNotFound
	}
	return t.Clone(), nil
}

func (f *fakeService) Update(_ context.Context, key timer.Key, patch timer.Patch) (*timer.Timer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	f.patches = append(f.patches, patch)
	if err := f.record("Update"); err != nil {
		return nil, err
	}
	t, ok := f.timers[key]
	if !ok {
		return nil, store.ErrTimerNotFound
	}
	n := patch.Apply(t, f.now)
	f.timers[key] = n
	return n.Clone(), nil
}

func (f *fakeService) Delete(_ context.Context, key timer.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	if err := f.record("Delete"); err != nil {
		return err
	}
	if _, ok := f.timers[key]; !ok {
		return store.ErrTimerNotFound
	}
	delete(f.timers, key)
	return nil
}

func (f *fakeService) Forward(_ context.Context, to *routing.NotLocalError, path string, body []byte) (*routing.Relayed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sentTo, f.sentPath, f.sentBody = to, path, append([]byte(nil), body...)
	return f.relay, f.relayErr
}

func (f *fakeService) Cluster(context.Context) (*routing.ClusterView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clusterV, f.clusterErr
}

func (f *fakeService) Ready(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readyErr
}

// put stores a timer as if created earlier.
func (f *fakeService) put(t *timer.Timer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timers[t.Key()] = t.Clone()
}

func (f *fakeService) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeService) setReadyErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readyErr = err
}

func (f *fakeService) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeService) lastCreated() *timer.Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.created) == 0 {
		return nil
	}
	return f.created[len(f.created)-1]
}

func (f *fakeService) lastPatch() (timer.Key, timer.Patch, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.patches) == 0 {
		return timer.Key{}, timer.Patch{}, false
	}
	return f.keys[len(f.keys)-1], f.patches[len(f.patches)-1], true
}

func (f *fakeService) lastKey() timer.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.keys) == 0 {
		return timer.Key{}
	}
	return f.keys[len(f.keys)-1]
}
