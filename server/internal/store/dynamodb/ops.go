package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// maxAttempts bounds the retries of an operation that lost a race it can
// retry safely: a transaction conflict, or an intent it had to finish first.
const maxAttempts = 50

// errRetriesExhausted is returned when maxAttempts did not suffice; nothing
// was written by the failed attempts.
var errRetriesExhausted = errors.New("gave up after repeated transaction conflicts")

// ShardGet implements store.Store.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	row, err := s.shardRow(ctx, key)
	if err != nil {
		return nil, translate("shard get", err)
	}
	if row == nil {
		return nil, fmt.Errorf("dynamodb: shard get: %w", store.ErrShardNotFound)
	}
	return row.shard(key), nil
}

// isClaimBy tells whether the row is what claim p writes. A claim's
// conditional write that fails on such a row is the SDK's retry of that very
// claim after it was applied and its answer lost: it succeeded.
func (r *shardRow) isClaimBy(p store.ShardClaimParams) bool {
	return r != nil && r.version == p.PrevVersion+1 && r.owner == p.Owner && r.claimed.Equal(fromMS(ms(p.Now)))
}

func (r *shardRow) shard(key store.ShardKey) *store.Shard {
	return &store.Shard{Key: key, Version: r.version, Owner: r.owner, ClaimedAt: r.claimed}
}

func (s *Store) shardRow(ctx context.Context, key store.ShardKey) (*shardRow, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &s.table,
		Key:            shardItemKey(key),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, err
	}
	return decodeShard(out.Item)
}

// ShardClaim implements store.Store. A claim of a shard with a range delete
// in progress finishes that delete first (see the package doc).
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	if p.PrevVersion < 0 {
		return nil, fmt.Errorf("dynamodb: shard claim: %w: negative previous version %d", store.ErrShardVersionConflict, p.PrevVersion)
	}
	if p.PrevVersion == 0 {
		return s.shardCreate(ctx, p)
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:           &s.table,
			Key:                 shardItemKey(p.Shard),
			ConditionExpression: aws.String("#v = :prev AND attribute_not_exists(#rt)"),
			UpdateExpression:    aws.String("SET #v = :next, #o = :owner, #ca = :now"),
			ExpressionAttributeNames: map[string]string{
				"#v": attrVersion, "#o": attrOwner, "#ca": attrClaimed, "#rt": attrIntentToken,
			},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":prev":  attrN(p.PrevVersion),
				":next":  attrN(p.PrevVersion + 1),
				":owner": attrS(p.Owner),
				":now":   attrN(ms(p.Now)),
			},
			ReturnValues:                        types.ReturnValueAllNew,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		if err == nil {
			row, err := decodeShard(out.Attributes)
			if err != nil {
				return nil, translate("shard claim", err)
			}
			return row.shard(p.Shard), nil
		}
		var ccf *types.ConditionalCheckFailedException
		switch {
		case errors.As(err, &ccf):
			row, derr := decodeShard(ccf.Item)
			if derr != nil {
				return nil, translate("shard claim", derr)
			}
			if row.isClaimBy(p) {
				return row.shard(p.Shard), nil
			}
			if row == nil || row.version != p.PrevVersion {
				return nil, fmt.Errorf("dynamodb: shard claim: %w", store.ErrShardVersionConflict)
			}
			if row.intent == nil {
				continue // the intent was removed since: claim again
			}
			if err := s.finishIntent(ctx, p.Shard, *row.intent); err != nil {
				return nil, translate("shard claim: finish range delete", err)
			}
		case isConflict(err):
			if err := pause(ctx, attempt); err != nil {
				return nil, translate("shard claim", err)
			}
		default:
			return nil, translate("shard claim", err)
		}
	}
	return nil, translate("shard claim", errRetriesExhausted)
}

