package dynamodb_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/dynamodb"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// endpointEnv names the server the tests run against;
// scripts/testdb/dynamodb.sh starts DynamoDB Local and prints its endpoint.
const endpointEnv = "DTIMER_TEST_DYNAMODB_ENDPOINT"

// DynamoDB Local accepts any credentials and region.
const (
	region = "us-east-1"
	key    = "dtimer"
	secret = "dtimer-test-secret"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDriver(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, newTable(t))
	})
}

// TestMigrateConcurrently migrates one new table from several stores at once,
// as nodes starting together do.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	storetest.MigrateConcurrently(t, func() store.Store { return open(t, table) })
}

// TestMigrateRejectsForeignTable refuses a table without the pos index: it
// cannot be added later, and without it windows would be scans.
func TestMigrateRejectsForeignTable(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	_, err := client(t).CreateTable(t.Context(), &awsddb.CreateTableInput{
		TableName: &table,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String("pk"), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String("sk"), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String("pk"), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String("sk"), KeyType: types.KeyTypeRange},
		},
		BillingMode: types.BillingModePayPerRequest,
	})
	require.NoError(t, err)
	err = open(t, table).Migrate(t.Context())
	require.ErrorContains(t, err, "without the local secondary index")
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]dynamodb.Config{
		"no table":           {Region: region},
		"short table":        {Region: region, Table: "ab"},
		"bad table":          {Region: region, Table: "has space"},
		"key without secret": {Region: region, Table: "dtimer", AccessKeyID: key},
		"secret without key": {Region: region, Table: "dtimer", SecretAccessKey: secret},
		"bad endpoint":       {Region: region, Table: "dtimer", Endpoint: "127.0.0.1:8000"},
		"creds in endpoint":  {Region: region, Table: "dtimer", Endpoint: "http://u:" + secret + "@127.0.0.1:1"},
		"bad billing":        {Region: region, Table: "dtimer", BillingMode: "free"},
		"no capacity":        {Region: region, Table: "dtimer", BillingMode: dynamodb.BillingProvisioned},
		"capacity on demand": {Region: region, Table: "dtimer", ReadCapacity: 5},
		"negative conns":     {Region: region, Table: "dtimer", MaxConns: -1},
	} {
		_, err := dynamodb.New(t.Context(), cfg)
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), secret, name)
	}

	// A server that does not answer.
	_, err := dynamodb.New(t.Context(), dynamodb.Config{
		Region: region, Table: "dtimer", Endpoint: "http://127.0.0.1:1", AccessKeyID: key, SecretAccessKey: secret,
	})
	require.ErrorContains(t, err, "connect")
	require.NotContains(t, err.Error(), secret)
}

// TestClaimAppliedTwice: a claim whose conditional write finds the very row
// it writes is the SDK's retry of that claim after the server applied it and
// the answer was lost. It succeeded, so it must not report a conflict (the
// node would leave a shard it holds unserved); any other row is a conflict.
func TestClaimAppliedTwice(t *testing.T) {
	t.Parallel()
	s := newStore(t, newTable(t))
	for _, prev := range []int64{0, 1} {
		p := store.ShardClaimParams{Shard: shardA, Owner: "node-a", PrevVersion: prev, Now: base.Add(time.Duration(prev) * time.Hour)}
		first, err := s.ShardClaim(t.Context(), p)
		require.NoError(t, err)
		again, err := s.ShardClaim(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, first, again)

		other, later := p, p
		other.Owner = "node-b"
		later.Now = p.Now.Add(time.Millisecond)
		for _, q := range []store.ShardClaimParams{other, later} {
			_, err = s.ShardClaim(t.Context(), q)
			require.ErrorIs(t, err, store.ErrShardVersionConflict)
		}
	}
}

var (
	shardA = store.ShardKey{Namespace: "ns-a", Shard: 1}
	shardB = store.ShardKey{Namespace: "ns-a", Shard: 2}
	base   = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
)

func newTimer(k store.ShardKey, id string, due time.Time) *timer.Timer {
	return &timer.Timer{
		Namespace: k.Namespace, ID: id, Shard: k.Shard, UUID: timer.UUIDOf(k.Namespace, id),
		ExecuteAt: due, DueAt: due, CallbackURL: "http://127.0.0.1:1/cb",
		Payload:         json.RawMessage(`{"id":"` + id + `"}`),
		RetryPolicy:     timer.RetryPolicy{MaxAttempts: 1, InitialInterval: time.Second, BackoffMultiplier: 1, MaxInterval: time.Second},
		CallbackTimeout: time.Second, CreatedAt: base, UpdatedAt: base, Status: timer.StatusPending,
	}
}

type bundle struct {
	ctx   context.Context
	s     *dynamodb.Store
	fence store.Fence
}

