package dynamodb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dtimer/dtimer/server/internal/store"
)

// Limits of one delete transaction: DynamoDB allows 100 actions (one is the
// check of the intent) and 4 MB in all; stay well under the latter.
const (
	deletesPerTx = 99
	bytesPerTx   = 3 << 20
)

// TimerDeleteRange implements store.Store; see the package doc for how it
// stays atomic with respect to claims. It reports the count when it did all
// the deleting itself, and -1 when a claim or a write finished the delete
// for it.
func (s *Store) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	upTo, ok := posAtOrBefore(p.UpTo)
	if ok {
		// Nothing to delete is common (the engine deletes in small steps);
		// then the fence check is a read, not a write.
		found, err := s.anyPending(ctx, f.Shard, upTo)
		if err != nil {
			return 0, translate("timer delete range", err)
		}
		ok = found
	}
	if !ok {
		// The range was empty when read; the fence still valid after that
		// read means it was empty under this claim.
		row, err := s.shardRow(ctx, f.Shard)
		if err != nil {
			return 0, translate("timer delete range", err)
		}
		if row == nil || row.version != f.Version {
			return 0, fmt.Errorf("dynamodb: timer delete range: %w", store.ErrShardOwnershipLost)
		}
		return 0, nil
	}

	in := intent{upTo: upTo, token: newToken()}
	for attempt := 0; ; attempt++ {
		if attempt >= maxAttempts {
			return 0, translate("timer delete range", errRetriesExhausted)
		}
		row, err := s.setIntent(ctx, f, in)
		if err != nil {
			return 0, translate("timer delete range", err)
		}
		if row == nil || (row.intent != nil && row.intent.token == in.token) {
			// Set, by this call or by the SDK's retry of it after the first
			// request was applied and its answer lost: the delete is committed.
			break
		}
		if row.version != f.Version {
			return 0, fmt.Errorf("dynamodb: timer delete range: %w", store.ErrShardOwnershipLost)
		}
		if row.intent == nil {
			if err := pause(ctx, attempt); err != nil {
				return 0, translate("timer delete range", err)
			}
			continue
		}
		// An earlier delete did not finish (its node failed or gave up).
		if err := s.finishIntent(ctx, f.Shard, *row.intent); err != nil {
			return 0, translate("timer delete range: finish earlier range delete", err)
		}
	}
	n, helped, err := s.runIntent(ctx, f.Shard, in)
	if err != nil {
		// The intent stays: whoever next writes into its range, claims the
		// shard or deletes a range finishes it.
		return 0, translate("timer delete range", err)
	}
	if helped {
		return -1, nil
	}
	return n, nil
}

// anyPending tells whether shard k has a pending timer at or before upTo.
func (s *Store) anyPending(ctx context.Context, k store.ShardKey, upTo string) (bool, error) {
	found := false
	err := s.queryPos(ctx, k, firstPos, upTo, 1, []string{attrPK, attrSK, attrPos}, func(items []map[string]types.AttributeValue) error {
		found = found || len(items) > 0
		return nil
	})
	return found, err
}

// setIntent writes the intent on the shard row if the fence holds and no
// other intent is set. It returns nil when it did, and otherwise the row as
// it was (a missing row reads as version 0).
func (s *Store) setIntent(ctx context.Context, f store.Fence, in intent) (*shardRow, error) {
	_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:           &s.table,
		Key:                 shardItemKey(f.Shard),
		ConditionExpression: aws.String("#v = :v AND attribute_not_exists(#rt)"),
		UpdateExpression:    aws.String("SET #rd = :upto, #rt = :tok"),
		ExpressionAttributeNames: map[string]string{
			"#v": attrVersion, "#rd": attrIntentUpTo, "#rt": attrIntentToken,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":v": attrN(f.Version), ":upto": attrS(in.upTo), ":tok": attrS(in.token),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		return nil, nil
	case errors.As(err, &ccf):
		row, err := decodeShard(ccf.Item)
		if err != nil {
			return nil, err
		}
		if row == nil {
			return &shardRow{}, nil
		}
		return row, nil
	case isConflict(err):
		// Lost to a transaction on the shard row: report the row unchanged
		// so that the caller tries again.
		return &shardRow{version: f.Version}, nil
	}
	return nil, err
}

