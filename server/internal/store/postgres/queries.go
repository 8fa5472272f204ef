package postgres

import (
	"fmt"
	"strings"
)

// queries are the driver's statements, with the schema-qualified table name
// filled in once.
type queries struct {
	table string

	shardGet, shardInsert, shardClaim, shardRelease string

	timerCreate, timerCreateBatch, timerUpdate, timerUpdateIfDueAt, timerGet, timerDelete string
	timerGetWindow, timerDeleteRange                                                      string
}

// timerColumns are the columns scanTimer reads, in its order.
const timerColumns = `namespace, shard_id, ` + timerColumnsAfterShard

// shardRowKey picks the shard row of (namespace, shard_id): its whole primary
// key, and its NULL timer_id. Either index then leads to that one row, so the
// plan is cheap whichever the planner takes. It matters for generic plans
// (pgx prepares every statement), which a connection may cache while the table
// is still empty and unanalysed: on row_type = 1 alone such a plan took the
// (namespace, shard_id, timer_id) index and filtered the whole partition, and
// every fenced write cost O(timers in the shard) until the next ANALYZE.
const shardRowKey = `row_type = 1 AND execute_at = '1970-01-01 00:00:00+00'
	AND timer_uuid = '00000000-0000-0000-0000-000000000000' AND timer_id IS NULL`

// fenceCTE is the first step of every fenced write: $1 namespace, $2 shard,
// $3 the fence's version. It yields one row if the shard row still has that
// version, and holds a FOR SHARE lock on it until commit, which a claim's
// UPDATE has to wait for. The write step reads from it (FROM s, or EXISTS
// (SELECT 1 FROM s)), so it writes nothing when the fence is stale.
const fenceCTE = `s AS (
	SELECT 1 FROM %[1]s
	WHERE namespace = $1 AND shard_id = $2 AND ` + shardRowKey + ` AND shard_version = $3
	FOR SHARE
)`

// fencedResult answers (rows the fence step locked, rows the write step
// changed); see fenceResult.
const fencedResult = `SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM w)`

// timerValues are $4..$16 of a timer write (see timerRow), cast because
// parameters in a SELECT list get no type from their target columns.
const timerValues = `$4::smallint, $5::timestamptz, $6::uuid, $7::text, $8::timestamptz,
	$9::text, $10::text, $11::text, $12::bigint, $13::timestamptz, $14::timestamptz, $15::integer, $16::text`

// timerArrays are $7..$19 of timerCreateBatch: the columns of timerValues,
// one array each, an element per row.
const timerArrays = `$7::smallint[], $8::timestamptz[], $9::uuid[], $10::text[], $11::timestamptz[],
	$12::text[], $13::text[], $14::text[], $15::bigint[], $16::timestamptz[], $17::timestamptz[], $18::integer[], $19::text[]`

// timerColumnsAfterShard are timerColumns without namespace and shard_id.
const timerColumnsAfterShard = `row_type, execute_at, timer_uuid, timer_id, timer_execute_at,
	timer_callback_url, timer_payload, timer_retry_policy, timer_callback_timeout_ms,
	timer_created_at, timer_updated_at, timer_attempts, timer_last_error`

// timerUpsert makes an insert of a timer whose id exists replace it.
const timerUpsert = `ON CONFLICT (namespace, shard_id, timer_id) DO UPDATE SET
		row_type = excluded.row_type, execute_at = excluded.execute_at, timer_uuid = excluded.timer_uuid,
		timer_execute_at = excluded.timer_execute_at, timer_callback_url = excluded.timer_callback_url,
		timer_payload = excluded.timer_payload, timer_retry_policy = excluded.timer_retry_policy,
		timer_callback_timeout_ms = excluded.timer_callback_timeout_ms,
		timer_created_at = excluded.timer_created_at, timer_updated_at = excluded.timer_updated_at,
		timer_attempts = excluded.timer_attempts, timer_last_error = excluded.timer_last_error`

const timerSet = `row_type = $4::smallint, execute_at = $5::timestamptz, timer_uuid = $6::uuid,
	timer_execute_at = $8::timestamptz, timer_callback_url = $9::text, timer_payload = $10::text,
	timer_retry_policy = $11::text, timer_callback_timeout_ms = $12::bigint,
	timer_created_at = $13::timestamptz, timer_updated_at = $14::timestamptz,
	timer_attempts = $15::integer, timer_last_error = $16::text`