// shardCreate writes the first shard row.
func (s *Store) shardCreate(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	item := shardItemKey(p.Shard)
	item[attrVersion] = attrN(1)
	item[attrOwner] = attrS(p.Owner)
	item[attrClaimed] = attrN(ms(p.Now))
	for attempt := 0; ; attempt++ {
		_, err := s.db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:                           &s.table,
			Item:                                item,
			ConditionExpression:                 aws.String("attribute_not_exists(#sk)"),
			ExpressionAttributeNames:            map[string]string{"#sk": attrSK},
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return &store.Shard{Key: p.Shard, Version: 1, Owner: p.Owner, ClaimedAt: fromMS(ms(p.Now))}, nil
		case errors.As(err, &ccf):
			row, derr := decodeShard(ccf.Item)
			if derr != nil {
				return nil, translate("shard claim", derr)
			}
			if row.isClaimBy(p) {
				return row.shard(p.Shard), nil
			}
			return nil, fmt.Errorf("dynamodb: shard claim: %w", store.ErrShardVersionConflict)
		case isConflict(err) && attempt < maxAttempts:
			if err := pause(ctx, attempt); err != nil {
				return nil, translate("shard claim", err)
			}
		default:
			return nil, translate("shard claim", err)
		}
	}
}

// ShardRelease implements store.Store. An intent stays: the next claim
// finishes it.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	for attempt := 0; ; attempt++ {
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &s.table,
			Key:                       shardItemKey(f.Shard),
			ConditionExpression:       aws.String("#v = :v"),
			UpdateExpression:          aws.String("REMOVE #o"),
			ExpressionAttributeNames:  map[string]string{"#v": attrVersion, "#o": attrOwner},
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": attrN(f.Version)},
		})
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			return nil
		case errors.As(err, &ccf):
			return fmt.Errorf("dynamodb: shard release: %w", store.ErrShardOwnershipLost)
		case isConflict(err) && attempt < maxAttempts:
			if err := pause(ctx, attempt); err != nil {
				return translate("shard release", err)
			}
		default:
			return translate("shard release", err)
		}
	}
}

// TimerCreate implements store.Store: a Put of the timer's one item, which
// replaces the timer with the same id wherever it was.
func (s *Store) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	if err := f.Covers(t); err != nil {
		return fmt.Errorf("dynamodb: timer create: %w", err)
	}
	enc, err := encodeTimer(t)
	if err != nil {
		return fmt.Errorf("dynamodb: timer create: %w", err)
	}
	put := &types.Put{TableName: &s.table, Item: enc.item}
	return s.fencedWrite(ctx, "timer create", f, enc.pos, types.TransactWriteItem{Put: put}, nil)
}

// TimerUpdate implements store.Store.
func (s *Store) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	if p.Timer == nil {
		return errors.New("dynamodb: timer update: timer is nil")
	}
	if err := f.Covers(p.Timer); err != nil {
		return fmt.Errorf("dynamodb: timer update: %w", err)
	}
	enc, err := encodeTimer(p.Timer)
	if err != nil {
		return fmt.Errorf("dynamodb: timer update: %w", err)
	}
	put := &types.Put{
		TableName:                &s.table,
		Item:                     enc.item,
		ConditionExpression:      aws.String("attribute_exists(#sk)"),
		ExpressionAttributeNames: map[string]string{"#sk": attrSK},
	}
	if p.IfDueAt != nil {
		put.ConditionExpression = aws.String("attribute_exists(#sk) AND #st = :pending AND #du = :due")
		put.ExpressionAttributeNames["#st"] = attrStatus
		put.ExpressionAttributeNames["#du"] = attrDueAt
		put.ExpressionAttributeValues = map[string]types.AttributeValue{
			":pending": attrS(statusPending),
			":due":     attrN(ms(*p.IfDueAt)),
		}
	}
	return s.fencedWrite(ctx, "timer update", f, enc.pos, types.TransactWriteItem{Put: put}, store.ErrTimerNotFound)
}

