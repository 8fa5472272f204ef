package cassandra

import (
	"fmt"
	"strings"
)

// The one table holds every row of a shard partition (namespace, shard_id),
// told apart by row_type, the first clustering column:
//
//   - row type 0, one per timer id: the id row. It maps the timer id
//     (timer_id, the last clustering column) to the timer's current clustering
//     key (id_row_type, id_due_at, id_uuid) and carries the timer's gen.
//   - row type 1: the shard row (shard_version, shard_owner,
//     shard_claimed_at). Its execute_at, timer_uuid and timer_id are the
//     zero values.
//   - row types 2 (pending) and 3 (failed): timer rows, clustered by
//     (execute_at, timer_uuid) = timer.Position, execute_at being the timer's
//     due time (timer.DueAt; its ExecuteAt is timer_execute_at). timer_id is
//     in the key as well, which costs nothing (the UUID already identifies
//     the timer) and keeps one key shape for all row types.
//
// The clustering order (row_type, execute_at, timer_uuid, timer_id) makes the
// pending timers one contiguous slice, in firing order, that neither the
// shard row nor id rows nor failed timers interrupt: the window read is one
// clustering slice of one partition and the range delete one range
// tombstone over that slice. timer_uuid is a blob, not a uuid, because
// Cassandra orders uuid values by version and time, not by bytes as
// timer.Position does.
//
// gen is a random UUID that every write of a timer gives both its id row and
// its timer row. Conditional batches compare it ("IF gen = ?") to detect that
// the timer changed since it was read, and TimerGet compares the two rows'
// gens to detect a timer row that moved between its two reads.
//
// Times are timestamps (milliseconds), bound as int64 Unix milliseconds.
// Payloads and retry policies are text: the store never looks into them.
const tableCQL = `
CREATE TABLE IF NOT EXISTS %s (
	namespace                 text,
	shard_id                  int,
	row_type                  tinyint,
	execute_at                timestamp,
	timer_uuid                blob,
	timer_id                  text,
	gen                       uuid,
	id_row_type               tinyint,
	id_due_at                 timestamp,
	id_uuid                   blob,
	timer_execute_at          timestamp,
	timer_callback_url        text,
	timer_payload             text,
	timer_retry_policy        text,
	timer_callback_timeout_ms bigint,
	timer_created_at          timestamp,
	timer_updated_at          timestamp,
	timer_attempts            int,
	timer_last_error          text,
	shard_version             bigint,
	shard_owner               text,
	shard_claimed_at          timestamp,
	PRIMARY KEY ((namespace, shard_id), row_type, execute_at, timer_uuid, timer_id)
) WITH comment = 'dtimer timers and shard claims'`

// rowTypeID is the row type of id rows; the others are store.RowType*.
const rowTypeID = 0

// queries are the driver's statements, with the qualified table name filled
// in once. Bind markers: p is the partition (namespace, shard_id); a full
// clustering key is (row_type, execute_at, timer_uuid, timer_id).
type queries struct {
	shardGet, shardInsert, shardClaim, shardRelease, fence string

	idGet, idGens, idInsert, idUpdate, idDelete, probe           string
	timerGet, timerInsert, timerUpdate, timerDelete, timerRemove string
	timerGetWindow, timerRangeIDs, timerRangeDelete              string
}

// timerColumns are the columns scanTimer reads, in its order.
const timerColumns = `namespace, shard_id, row_type, execute_at, timer_uuid, timer_id, gen,
	timer_execute_at, timer_callback_url, timer_payload, timer_retry_policy,
	timer_callback_timeout_ms, timer_created_at, timer_updated_at, timer_attempts, timer_last_error`

const (
	partition = `namespace = ? AND shard_id = ?`
	// fullKey names one row: the partition and the whole clustering key.
	fullKey = partition + ` AND row_type = ? AND execute_at = ? AND timer_uuid = ? AND timer_id = ?`
	// shardKey names the shard row.
	shardKey = partition + ` AND row_type = 1 AND execute_at = 0 AND timer_uuid = 0x AND timer_id = ''`
	// idKey names the id row of timer_id ?.
	idKey = partition + ` AND row_type = 0 AND execute_at = 0 AND timer_uuid = 0x AND timer_id = ?`
)

