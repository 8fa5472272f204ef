package dynamodb

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Timer item attributes (besides pk, sk and pos).
const (
	attrUUID        = "u"
	attrExecuteAt   = "ex"
	attrDueAt       = "du"
	attrURL         = "url"
	attrPayload     = "pl"
	attrMaxAttempts = "rpa"
	attrMaxDuration = "rpd"
	attrInitial     = "rpi"
	attrMultiplier  = "rpm"
	attrMaxInterval = "rpx"
	attrTimeout     = "to"
	attrCreatedAt   = "cr"
	attrUpdatedAt   = "up"
	attrAttempts    = "at"
	attrStatus      = "st"
	attrLastError   = "le"
	// attrSize is the item's encoded size, so that a range delete can keep a
	// transaction under DynamoDB's 4 MB aggregate without reading payloads.
	attrSize = "sz"

	statusPending = "P"
	statusFailed  = "F"
	timerPrefix   = "t#"
)

// MaxItemBytes bounds a timer's encoded item: DynamoDB's item limit is
// 400 KB, and an item in a local secondary index counts twice against it
// (the table's copy and the index entry, which projects every attribute).
// The payload is most of a large item; see the driver docs.
const MaxItemBytes = 190 * 1024

// maxMS is one past the largest time a pos value encodes (16 digits): far
// beyond year 9999, the API's limit.
const maxMS = 1e16

// partitionKey names a shard partition. The shard number after the last '#'
// contains none, so the encoding is unambiguous whatever the namespace.
func partitionKey(k store.ShardKey) string {
	return k.Namespace + "#" + strconv.Itoa(k.Shard)
}

func timerSK(id string) string { return timerPrefix + id }

// ms is a time as stored: Unix milliseconds, truncated.
func ms(t time.Time) int64 { return t.UTC().Truncate(precision).UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

// encodePos is the pos value of (due ms, uuid): fixed width, so that byte
// order is Position order.
func encodePos(dueMS int64, u uuid.UUID) string {
	return fmt.Sprintf("%016d#%s", dueMS, hex.EncodeToString(u[:]))
}

// posOf returns a timer's pos value, or an error if its due time is outside
// what pos encodes (before 1970 or after year 318857).
func posOf(t *timer.Timer) (string, error) {
	d := ms(t.DueAt)
	if d < 0 || d >= maxMS {
		return "", fmt.Errorf("timer %q: due time %s out of the supported range (1970 to year 9999)", t.ID, t.DueAt)
	}
	return encodePos(d, t.UUID), nil
}

// firstPos is the smallest pos value of any timer.
var firstPos = encodePos(0, uuid.UUID{})

// posAfter returns the smallest pos value after position p (ok false if there
// is none).
func posAfter(p timer.Position) (string, bool) {
	d := ms(p.DueAt)
	if d < 0 {
		return firstPos, true
	}
	u := p.UUID
	for i := 15; i >= 0; i-- {
		u[i]++
		if u[i] != 0 {
			return clampedPos(d, u)
		}
	}
	return clampedPos(d+1, u) // the UUID wrapped to zero: the next millisecond
}

// posAtOrBefore returns the largest pos value at or before position p (ok
// false if there is none).
func posAtOrBefore(p timer.Position) (string, bool) {
	d := ms(p.DueAt)
	if d < 0 {
		return "", false
	}
	if d >= maxMS {
		return encodePos(maxMS-1, timer.MaxUUID), true
	}
	return encodePos(d, p.UUID), true
}

func clampedPos(d int64, u uuid.UUID) (string, bool) {
	if d >= maxMS {
		return "", false
	}
	return encodePos(d, u), true
}

func attrS(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

func attrN(v int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

// shardItemKey is the key of a shard's row.
func shardItemKey(k store.ShardKey) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrPK: attrS(partitionKey(k)), attrSK: attrS(skShard)}
}

func timerItemKey(k store.ShardKey, id string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrPK: attrS(partitionKey(k)), attrSK: attrS(timerSK(id))}
}

// encodedTimer is a timer's item and the pos it is filed under ("" when it is
// failed and so outside the index).
type encodedTimer struct {
	item map[string]types.AttributeValue
	pos  string
}

// encodeTimer builds the item of t, rejecting what DynamoDB would refuse.
func encodeTimer(t *timer.Timer) (encodedTimer, error) {
	item := map[string]types.AttributeValue{
		attrPK:          attrS(partitionKey(store.ShardKey{Namespace: t.Namespace, Shard: t.Shard})),
		attrSK:          attrS(timerSK(t.ID)),
		attrUUID:        &types.AttributeValueMemberB{Value: bytes.Clone(t.UUID[:])},
		attrExecuteAt:   attrN(ms(t.ExecuteAt)),
		attrDueAt:       attrN(ms(t.DueAt)),
		attrURL:         attrS(t.CallbackURL),
		attrMaxAttempts: attrN(int64(t.RetryPolicy.MaxAttempts)),
		attrMaxDuration: attrN(t.RetryPolicy.MaxAttemptsDuration.Milliseconds()),
		attrInitial:     attrN(t.RetryPolicy.InitialInterval.Milliseconds()),
		attrMultiplier:  &types.AttributeValueMemberN{Value: strconv.FormatFloat(t.RetryPolicy.BackoffMultiplier, 'f', -1, 64)},
		attrMaxInterval: attrN(t.RetryPolicy.MaxInterval.Milliseconds()),
		attrTimeout:     attrN(t.CallbackTimeout.Milliseconds()),
		attrCreatedAt:   attrN(ms(t.CreatedAt)),
		attrUpdatedAt:   attrN(ms(t.UpdatedAt)),
		attrAttempts:    attrN(int64(t.Attempts)),
	}
	// A nil payload and JSON null both mean none: no attribute.
	if p := strings.TrimSpace(string(t.Payload)); p != "" && p != "null" {
		item[attrPayload] = attrS(p)
	}
	if t.LastError != "" {
		item[attrLastError] = attrS(t.LastError)
	}
	var pos string
	if t.Status == timer.StatusFailed {
		item[attrStatus] = attrS(statusFailed)
	} else {
		var err error
		if pos, err = posOf(t); err != nil {
			return encodedTimer{}, err
		}
		item[attrStatus] = attrS(statusPending)
		item[attrPos] = attrS(pos)
	}
	size := itemSize(item) + len(attrSize) + 7
	if size > MaxItemBytes {
		return encodedTimer{}, fmt.Errorf("%w: timer %q encodes to %d bytes, more than %d (payload %d bytes)",
			store.ErrTimerTooLarge, t.ID, size, MaxItemBytes, len(t.Payload))
	}
	item[attrSize] = attrN(int64(size))
	return encodedTimer{item: item, pos: pos}, nil
}