// setup returns a store whose shardA is claimed at version 1.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{ctx: t.Context(), s: newStore(t, newTable(t))}
	_, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: shardA, Owner: "node-a", Now: base})
	require.NoError(t, err)
	b.fence = store.Fence{Shard: shardA, Version: 1}
	return b
}

func (b *bundle) create(t *testing.T, ts ...*timer.Timer) {
	t.Helper()
	for _, tm := range ts {
		require.NoError(t, b.s.TimerCreate(b.ctx, b.fence, tm))
	}
}

func (b *bundle) windowIDs(t *testing.T, k store.ShardKey) []string {
	t.Helper()
	ts, err := b.s.TimerGetWindow(b.ctx, store.TimerGetWindowParams{Shard: k, DueUntil: base.Add(24 * time.Hour), Limit: 1000})
	require.NoError(t, err)
	ids := []string{}
	for _, tm := range ts {
		ids = append(ids, tm.ID)
	}
	return ids
}

func (b *bundle) requireGone(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		_, err := b.s.TimerGet(b.ctx, shardA, id)
		require.ErrorIs(t, err, store.ErrTimerNotFound, id)
	}
}

// TestWindowIsKeyRange shows that the hot-path reads touch only the items
// they return: a window read and the range delete's key reads are Queries of
// the pos index whose scanned count equals their result count (no filter),
// however many failed timers, later timers and other shards' timers there are.
func TestWindowIsKeyRange(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fb, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: shardB, Owner: "node-a", Now: base})
	require.NoError(t, err)
	for i := range 40 {
		due := base.Add(time.Duration(i) * time.Second)
		b.create(t, newTimer(shardA, fmt.Sprintf("p%02d", i), due), newTimer(shardA, fmt.Sprintf("f%02d", i), due))
		require.NoError(t, b.s.TimerCreate(b.ctx, store.Fence{Shard: shardB, Version: fb.Version}, newTimer(shardB, fmt.Sprintf("b%02d", i), due)))
		failed := newTimer(shardA, fmt.Sprintf("f%02d", i), due)
		failed.Status = timer.StatusFailed
		require.NoError(t, b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: failed}))
	}
	log := b.s.LogQueries()

	p10 := newTimer(shardA, "p10", base.Add(10*time.Second)).Position()
	ts, err := b.s.TimerGetWindow(b.ctx, store.TimerGetWindowParams{Shard: shardA, After: p10, DueUntil: base.Add(20 * time.Second), Limit: 5})
	require.NoError(t, err)
	require.Len(t, ts, 5)
	require.Equal(t, "p11", ts[0].ID)
	qs := log.Take()
	require.Len(t, qs, 1)
	require.Equal(t, dynamodb.LoggedQuery{Index: "pos", KeyCondition: qs[0].KeyCondition, Limit: 5, Count: 5, Scanned: 5}, qs[0])
	require.Contains(t, qs[0].KeyCondition, "BETWEEN")

	n, err := b.s.TimerDeleteRange(b.ctx, b.fence, store.TimerDeleteRangeParams{UpTo: p10})
	require.NoError(t, err)
	require.Equal(t, 11, n)
	for _, q := range log.Take() {
		require.Equal(t, "pos", q.Index)
		require.Empty(t, q.Filter)
		require.Equal(t, q.Count, q.Scanned)
		require.LessOrEqual(t, q.Count, int32(11))
	}
}

