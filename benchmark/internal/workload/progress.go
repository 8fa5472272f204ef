package workload

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Progress shows long phases: a bar on a terminal, a line at the start and
// end of each phase otherwise (CI logs).
type Progress struct {
	Out io.Writer
	TTY bool
}

// NewProgress writes to stderr, with bars if it is a terminal.
func NewProgress() *Progress {
	return &Progress{Out: os.Stderr, TTY: term.IsTerminal(int(os.Stderr.Fd()))}
}

// Logf prints one line.
func (p *Progress) Logf(format string, args ...any) {
	fmt.Fprintf(p.Out, "bench: "+format+"\n", args...)
}

// Bar is one phase's progress.
type Bar struct {
	bar   *progressbar.ProgressBar
	p     *Progress
	desc  string
	start time.Time
}

// Start begins a phase of n steps.
func (p *Progress) Start(desc string, n int) *Bar {
	b := &Bar{p: p, desc: desc, start: time.Now()}
	if p.TTY {
		b.bar = progressbar.NewOptions(n,
			progressbar.OptionSetWriter(p.Out),
			progressbar.OptionSetDescription(desc),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("/s"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionFullWidth(),
		)
	} else {
		p.Logf("%s (%d)...", desc, n)
	}
	return b
}

// Set moves the bar to done steps.
func (b *Bar) Set(done int) {
	if b.bar != nil {
		_ = b.bar.Set(done)
	}
}

// Add advances the bar by n steps.
func (b *Bar) Add(n int) {
	if b.bar != nil {
		_ = b.bar.Add(n)
	}
}

// Done ends the phase.
func (b *Bar) Done() {
	if b.bar != nil {
		_ = b.bar.Finish()
	}
	b.p.Logf("%s: done in %s", b.desc, time.Since(b.start).Round(time.Millisecond))
}
