package stats

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if got := Percentile(ds, 50); got != 50*time.Millisecond {
		t.Errorf("p50 = %s", got)
	}
	if got := Percentile(ds, 99); got != 99*time.Millisecond {
		t.Errorf("p99 = %s", got)
	}
	if got := Percentile(ds[:1], 99); got != time.Millisecond {
		t.Errorf("p99 of one = %s", got)
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of none = %s", got)
	}
}
