package sqlite

// schema is the unified table. Times are INTEGER Unix milliseconds (exact,
// and compared as integers); UUIDs are 16-byte BLOBs, compared bytewise like
// timer.Position does.
//
// row_type leads the clustering key after the partition (namespace,
// shard_id), so the shard row (1) and failed timers (3) sit outside the
// pending-timer range (2) that the engine scans and range-deletes; within
// that range rows are ordered by (execute_at, timer_uuid), the firing order.
// WITHOUT ROWID makes the primary key the table's own B-tree, so a window
// read or a prefix delete walks one contiguous key range.
const schema = `
CREATE TABLE IF NOT EXISTS timers (
	namespace                 TEXT    NOT NULL,
	shard_id                  INTEGER NOT NULL,
	row_type                  INTEGER NOT NULL,
	execute_at                INTEGER NOT NULL, -- due time (timer.DueAt); 0 for shard rows
	timer_uuid                BLOB    NOT NULL, -- zero UUID for shard rows
	timer_id                  TEXT,
	timer_execute_at          INTEGER,          -- executeAt as scheduled (timer.ExecuteAt)
	timer_callback_url        TEXT,
	timer_payload             TEXT,
	timer_retry_policy        TEXT,
	timer_callback_timeout_ms INTEGER,
	timer_created_at          INTEGER,
	timer_updated_at          INTEGER,
	timer_attempts            INTEGER,
	timer_last_error          TEXT,
	shard_version             INTEGER,
	shard_owner               TEXT,
	shard_claimed_at          INTEGER,
	PRIMARY KEY (namespace, shard_id, row_type, execute_at, timer_uuid)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS timers_by_id ON timers (namespace, shard_id, timer_id);
`
