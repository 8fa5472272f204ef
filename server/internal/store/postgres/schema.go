package postgres

import "fmt"

// The one table, timers, holds both kinds of rows of a shard partition
// (namespace, shard_id):
//
//   - the shard row (row_type 1): shard_version, shard_owner and
//     shard_claimed_at; execute_at is the Unix epoch and timer_uuid the zero
//     UUID, timer_id is NULL;
//   - timer rows (row_type 2 pending, 3 failed): the timer_* columns, with
//     execute_at holding the timer's due time (timer.DueAt, not its ExecuteAt,
//     which is timer_execute_at).
//
// The primary key (namespace, shard_id, row_type, execute_at, timer_uuid) is
// the firing order of a shard, timer.Position, behind the partition and the
// row type. row_type is in the key, before the position, so that the shard
// row and failed timers sort outside the contiguous range of pending timers:
// the engine's window read and its range delete of fired timers are then
// plain range scans of the primary key, bounded by (execute_at, timer_uuid)
// row comparisons, that can never touch the shard row (which every fenced
// write locks) or a failed timer. Failed timers stay readable and deletable
// by id through the unique index on (namespace, shard_id, timer_id); shard
// rows have a NULL timer_id, and NULLs never conflict in a unique index.
//
// An upsert (TimerCreate) finds the old row by that unique index and moves it
// by updating its key columns (row_type, execute_at): a timer has exactly one
// row whatever its status or position.
//
// Payloads and retry policies are text, not jsonb: the store never looks into
// them, text keeps the caller's bytes exactly (key order included) and accepts
// JSON that jsonb refuses, such as a "\u0000" escape.
//
// Times are timestamptz (microseconds); callback timeouts whole milliseconds.
const schemaSQL = `
CREATE TABLE IF NOT EXISTS %[1]s (
	namespace                 text        NOT NULL,
	shard_id                  integer     NOT NULL,
	row_type                  smallint    NOT NULL,
	execute_at                timestamptz NOT NULL,
	timer_uuid                uuid        NOT NULL,
	timer_id                  text,
	timer_execute_at          timestamptz,
	timer_callback_url        text,
	timer_payload             text,
	timer_retry_policy        text,
	timer_callback_timeout_ms bigint,
	timer_created_at          timestamptz,
	timer_updated_at          timestamptz,
	timer_attempts            integer,
	timer_last_error          text,
	shard_version             bigint,
	shard_owner               text,
	shard_claimed_at          timestamptz,
	CONSTRAINT timers_pkey PRIMARY KEY (namespace, shard_id, row_type, execute_at, timer_uuid),
	CONSTRAINT timers_row_type_check CHECK (row_type IN (1, 2, 3))
);
CREATE UNIQUE INDEX IF NOT EXISTS timers_timer_id_key ON %[1]s (namespace, shard_id, timer_id);
`

// pkeyConstraint is the primary key's name, which a racing upsert may report
// in a unique violation (see Store.TimerCreate).
const pkeyConstraint = "timers_pkey"

func schemaDDL(table string) string { return fmt.Sprintf(schemaSQL, table) }