// TestRangeDeleteInterrupted covers a range delete whose node stopped right
// after its commit point: whoever comes next finishes it, and nothing written
// after the commit point is lost.
func TestRangeDeleteInterrupted(t *testing.T) {
	t.Parallel()
	fixture := func(t *testing.T) (*bundle, timer.Position) {
		b := setup(t)
		for i := range 5 {
			b.create(t, newTimer(shardA, fmt.Sprintf("a%d", i), base.Add(time.Duration(i)*time.Second)))
		}
		upTo := newTimer(shardA, "a2", base.Add(2*time.Second)).Position()
		require.NoError(t, b.s.StartRangeDelete(b.ctx, b.fence, upTo))
		return b, upTo
	}

	t.Run("CreateIntoRange", func(t *testing.T) {
		t.Parallel()
		b, _ := fixture(t)
		b.create(t, newTimer(shardA, "late", base))
		require.Equal(t, []string{"late", "a3", "a4"}, b.windowIDs(t, shardA))
		b.requireGone(t, "a0", "a1", "a2")
	})

	t.Run("CreateAfterRange", func(t *testing.T) {
		t.Parallel()
		b, _ := fixture(t)
		b.create(t, newTimer(shardA, "later", base.Add(time.Hour)))
		// Nothing needed finishing the delete yet: a read may see it undone.
		require.Equal(t, []string{"a0", "a1", "a2", "a3", "a4", "later"}, b.windowIDs(t, shardA))
	})

	t.Run("UpdateIntoRange", func(t *testing.T) {
		t.Parallel()
		b, _ := fixture(t)
		moved := newTimer(shardA, "a4", base.Add(-time.Second))
		require.NoError(t, b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: moved}))
		require.Equal(t, []string{"a4", "a3"}, b.windowIDs(t, shardA))
	})

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		b, _ := fixture(t)
		sh, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: shardA, Owner: "node-b", PrevVersion: 1, Now: base})
		require.NoError(t, err)
		require.Equal(t, int64(2), sh.Version)
		require.Equal(t, []string{"a3", "a4"}, b.windowIDs(t, shardA))
		// The old owner is fenced out as usual.
		err = b.s.TimerCreate(b.ctx, b.fence, newTimer(shardA, "stale", base))
		require.ErrorIs(t, err, store.ErrShardOwnershipLost)
	})

	t.Run("NextRangeDelete", func(t *testing.T) {
		t.Parallel()
		b, _ := fixture(t)
		n, err := b.s.TimerDeleteRange(b.ctx, b.fence, store.TimerDeleteRangeParams{
			UpTo: newTimer(shardA, "a3", base.Add(3*time.Second)).Position(),
		})
		require.NoError(t, err)
		require.Equal(t, 1, n, "its own count: a3; the earlier delete removed a0 to a2")
		require.Equal(t, []string{"a4"}, b.windowIDs(t, shardA))
	})

	t.Run("ReleaseThenClaim", func(t *testing.T) {
		t.Parallel()
		b, _ := fixture(t)
		require.NoError(t, b.s.ShardRelease(b.ctx, b.fence))
		_, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: shardA, Owner: "node-b", PrevVersion: 1, Now: base})
		require.NoError(t, err)
		require.Equal(t, []string{"a3", "a4"}, b.windowIDs(t, shardA))
	})
}

// TestTimerTooLarge: a timer must fit one item; the largest that does round
// trips, a larger one is refused with ErrTimerTooLarge and writes nothing.
func TestTimerTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	payload := func(n int) json.RawMessage { return json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`) }

	big := newTimer(shardA, "big", base)
	big.Payload = payload(dynamodb.MaxItemBytes - 400)
	b.create(t, big)
	got, err := b.s.TimerGet(b.ctx, shardA, "big")
	require.NoError(t, err)
	require.Equal(t, string(big.Payload), string(got.Payload))

	huge := newTimer(shardA, "huge", base)
	huge.Payload = payload(dynamodb.MaxItemBytes)
	err = b.s.TimerCreate(b.ctx, b.fence, huge)
	require.ErrorIs(t, err, store.ErrTimerTooLarge)
	b.requireGone(t, "huge")

	// Deleting many large timers splits transactions by size as well as count.
	for i := range 30 {
		tm := newTimer(shardA, fmt.Sprintf("big-%d", i), base.Add(time.Second))
		tm.Payload = big.Payload
		b.create(t, tm)
	}
	n, err := b.s.TimerDeleteRange(b.ctx, b.fence, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: base.Add(time.Hour), UUID: timer.MaxUUID}})
	require.NoError(t, err)
	require.Equal(t, 31, n)
}

// newTable returns a fresh table name; the table is deleted when the test
// ends, after the stores using it are closed.
func newTable(t *testing.T) string {
	t.Helper()
	storetest.EnvOrSkip(t, endpointEnv)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	table := "t_" + hex.EncodeToString(b)
	c := client(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.DeleteTable(ctx, &awsddb.DeleteTableInput{TableName: &table})
		var nf *types.ResourceNotFoundException
		if err != nil && !errors.As(err, &nf) {
			t.Errorf("delete table %s: %v", table, err)
		}
	})
	return table
}

// open returns a store on table, closed when the test ends.
func open(t *testing.T, table string) *dynamodb.Store {
	t.Helper()
	s, err := dynamodb.New(t.Context(), dynamodb.Config{
		Region: region, Endpoint: storetest.EnvOrSkip(t, endpointEnv), Table: table,
		AccessKeyID: key, SecretAccessKey: secret, MaxConns: 16,
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// newStore returns a migrated store on table.
func newStore(t *testing.T, table string) *dynamodb.Store {
	t.Helper()
	s := open(t, table)
	require.NoError(t, s.Migrate(t.Context()))
	return s
}

// client is a plain SDK client for what the tests do behind the driver's
// back.
func client(t *testing.T) *awsddb.Client {
	t.Helper()
	endpoint := storetest.EnvOrSkip(t, endpointEnv)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return awsddb.New(awsddb.Options{
		Region:       region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(key, secret, ""),
		HTTPClient:   &http.Client{Transport: tr},
	})
}