// TimerDelete implements store.Store.
func (s *Store) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	del := &types.Delete{
		TableName:                &s.table,
		Key:                      timerItemKey(f.Shard, id),
		ConditionExpression:      aws.String("attribute_exists(#sk)"),
		ExpressionAttributeNames: map[string]string{"#sk": attrSK},
	}
	return s.fencedWrite(ctx, "timer delete", f, "", types.TransactWriteItem{Delete: del}, store.ErrTimerNotFound)
}

// fencedWrite commits write together with a check of the fence on the shard
// row. pos is the position the write files a pending timer at ("" for none):
// if a range delete in progress covers it, the write finishes that delete and
// retries, so the delete does not swallow it. missing is the error for a
// failed condition of write itself.
func (s *Store) fencedWrite(ctx context.Context, op string, f store.Fence, pos string, write types.TransactWriteItem, missing error) error {
	check := &types.ConditionCheck{
		TableName:                           &s.table,
		Key:                                 shardItemKey(f.Shard),
		ConditionExpression:                 aws.String("#v = :v"),
		ExpressionAttributeNames:            map[string]string{"#v": attrVersion},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":v": attrN(f.Version)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	if pos != "" {
		check.ConditionExpression = aws.String("#v = :v AND (attribute_not_exists(#rd) OR #rd < :pos)")
		check.ExpressionAttributeNames["#rd"] = attrIntentUpTo
		check.ExpressionAttributeValues[":pos"] = attrS(pos)
	}
	items := []types.TransactWriteItem{{ConditionCheck: check}, write}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		reasons, err := s.transact(ctx, items)
		if err != nil {
			return translate(op, err)
		}
		if reasons == nil {
			return nil
		}
		// Ownership first: with a stale fence, "not found" must not show.
		if failed(reasons, 0) {
			row, err := decodeShard(reasons[0].Item)
			if err != nil {
				return translate(op, err)
			}
			if row == nil || row.version != f.Version {
				return fmt.Errorf("dynamodb: %s: %w", op, store.ErrShardOwnershipLost)
			}
			if row.intent != nil {
				if err := s.finishIntent(ctx, f.Shard, *row.intent); err != nil {
					return translate(op+": finish range delete", err)
				}
			}
			continue
		}
		if failed(reasons, 1) && missing != nil {
			return fmt.Errorf("dynamodb: %s: %w", op, missing)
		}
		return fmt.Errorf("dynamodb: %s: transaction cancelled: %s", op, describeReasons(reasons))
	}
	return translate(op, errRetriesExhausted)
}

// TimerGet implements store.Store.
func (s *Store) TimerGet(ctx context.Context, key store.ShardKey, id string) (*timer.Timer, error) {
	out, err := s.db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      &s.table,
		Key:            timerItemKey(key, id),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return nil, translate("timer get", err)
	}
	if len(out.Item) == 0 {
		return nil, fmt.Errorf("dynamodb: timer get: %w", store.ErrTimerNotFound)
	}
	t, err := decodeTimer(key, out.Item)
	if err != nil {
		return nil, translate("timer get", err)
	}
	return t, nil
}

// TimerGetWindow implements store.Store: a strongly consistent Query of the
// pos index between two key bounds, without a filter, paged until the limit
// is met or the range is exhausted.
func (s *Store) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	lo, ok := posAfter(p.After)
	if !ok {
		return nil, nil
	}
	hi, ok := posAtOrBefore(timer.Position{DueAt: p.DueUntil, UUID: timer.MaxUUID})
	if !ok || lo > hi {
		return nil, nil
	}
	out := []*timer.Timer{}
	err := s.queryPos(ctx, p.Shard, lo, hi, p.Limit, nil, func(items []map[string]types.AttributeValue) error {
		for _, item := range items {
			t, err := decodeTimer(p.Shard, item)
			if err != nil {
				return err
			}
			out = append(out, t)
		}
		return nil
	})
	if err != nil {
		return nil, translate("timer get window", err)
	}
	return out, nil
}