// itemSize is an upper bound of DynamoDB's size of an item of scalar
// attributes: names plus values, a number counted as its decimal string.
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			n += len(v.Value)
		case *types.AttributeValueMemberN:
			n += len(v.Value)
		case *types.AttributeValueMemberB:
			n += len(v.Value)
		default:
			n += 16
		}
	}
	return n
}

// decodeTimer reads an item of shard k back into a timer.
func decodeTimer(k store.ShardKey, item map[string]types.AttributeValue) (*timer.Timer, error) {
	r := itemReader{item: item}
	sk := r.s(attrSK)
	t := &timer.Timer{
		Namespace:   k.Namespace,
		Shard:       k.Shard,
		ID:          strings.TrimPrefix(sk, timerPrefix),
		ExecuteAt:   fromMS(r.n(attrExecuteAt)),
		DueAt:       fromMS(r.n(attrDueAt)),
		CallbackURL: r.s(attrURL),
		RetryPolicy: timer.RetryPolicy{
			MaxAttempts:         int(r.n(attrMaxAttempts)),
			MaxAttemptsDuration: time.Duration(r.n(attrMaxDuration)) * time.Millisecond,
			InitialInterval:     time.Duration(r.n(attrInitial)) * time.Millisecond,
			BackoffMultiplier:   r.f(attrMultiplier),
			MaxInterval:         time.Duration(r.n(attrMaxInterval)) * time.Millisecond,
		},
		CallbackTimeout: time.Duration(r.n(attrTimeout)) * time.Millisecond,
		CreatedAt:       fromMS(r.n(attrCreatedAt)),
		UpdatedAt:       fromMS(r.n(attrUpdatedAt)),
		Attempts:        int(r.n(attrAttempts)),
		LastError:       r.s(attrLastError),
		Status:          timer.StatusPending,
	}
	if r.s(attrStatus) == statusFailed {
		t.Status = timer.StatusFailed
	}
	if p, ok := item[attrPayload].(*types.AttributeValueMemberS); ok {
		t.Payload = []byte(p.Value)
	}
	if b, ok := item[attrUUID].(*types.AttributeValueMemberB); ok && len(b.Value) == 16 {
		copy(t.UUID[:], b.Value)
	} else {
		r.fail(attrUUID)
	}
	if !strings.HasPrefix(sk, timerPrefix) {
		r.fail(attrSK)
	}
	if r.err != nil {
		return nil, fmt.Errorf("decode timer item %q: %w", sk, r.err)
	}
	return t, nil
}

// itemReader reads scalar attributes, remembering the first that is missing
// or malformed. Optional string attributes read as "".
type itemReader struct {
	item map[string]types.AttributeValue
	err  error
}

func (r *itemReader) fail(name string) {
	if r.err == nil {
		r.err = fmt.Errorf("attribute %q missing or malformed", name)
	}
}

func (r *itemReader) s(name string) string {
	if v, ok := r.item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func (r *itemReader) n(name string) int64 {
	v, ok := r.item[name].(*types.AttributeValueMemberN)
	if !ok {
		r.fail(name)
		return 0
	}
	i, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		r.fail(name)
	}
	return i
}

func (r *itemReader) f(name string) float64 {
	v, ok := r.item[name].(*types.AttributeValueMemberN)
	if !ok {
		r.fail(name)
		return 0
	}
	f, err := strconv.ParseFloat(v.Value, 64)
	if err != nil {
		r.fail(name)
	}
	return f
}

// shardRow is the decoded shard row.
type shardRow struct {
	version int64
	owner   string
	claimed time.Time
	intent  *intent
}

// intent is a range delete in progress (see the package doc).
type intent struct {
	upTo  string // pos bound, inclusive
	token string
}

// decodeShard reads a shard row; a nil item is a missing row (nil, nil).
func decodeShard(item map[string]types.AttributeValue) (*shardRow, error) {
	if len(item) == 0 {
		return nil, nil
	}
	r := itemReader{item: item}
	row := &shardRow{
		version: r.n(attrVersion),
		owner:   r.s(attrOwner),
		claimed: fromMS(r.n(attrClaimed)),
	}
	if tok := r.s(attrIntentToken); tok != "" {
		row.intent = &intent{upTo: r.s(attrIntentUpTo), token: tok}
	}
	if r.err != nil {
		return nil, fmt.Errorf("decode shard row: %w", r.err)
	}
	return row, nil
}
