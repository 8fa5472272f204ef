// Package receiver is the benchmark's HTTP callback endpoint: it runs in the
// harness process, answers every POST with 200 at once, and stamps each
// arrival, so lateness is "arrival minus executeAt" on one clock for every
// system measured (dtimer and its peer POST the same body).
package receiver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Body is the part of a callback body the receiver reads; dtimer's callback
// body and the peer's carry the same fields.
type Body struct {
	TimerID   string `json:"timerId"`
	ExecuteAt string `json:"executeAt"`
	Attempt   int    `json:"attempt"`
}

// Arrival is one callback as received.
type Arrival struct {
	ID        string
	ExecuteAt time.Time
	At        time.Time
	Attempt   int
}

// Receiver records callbacks. Reset starts a new run.
type Receiver struct {
	URL string

	srv *http.Server
	ln  net.Listener

	mu       sync.Mutex
	arrivals []Arrival
	seen     map[string]struct{}
	bad      int
	want     int
	reached  chan struct{}
}

// Start listens on addr ("127.0.0.1:0" for any free port).
func Start(addr string) (*Receiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	r := &Receiver{ln: ln, URL: "http://" + ln.Addr().String() + "/callback", seen: map[string]struct{}{}}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.handle), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// Close stops serving.
func (r *Receiver) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.srv.Shutdown(ctx)
}

func (r *Receiver) handle(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	raw, err := io.ReadAll(req.Body)
	var b Body
	if err == nil {
		err = json.Unmarshal(raw, &b)
	}
	var due time.Time
	if err == nil {
		due, err = time.Parse(time.RFC3339Nano, b.ExecuteAt)
	}
	if err == nil && b.TimerID == "" {
		err = errors.New("no timerId")
	}
	r.mu.Lock()
	if err != nil {
		r.bad++
	} else {
		r.arrivals = append(r.arrivals, Arrival{ID: b.TimerID, ExecuteAt: due, At: at, Attempt: b.Attempt})
		if _, ok := r.seen[b.TimerID]; !ok {
			r.seen[b.TimerID] = struct{}{}
			if r.reached != nil && len(r.seen) >= r.want {
				close(r.reached)
				r.reached = nil
			}
		}
	}
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// Reset forgets every arrival: a new run starts.
func (r *Receiver) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.arrivals = nil
	r.seen = map[string]struct{}{}
	r.bad = 0
	if r.reached != nil {
		close(r.reached)
		r.reached = nil
	}
}

// Distinct is how many different timers have called back since Reset.
func (r *Receiver) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Bad is how many requests could not be read as a callback since Reset.
func (r *Receiver) Bad() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bad
}

// Expect returns a channel closed once n different timers have called back
// since Reset (at once if they already have).
func (r *Receiver) Expect(n int) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := make(chan struct{})
	if len(r.seen) >= n {
		close(ch)
		return ch
	}
	if r.reached != nil {
		close(r.reached) // only one waiter at a time; release the old one
	}
	r.want, r.reached = n, ch
	return ch
}

// Arrivals returns a copy of every arrival since Reset, in arrival order.
func (r *Receiver) Arrivals() []Arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Arrival(nil), r.arrivals...)
}