// queryPos reads the pos index of shard k from lo to hi (inclusive), at most
// limit items (0: all), handing each page to fn. projection, if set, names
// the attributes to read.
func (s *Store) queryPos(ctx context.Context, k store.ShardKey, lo, hi string, limit int, projection []string,
	fn func([]map[string]types.AttributeValue) error,
) error {
	in := &dynamodb.QueryInput{
		TableName:                &s.table,
		IndexName:                aws.String(posIndex),
		ConsistentRead:           aws.Bool(true),
		KeyConditionExpression:   aws.String("#pk = :pk AND #pos BETWEEN :lo AND :hi"),
		ExpressionAttributeNames: map[string]string{"#pk": attrPK, "#pos": attrPos},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk": attrS(partitionKey(k)), ":lo": attrS(lo), ":hi": attrS(hi),
		},
	}
	if len(projection) > 0 {
		expr := ""
		for i, name := range projection {
			ph := "#p" + strconv.Itoa(i)
			in.ExpressionAttributeNames[ph] = name
			if i > 0 {
				expr += ", "
			}
			expr += ph
		}
		in.ProjectionExpression = aws.String(expr)
	}
	read := 0
	for {
		if limit > 0 {
			in.Limit = aws.Int32(int32(min(limit-read, 1<<30)))
		}
		out, err := s.db.Query(ctx, in)
		if err != nil {
			return err
		}
		if err := fn(out.Items); err != nil {
			return err
		}
		read += len(out.Items)
		if len(out.LastEvaluatedKey) == 0 || (limit > 0 && read >= limit) {
			return nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// transact runs a transaction, retrying it while it loses to concurrent
// transactions on the same items (DynamoDB cancels rather than waits). It
// returns the cancellation reasons when a condition failed, nil when it
// committed.
func (s *Store) transact(ctx context.Context, items []types.TransactWriteItem) ([]types.CancellationReason, error) {
	for attempt := 0; ; attempt++ {
		_, err := s.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		if err == nil {
			return nil, nil
		}
		var tce *types.TransactionCanceledException
		if !errors.As(err, &tce) && !isConflict(err) {
			return nil, err
		}
		if tce != nil && !onlyConflicts(tce.CancellationReasons) {
			return tce.CancellationReasons, nil
		}
		if attempt >= maxAttempts {
			return nil, errRetriesExhausted
		}
		if err := pause(ctx, attempt); err != nil {
			return nil, err
		}
	}
}

// Cancellation reason codes.
const (
	codeConditionFailed = "ConditionalCheckFailed"
	codeConflict        = "TransactionConflict"
)

func failed(reasons []types.CancellationReason, i int) bool {
	return i < len(reasons) && aws.ToString(reasons[i].Code) == codeConditionFailed
}

// onlyConflicts tells whether a cancellation is a lost race and nothing else,
// which is worth retrying as it is.
func onlyConflicts(reasons []types.CancellationReason) bool {
	conflict := false
	for _, r := range reasons {
		switch aws.ToString(r.Code) {
		case "", "None":
		case codeConflict:
			conflict = true
		default:
			return false
		}
	}
	return conflict
}

func describeReasons(reasons []types.CancellationReason) string {
	s := ""
	for i, r := range reasons {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d: %s %s", i, aws.ToString(r.Code), aws.ToString(r.Message))
	}
	return s
}

// isConflict tells whether a single-item write lost to a transaction in
// flight on its item; it was not applied.
func isConflict(err error) bool {
	var tc *types.TransactionConflictException
	return errors.As(err, &tc)
}

// pause waits before retry number attempt: jittered, growing to 100 ms.
func pause(ctx context.Context, attempt int) error {
	d := min(time.Millisecond<<min(attempt, 7), 100*time.Millisecond)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
