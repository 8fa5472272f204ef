package system

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/procstat"
	"github.com/dtimer/dtimer/benchmark/internal/river"
)

// RiverConfig describes a River peer under test.
type RiverConfig struct {
	Label  string // "defaults" or "tuned"
	Worker river.WorkerConfig
	// Drop removes the peer's database.
	Drop        func(context.Context) error
	CallbackURL string
	LogDir      string
	// Clients is the size of the inserting pool (the harness's side).
	Clients int
}

// River runs River workers in a child process (the harness binary with the
// river-worker command), so that their CPU and memory are measured apart
// from the harness's, and so that a backlog run can stop and start them like
// a dtimer server. Timers are inserted from the harness process.
type River struct {
	cfg    RiverConfig
	ins    *river.Inserter
	cmd    *exec.Cmd
	exited chan struct{}
	last   procstat.Sample
}

// NewRiver migrates River's tables and opens the inserting pool.
func NewRiver(ctx context.Context, cfg RiverConfig) (*River, error) {
	if err := river.Migrate(ctx, cfg.Worker.PGURL); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	ins, err := river.NewInserter(ctx, cfg.Worker.PGURL, int32(max(cfg.Clients, 4)))
	if err != nil {
		return nil, err
	}
	return &River{cfg: cfg, ins: ins}, nil
}

// Name implements System.
func (r *River) Name() string { return "river/" + r.cfg.Label }

// Describe says which settings this peer runs with.
func (r *River) Describe() string { return r.cfg.Worker.Describe() }

// WorkerArgs are the command-line arguments of the river-worker command for
// c; ParseWorkerArgs reads them back.
func WorkerArgs(c river.WorkerConfig) []string {
	return []string{"river-worker",
		"--pg-url=" + c.PGURL,
		"--tuned=" + strconv.FormatBool(c.Tuned),
		"--workers=" + strconv.Itoa(c.Workers),
		"--fetch-cooldown=" + c.FetchCooldown.String(),
		"--fetch-poll-interval=" + c.FetchPollInterval.String(),
		"--scheduler-interval=" + c.SchedulerInterval.String(),
		"--pool=" + strconv.Itoa(int(c.PoolSize)),
	}
}

// Start implements System.
func (r *River) Start(ctx context.Context) error {
	if r.cmd != nil {
		select {
		case <-r.exited:
		default:
			return nil
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(r.cfg.LogDir, "river-"+r.cfg.Label+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, WorkerArgs(r.cfg.Worker)...)
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		f.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.TrimSpace(sc.Text()) == "ready" {
				close(ready)
				signalled = true
			}
			fmt.Fprintln(f, sc.Text())
		}
		_ = cmd.Wait()
		_ = f.Close()
		close(r.exited)
	}()
	select {
	case <-ready:
		return nil
	case <-r.exited:
		return fmt.Errorf("river worker exited at start; see %s", f.Name())
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		return errors.New("river worker not ready within a minute")
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return ctx.Err()
	}
}

// Stop implements System.
func (r *River) Stop(ctx context.Context) error {
	if r.cmd == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	r.Usage()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
		return nil
	case <-ctx.Done():
		_ = r.cmd.Process.Kill()
		<-r.exited
		return errors.New("river worker did not stop in time; killed")
	}
}

// Create implements System: one job insert.
func (r *River) Create(ctx context.Context, t Timer) error {
	return r.ins.Insert(ctx, r.job(t))
}

// CreateMany implements BulkCreator with River's bulk insert.
func (r *River) CreateMany(ctx context.Context, ts []Timer) error {
	jobs := make([]river.Job, len(ts))
	for i, t := range ts {
		jobs[i] = r.job(t)
	}
	return r.ins.InsertMany(ctx, jobs)
}

func (r *River) job(t Timer) river.Job {
	return river.Job{ID: t.ID, ExecuteAt: t.ExecuteAt, URL: r.cfg.CallbackURL, Payload: t.Payload}
}

// Usage implements System.
func (r *River) Usage() procstat.Sample {
	if r.cmd != nil && r.cmd.Process != nil {
		select {
		case <-r.exited:
		default:
			if s, err := procstat.Of(r.cmd.Process.Pid); err == nil {
				r.last = s
			}
		}
	}
	return r.last
}

// Counters implements System: River exposes none.
func (r *River) Counters(context.Context) (map[string]float64, error) { return nil, nil }

// Close implements System.
func (r *River) Close(ctx context.Context) error {
	err := r.Stop(ctx)
	r.ins.Close()
	if r.cfg.Drop != nil {
		err = errors.Join(err, r.cfg.Drop(ctx))
	}
	return err
}