func newQueries(table string) queries {
	f := func(q string) string { return strings.TrimSpace(strings.ReplaceAll(q, "$T", table)) }
	return queries{
		shardGet: f(`SELECT shard_version, shard_owner, shard_claimed_at FROM $T WHERE ` + shardKey),
		shardInsert: f(`INSERT INTO $T (namespace, shard_id, row_type, execute_at, timer_uuid, timer_id,
	shard_version, shard_owner, shard_claimed_at) VALUES (?, ?, 1, 0, 0x, '', 1, ?, ?) IF NOT EXISTS`),
		shardClaim: f(`UPDATE $T SET shard_version = ?, shard_owner = ?, shard_claimed_at = ?
	WHERE ` + shardKey + ` IF shard_version = ?`),
		shardRelease: f(`UPDATE $T SET shard_owner = '' WHERE ` + shardKey + ` IF shard_version = ?`),
		// fence is the first statement of every fenced batch: it rewrites the
		// version it checks, because a conditional batch consists of writes.
		fence: f(`UPDATE $T SET shard_version = ? WHERE ` + shardKey + ` IF shard_version = ?`),

		idGet: f(`SELECT id_row_type, id_due_at, id_uuid, gen FROM $T WHERE ` + idKey),
		idGens: f(`SELECT timer_id, gen FROM $T WHERE ` + partition +
			` AND row_type = 0 AND execute_at = 0 AND timer_uuid = 0x AND timer_id IN ?`),
		idInsert: f(`INSERT INTO $T (namespace, shard_id, row_type, execute_at, timer_uuid, timer_id,
	id_row_type, id_due_at, id_uuid, gen) VALUES (?, ?, 0, 0, 0x, ?, ?, ?, ?, ?) IF NOT EXISTS`),
		// gen alone identifies the version of the id row; the conditions on
		// its other columns are there so that a batch that fails returns
		// them (Cassandra returns the columns a batch has conditions on).
		idUpdate: f(`UPDATE $T SET id_row_type = ?, id_due_at = ?, id_uuid = ?, gen = ?
	WHERE ` + idKey + ` IF gen = ? AND id_row_type = ? AND id_due_at = ? AND id_uuid = ?`),
		idDelete: f(`DELETE FROM $T WHERE ` + idKey + ` IF gen = ?`),
		// probe reads, in one round trip, the shard row, an id row and one
		// more row by full key (a timer row, or the id row again).
		probe: f(`SELECT row_type, timer_id, gen, id_row_type, id_due_at, id_uuid, shard_version FROM $T
	WHERE ` + partition + ` AND (row_type, execute_at, timer_uuid, timer_id)
	IN ((1, 0, 0x, ''), (0, 0, 0x, ?), (?, ?, ?, ?))`),

		timerGet: f(`SELECT ` + timerColumns + ` FROM $T WHERE ` + fullKey),
		timerInsert: f(`INSERT INTO $T (` + timerColumns + `)
	VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
		timerUpdate: f(`UPDATE $T SET gen = ?, timer_execute_at = ?, timer_callback_url = ?, timer_payload = ?,
	timer_retry_policy = ?, timer_callback_timeout_ms = ?, timer_created_at = ?, timer_updated_at = ?,
	timer_attempts = ?, timer_last_error = ?
	WHERE ` + fullKey + ` IF gen = ?`),
		timerDelete: f(`DELETE FROM $T WHERE ` + fullKey + ` IF gen = ?`),
		timerRemove: f(`DELETE FROM $T WHERE ` + fullKey),

		// A tuple relation on (execute_at, timer_uuid) after row_type = 2 makes
		// both bounds of one clustering slice; the upper bound's UUID is the
		// largest 16-byte blob, so the due time bound is inclusive.
		timerGetWindow: f(`SELECT ` + timerColumns + ` FROM $T WHERE ` + partition + ` AND row_type = 2
	AND (execute_at, timer_uuid) > (?, ?) AND (execute_at, timer_uuid) <= (?, 0xffffffffffffffffffffffffffffffff)
	LIMIT ?`),
		timerRangeIDs: f(`SELECT timer_id, gen FROM $T WHERE ` + partition + ` AND row_type = 2
	AND (execute_at, timer_uuid) <= (?, ?)`),
		// One range tombstone: the same slice as the window read's.
		timerRangeDelete: f(`DELETE FROM $T WHERE ` + partition + ` AND row_type = 2
	AND (execute_at, timer_uuid) <= (?, ?)`),
	}
}

func tableDDL(table string) string { return strings.TrimSpace(fmt.Sprintf(tableCQL, table)) }