func newQueries(table string) queries {
	f := func(q string) string { return strings.TrimSpace(fmt.Sprintf(q, table)) }
	return queries{
		table: table,

		shardGet: f(`
SELECT shard_version, coalesce(shard_owner, ''), shard_claimed_at FROM %[1]s
WHERE namespace = $1 AND shard_id = $2 AND ` + shardRowKey),

		// A first claim creates the shard row; a concurrent first claim finds
		// it in the primary key and returns no row: a lost race.
		shardInsert: f(`
INSERT INTO %[1]s (namespace, shard_id, row_type, execute_at, timer_uuid, shard_version, shard_owner, shard_claimed_at)
VALUES ($1, $2, 1, '1970-01-01 00:00:00+00', '00000000-0000-0000-0000-000000000000', 1, $3, $4)
ON CONFLICT DO NOTHING
RETURNING shard_version, shard_owner, shard_claimed_at`),

		// Under READ COMMITTED a concurrent claim waits for this row and then
		// rechecks shard_version against the committed one: one claim wins.
		shardClaim: f(`
UPDATE %[1]s SET shard_version = shard_version + 1, shard_owner = $3, shard_claimed_at = $4
WHERE namespace = $1 AND shard_id = $2 AND ` + shardRowKey + ` AND shard_version = $5
RETURNING shard_version, shard_owner, shard_claimed_at`),

		shardRelease: f(`
UPDATE %[1]s SET shard_owner = ''
WHERE namespace = $1 AND shard_id = $2 AND ` + shardRowKey + ` AND shard_version = $3`),

		// The upsert moves an existing row by rewriting its key columns.
		timerCreate: f(`
WITH ` + fenceCTE + `, w AS (
	INSERT INTO %[1]s (` + timerColumns + `)
	SELECT $1, $2, ` + timerValues + ` FROM s
	` + timerUpsert + `
	RETURNING 1
) ` + fencedResult),

		// The creates of a batch (see batch.go), of any shards: $1..$3 the
		// batch's fences (namespace, shard, version), one element each;
		// $4..$6 the fence of each row, and $7..$19 its columns. The fence
		// step is fenceCTE's for each fence; a row is written only if its
		// fence's shard row was found and locked. The answer is the fences
		// that held.
		timerCreateBatch: f(`
WITH s AS MATERIALIZED (
	SELECT t.namespace, t.shard_id, t.shard_version
	FROM unnest($1::text[], $2::integer[], $3::bigint[]) AS f (namespace, shard_id, version),
	LATERAL (
		SELECT namespace, shard_id, shard_version FROM %[1]s
		WHERE namespace = f.namespace AND shard_id = f.shard_id AND ` + shardRowKey + `
			AND shard_version = f.version
		FOR SHARE
	) AS t
), w AS (
	INSERT INTO %[1]s (` + timerColumns + `)
	SELECT r.namespace, r.shard_id, r.row_type, r.execute_at, r.timer_uuid, r.timer_id, r.timer_execute_at,
		r.timer_callback_url, r.timer_payload, r.timer_retry_policy, r.timer_callback_timeout_ms,
		r.timer_created_at, r.timer_updated_at, r.timer_attempts, r.timer_last_error
	FROM unnest($4::text[], $5::integer[], $6::bigint[], ` + timerArrays + `) AS r (
		namespace, shard_id, version, ` + timerColumnsAfterShard + `)
	JOIN s ON s.namespace = r.namespace AND s.shard_id = r.shard_id AND s.shard_version = r.version
	` + timerUpsert + `
	RETURNING 1
)
SELECT namespace, shard_id, shard_version FROM s`),

		timerUpdate: f(`
WITH ` + fenceCTE + `, w AS (
	UPDATE %[1]s SET ` + timerSet + `
	WHERE namespace = $1 AND shard_id = $2 AND timer_id = $7::text AND EXISTS (SELECT 1 FROM s)
	RETURNING 1
) ` + fencedResult),

		// $17: the due time the stored timer must still be pending at. Under
		// READ COMMITTED a concurrent change of the row is waited for and the
		// condition rechecked on the committed version.
		timerUpdateIfDueAt: f(`
WITH ` + fenceCTE + `, w AS (
	UPDATE %[1]s SET ` + timerSet + `
	WHERE namespace = $1 AND shard_id = $2 AND timer_id = $7::text
		AND row_type = 2 AND execute_at = $17::timestamptz AND EXISTS (SELECT 1 FROM s)
	RETURNING 1
) ` + fencedResult),

		timerGet: f(`
SELECT ` + timerColumns + ` FROM %[1]s
WHERE namespace = $1 AND shard_id = $2 AND timer_id = $3`),

		timerDelete: f(`
WITH ` + fenceCTE + `, w AS (
	DELETE FROM %[1]s
	WHERE namespace = $1 AND shard_id = $2 AND timer_id = $4::text AND EXISTS (SELECT 1 FROM s)
	RETURNING 1
) ` + fencedResult),

		// Row comparisons on (execute_at, timer_uuid) make both bounds of a
		// primary key range scan; uuid compares bytewise, as timer.Position.
		timerGetWindow: f(`
SELECT ` + timerColumns + ` FROM %[1]s
WHERE namespace = $1 AND shard_id = $2 AND row_type = 2
	AND (execute_at, timer_uuid) > ($3::timestamptz, $4::uuid)
	AND execute_at <= $5::timestamptz
ORDER BY execute_at, timer_uuid
LIMIT $6`),

		timerDeleteRange: f(`
WITH ` + fenceCTE + `, w AS (
	DELETE FROM %[1]s
	WHERE namespace = $1 AND shard_id = $2 AND row_type = 2
		AND (execute_at, timer_uuid) <= ($4::timestamptz, $5::uuid)
		AND EXISTS (SELECT 1 FROM s)
	RETURNING 1
) ` + fencedResult),
	}
}
