package mysql

// The driver's statements. Placeholders are filled in by the client
// (interpolateParams), so a statement with arguments is one round trip, and a
// fenced write, a batch of statements, is one too.

// timerColumns are the columns scanTimer reads, in its order.
const timerColumns = `namespace, shard_id, row_type, execute_at, timer_uuid, timer_id, timer_execute_at,
	timer_callback_url, timer_payload, timer_retry_policy, timer_callback_timeout_ms,
	timer_created_at, timer_updated_at, timer_attempts, timer_last_error`

// shardRowKey is the shard row's full primary key after (namespace,
// shard_id): an equality on every key column makes InnoDB lock that one
// record and no gap next to it.
const shardRowKey = `row_type = 1 AND execute_at = '1970-01-01 00:00:00.000'
	AND timer_uuid = X'00000000000000000000000000000000'`

// Every fenced write is one batch (see Store.fenced):
//
//	fenceBegin, the write's statements (each conditioned on fenceHeld), fenceEnd
//
// fenceBegin opens a READ COMMITTED transaction (set per transaction, as
// MySQL and MariaDB both accept it, whatever they call the system variable)
// and locks the shard row in share mode: ? namespace, ? shard, ? the fence's
// version. @dtimer_fence is 1 if the row still has that version, else 0.
// The share lock conflicts with the exclusive lock of a claim's UPDATE: a
// claim waits for every fenced write in flight, and a fenced write that
// starts while a claim is in flight waits for it, then reads the committed
// new version (a locking read always reads the latest) and writes nothing.
//
// READ COMMITTED keeps InnoDB from locking gaps in the write's range scans,
// which would otherwise make concurrent creates in one shard deadlock often.
const fenceBegin = `SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
START TRANSACTION;
SELECT COUNT(*) INTO @dtimer_fence FROM timers
WHERE namespace = ? AND shard_id = ? AND ` + shardRowKey + ` AND shard_version = ?
LOCK IN SHARE MODE;
`

// fenceHeld ends the WHERE of every write statement of a batch. The server
// treats a user variable as a constant while it plans a statement: with a
// stale fence the plan is "impossible WHERE", which reads and locks nothing.
const fenceHeld = ` AND @dtimer_fence = 1`

// fenceEnd records the rows the last write statement matched (the client
// asks for found, not changed, rows), commits, and answers (fence held, rows
// matched); see fenceResult.
const fenceEnd = `;
SET @dtimer_rows = ROW_COUNT();
COMMIT;
SELECT @dtimer_fence, @dtimer_rows`

const (
	shardGet = `SELECT shard_version, shard_owner, shard_claimed_at FROM timers
WHERE namespace = ? AND shard_id = ? AND ` + shardRowKey

	// A first claim creates the shard row; a concurrent first claim finds it
	// in the primary key (a duplicate key error): a lost race.
	shardInsert = `INSERT INTO timers (namespace, shard_id, row_type, execute_at, timer_uuid,
	shard_version, shard_owner, shard_claimed_at)
VALUES (?, ?, 1, '1970-01-01 00:00:00.000', X'00000000000000000000000000000000', 1, ?, ?)`

	// A concurrent claim waits for the row's lock, then reads the committed
	// version (an UPDATE reads the latest): one claim wins.
	shardClaim = `UPDATE timers SET shard_version = shard_version + 1, shard_owner = ?, shard_claimed_at = ?
WHERE namespace = ? AND shard_id = ? AND ` + shardRowKey + ` AND shard_version = ?`

	shardRelease = `UPDATE timers SET shard_owner = ''
WHERE namespace = ? AND shard_id = ? AND ` + shardRowKey + ` AND shard_version = ?`

	timerGet = `SELECT ` + timerColumns + ` FROM timers
WHERE namespace = ? AND shard_id = ? AND timer_id = ?`

	// The window is one range of the primary key: the partition and row type
	// by equality, the position after ? ? (exclusive), the due time up to ?
	// (inclusive). The position bound is spelt out rather than written as a
	// row comparison, which MySQL does not turn into an index range. FORCE
	// INDEX keeps a planner that misjudges a small table from choosing the
	// unique key and sorting.
	timerGetWindow = `SELECT ` + timerColumns + ` FROM timers FORCE INDEX (PRIMARY)
WHERE namespace = ? AND shard_id = ? AND row_type = 2
	AND (execute_at > ? OR (execute_at = ? AND timer_uuid > ?))
	AND execute_at <= ?
ORDER BY execute_at, timer_uuid
LIMIT ?`
)

// Write statements, run inside a fenced batch after fenceBegin.
const (
	// timerLocate finds the stored timer with the id ? of the shard through
	// the unique key, locks it, and keeps its primary key in @dtimer_at,
	// @dtimer_type and @dtimer_uuid (NULL when there is none). The writes by
	// id then name the row by its whole primary key: an UPDATE or DELETE
	// whose WHERE names the id would be planned by the server, which on a
	// small table scans the shard's primary key range from its start and so
	// locks the shard row exclusively, deadlocking with every other fenced
	// write of the shard. A SELECT takes FORCE INDEX; a DELETE does not.
	timerLocate = `SET @dtimer_type = NULL, @dtimer_at = NULL, @dtimer_uuid = NULL;
SELECT row_type, execute_at, timer_uuid INTO @dtimer_type, @dtimer_at, @dtimer_uuid
FROM timers FORCE INDEX (timers_timer_id_key)
WHERE namespace = ? AND shard_id = ? AND timer_id = ?` + fenceHeld + `
FOR UPDATE;
`

	// located is the WHERE of a write to the row timerLocate found.
	located = `WHERE namespace = ? AND shard_id = ?
	AND row_type = @dtimer_type AND execute_at = @dtimer_at AND timer_uuid = @dtimer_uuid` + fenceHeld

	// timerDelete removes the located timer, pending or failed. Its
	// placeholders are timerLocate's, then the namespace and shard again.
	timerDelete = timerLocate + `DELETE FROM timers ` + located

	// timerCreate removes the located timer wherever it is and inserts the
	// new one, so that a timer has exactly one row whatever its position or
	// status. Its placeholders are timerDelete's, then the namespace, the
	// shard and timerArgs. INSERT ... ON DUPLICATE KEY UPDATE would be one
	// statement, but it would have to repeat every value or use VALUES(),
	// which MySQL deprecates, and it would be planned as the UPDATE above.
	timerCreate = timerDelete + `;
INSERT INTO timers (` + timerColumns + `)
SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM DUAL WHERE TRUE` + fenceHeld

	// timerUpdate replaces the located timer, moving the row by updating its
	// key columns. Its placeholders are timerLocate's, then timerArgs, then
	// the namespace and shard again.
	timerUpdate = timerLocate + `UPDATE timers SET
	row_type = ?, execute_at = ?, timer_uuid = ?, timer_id = ?, timer_execute_at = ?,
	timer_callback_url = ?, timer_payload = ?, timer_retry_policy = ?, timer_callback_timeout_ms = ?,
	timer_created_at = ?, timer_updated_at = ?, timer_attempts = ?, timer_last_error = ?
` + located

	// timerIfDueAt narrows timerUpdate to a timer still pending at ?.
	timerIfDueAt = ` AND row_type = 2 AND execute_at = ?`

	// The range delete is one range of the primary key, from the start of the
	// shard's pending timers up to the position ? ? (inclusive).
	timerDeleteRange = `DELETE FROM timers
WHERE namespace = ? AND shard_id = ? AND row_type = 2
	AND (execute_at < ? OR (execute_at = ? AND timer_uuid <= ?))` + fenceHeld
)
