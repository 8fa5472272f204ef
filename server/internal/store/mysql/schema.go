package mysql

// The one table, timers, in the database the DSN names, holds both kinds of
// rows of a shard partition (namespace, shard_id):
//
//   - the shard row (row_type 1): shard_version, shard_owner and
//     shard_claimed_at; execute_at is the Unix epoch and timer_uuid sixteen
//     zero bytes (shardRowKey), timer_id is NULL;
//   - timer rows (row_type 2 pending, 3 failed): the timer_* columns, with
//     execute_at holding the timer's due time (timer.DueAt, not its ExecuteAt,
//     which is timer_execute_at).
//
// InnoDB stores a table as its primary key's B-tree, so the primary key
// (namespace, shard_id, row_type, execute_at, timer_uuid) is the physical
// order of the rows: a shard's pending timers lie next to each other in
// firing order, timer.Position. row_type comes before the position so that the
// shard row and failed timers sort outside the contiguous run of pending
// timers: the engine's window read and its range delete of fired timers are
// then one range scan of the clustered index each, which never touches the
// shard row (which every fenced write locks) or a failed timer. Failed
// timers stay readable and deletable by id through the unique key on
// (namespace, shard_id, timer_id); shard rows have a NULL timer_id, and NULLs
// never conflict in a unique key.
//
// Strings the store compares (namespace, timer id) are VARBINARY: compared
// byte for byte, as Go compares them, with no collation folding case or
// ignoring trailing spaces (MariaDB's utf8mb4_bin pads, MySQL's does not).
// timer_uuid is BINARY(16), so that it sorts as timer.Position compares UUIDs,
// bytewise. The other strings are BLOBs: the store never looks into them and
// gets back exactly the bytes it wrote (a payload's key order and escapes
// included), whatever the connection's character set.
//
// Times are DATETIME(3): milliseconds, no time zone; the driver writes and
// reads them as UTC, so the session time zone does not matter (TIMESTAMP
// would convert through it, and ends in 2038). Callback timeouts are whole
// milliseconds.
const schemaSQL = "CREATE TABLE IF NOT EXISTS `timers` (" + `
	namespace                 VARBINARY(255) NOT NULL,
	shard_id                  INT            NOT NULL,
	row_type                  TINYINT        NOT NULL,
	execute_at                DATETIME(3)    NOT NULL,
	timer_uuid                BINARY(16)     NOT NULL,
	timer_id                  VARBINARY(255),
	timer_execute_at          DATETIME(3),
	timer_callback_url        BLOB,
	timer_payload             LONGBLOB,
	timer_retry_policy        BLOB,
	timer_callback_timeout_ms BIGINT,
	timer_created_at          DATETIME(3),
	timer_updated_at          DATETIME(3),
	timer_attempts            INT,
	timer_last_error          BLOB,
	shard_version             BIGINT,
	shard_owner               BLOB,
	shard_claimed_at          DATETIME(3),
	PRIMARY KEY (namespace, shard_id, row_type, execute_at, timer_uuid),
	UNIQUE KEY timers_timer_id_key (namespace, shard_id, timer_id),
	CONSTRAINT timers_row_type_check CHECK (row_type IN (1, 2, 3))
) ENGINE=InnoDB`
