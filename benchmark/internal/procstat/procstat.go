// Package procstat reads a process's CPU time and memory from /proc, so the
// benchmark can report what the server (and the database) cost while a
// workload ran. Linux only, like the machines the benchmark runs on.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat; it
// is 100 on every Linux architecture Go supports.
const clockTicks = 100

// Sample is a reading of one process (or the sum over several).
type Sample struct {
	CPUSeconds float64 `json:"cpuSeconds"`
	RSSBytes   int64   `json:"rssBytes"`
	// PeakRSSBytes is the high-water mark of the resident set since the
	// process started (VmHWM).
	PeakRSSBytes int64 `json:"peakRssBytes"`
}

// Of reads process pid.
func Of(pid int) (Sample, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return Sample{}, err
	}
	// The command name, field 2, is in parentheses and may hold spaces:
	// count fields after its closing parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return Sample{}, fmt.Errorf("procstat: unexpected %s/stat", dir)
	}
	f := strings.Fields(string(stat[i+1:]))
	// After ")" come state (field 3) onwards: utime is field 14, stime 15.
	if len(f) < 13 {
		return Sample{}, fmt.Errorf("procstat: short %s/stat", dir)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	s := Sample{CPUSeconds: (ut + st) / clockTicks}
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return Sample{}, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "VmRSS":
			s.RSSBytes = kb(v)
		case "VmHWM":
			s.PeakRSSBytes = kb(v)
		}
	}
	return s, nil
}

func kb(v string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
	return n << 10
}

// ByName sums the readings of every process whose command name is comm (a
// database server's processes: PostgreSQL runs one per connection). Memory
// summed this way counts shared pages more than once; CPU is exact.
func ByName(comm string) (Sample, error) {
	return Matching(func(c, _ string) bool { return c == comm })
}

// Matching sums the readings of every process for which match(comm,
// cmdline) is true: a Java database server is told apart by its command
// line, not its name.
func Matching(match func(comm, cmdline string) bool) (Sample, error) {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return Sample{}, err
	}
	var sum Sample
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		c, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err != nil {
			continue
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if !match(strings.TrimSpace(string(c)), string(bytes.ReplaceAll(cl, []byte{0}, []byte{' '}))) {
			continue
		}
		s, err := Of(pid)
		if err != nil {
			continue // exited meanwhile
		}
		sum.CPUSeconds += s.CPUSeconds
		sum.RSSBytes += s.RSSBytes
		sum.PeakRSSBytes += s.PeakRSSBytes
	}
	return sum, nil
}