// finishIntent finishes a range delete someone else started: it marks the
// intent as helped, so that its writer does not report a count it did not
// make alone, and runs it.
func (s *Store) finishIntent(ctx context.Context, k store.ShardKey, in intent) error {
	for attempt := 0; ; attempt++ {
		_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 &s.table,
			Key:                       shardItemKey(k),
			ConditionExpression:       aws.String("#rt = :tok"),
			UpdateExpression:          aws.String("SET #rh = :true"),
			ExpressionAttributeNames:  map[string]string{"#rt": attrIntentToken, "#rh": attrIntentHelped},
			ExpressionAttributeValues: map[string]types.AttributeValue{":tok": attrS(in.token), ":true": &types.AttributeValueMemberBOOL{Value: true}},
		})
		var ccf *types.ConditionalCheckFailedException
		switch {
		case err == nil:
			_, _, err = s.runIntent(ctx, k, in)
			return err
		case errors.As(err, &ccf):
			return nil // finished already
		case isConflict(err) && attempt < maxAttempts:
			if err := pause(ctx, attempt); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// runIntent deletes the pending timers at or before the intent's bound, in
// transactions that each check that the intent is still set, then removes
// the intent. It returns how many timers it deleted, and whether anyone else
// worked on the intent (then that count is not the delete's).
//
// While the intent is set no write files a timer into its range, so the
// range only shrinks, and whoever runs the intent, possibly several at once,
// deletes exactly the timers that were in it when it was set.
func (s *Store) runIntent(ctx context.Context, k store.ShardKey, in intent) (n int, helped bool, err error) {
	for attempt := 0; ; {
		var keys []map[string]types.AttributeValue
		err := s.queryPos(ctx, k, firstPos, in.upTo, 10*deletesPerTx, []string{attrPK, attrSK, attrPos, attrSize},
			func(items []map[string]types.AttributeValue) error {
				keys = append(keys, items...)
				return nil
			})
		if err != nil {
			return n, true, err
		}
		if len(keys) == 0 {
			break
		}
		for len(keys) > 0 {
			chunk := txChunk(keys)
			keys = keys[len(chunk):]
			reasons, err := s.transact(ctx, s.deleteTx(k, in, chunk))
			switch {
			case err != nil:
				return n, true, err
			case reasons == nil:
				n += len(chunk)
				attempt = 0 // only failures in a row count: others helping make progress too
				continue
			case failed(reasons, 0):
				return n, true, nil // the intent is gone: someone finished it
			}
			// A timer moved or was deleted since the query (by a helper, an
			// update, a TimerDelete): read the range again.
			if attempt++; attempt > maxAttempts {
				return n, true, errRetriesExhausted
			}
			if err := pause(ctx, attempt); err != nil {
				return n, true, err
			}
			break
		}
	}
	out, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 &s.table,
		Key:                       shardItemKey(k),
		ConditionExpression:       aws.String("#rt = :tok"),
		UpdateExpression:          aws.String("REMOVE #rd, #rt, #rh"),
		ExpressionAttributeNames:  map[string]string{"#rd": attrIntentUpTo, "#rt": attrIntentToken, "#rh": attrIntentHelped},
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": attrS(in.token)},
		ReturnValues:              types.ReturnValueAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return n, true, nil // someone else removed it, having finished it
	case err != nil:
		// Finished but not removed: a later writer finishes it again
		// (nothing is left to delete) and removes it.
		return n, true, err
	}
	_, helped = out.Attributes[attrIntentHelped]
	return n, helped, nil
}

// txChunk returns the leading keys that fit in one delete transaction.
func txChunk(keys []map[string]types.AttributeValue) []map[string]types.AttributeValue {
	size := 0
	for i, item := range keys {
		sz := 1024
		if v, ok := item[attrSize].(*types.AttributeValueMemberN); ok {
			if n, err := strconv.Atoi(v.Value); err == nil {
				sz = n
			}
		}
		if i == deletesPerTx || (i > 0 && size+sz > bytesPerTx) {
			return keys[:i]
		}
		size += sz
	}
	return keys
}

// deleteTx deletes the keyed timers if the intent is still set and each
// timer is still where the query found it.
func (s *Store) deleteTx(k store.ShardKey, in intent, items []map[string]types.AttributeValue) []types.TransactWriteItem {
	tx := make([]types.TransactWriteItem, 0, len(items)+1)
	tx = append(tx, types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName:                 &s.table,
		Key:                       shardItemKey(k),
		ConditionExpression:       aws.String("#rt = :tok"),
		ExpressionAttributeNames:  map[string]string{"#rt": attrIntentToken},
		ExpressionAttributeValues: map[string]types.AttributeValue{":tok": attrS(in.token)},
	}})
	for _, item := range items {
		tx = append(tx, types.TransactWriteItem{Delete: &types.Delete{
			TableName:                 &s.table,
			Key:                       map[string]types.AttributeValue{attrPK: item[attrPK], attrSK: item[attrSK]},
			ConditionExpression:       aws.String("#pos = :pos"),
			ExpressionAttributeNames:  map[string]string{"#pos": attrPos},
			ExpressionAttributeValues: map[string]types.AttributeValue{":pos": item[attrPos]},
		}})
	}
	return tx
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
