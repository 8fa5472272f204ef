package postgres

// Statements are the driver's statements on table, by name, for the plan
// tests.
func Statements(table string) map[string]string {
	q := newQueries(table)
	return map[string]string{
		"shard get": q.shardGet, "shard claim": q.shardClaim, "shard release": q.shardRelease,
		"timer create": q.timerCreate, "timer create batch": q.timerCreateBatch, "timer update": q.timerUpdate, "timer update if due at": q.timerUpdateIfDueAt,
		"timer get": q.timerGet, "timer delete": q.timerDelete,
		"timer get window": q.timerGetWindow, "timer delete range": q.timerDeleteRange,
	}
}

// CreatesWaiting is how many creates wait for a batch, and CreatesInFlight
// how many create statements run.
func (s *Store) CreatesWaiting() (waiting, inFlight int) {
	s.creates.mu.Lock()
	defer s.creates.mu.Unlock()
	return len(s.creates.waiting), s.creates.inFlight
}
