package dynamodb

import (
	"context"
	"errors"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// StartRangeDelete commits a range delete (sets its intent) and deletes
// nothing, as a node that fails right after the commit point.
func (s *Store) StartRangeDelete(ctx context.Context, f store.Fence, upTo timer.Position) error {
	pos, ok := posAtOrBefore(upTo)
	if !ok {
		return errors.New("empty range")
	}
	row, err := s.setIntent(ctx, f, intent{upTo: pos, token: newToken()})
	if err != nil {
		return err
	}
	if row != nil {
		return errors.New("intent not set")
	}
	return nil
}

// QueryLog records the Queries a store makes.
type QueryLog struct {
	mu      sync.Mutex
	Queries []LoggedQuery
}

// LoggedQuery is one Query and what it read.
type LoggedQuery struct {
	Index          string
	KeyCondition   string
	Filter         string
	Limit          int32
	Count, Scanned int32
}

// Take returns the queries logged so far and forgets them.
func (l *QueryLog) Take() []LoggedQuery {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.Queries
	l.Queries = nil
	return q
}

type loggingAPI struct {
	api
	log *QueryLog
}

func (a loggingAPI) Query(ctx context.Context, in *dynamodb.QueryInput, opts ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	out, err := a.api.Query(ctx, in, opts...)
	if err == nil {
		q := LoggedQuery{Count: out.Count, Scanned: out.ScannedCount}
		if in.IndexName != nil {
			q.Index = *in.IndexName
		}
		if in.KeyConditionExpression != nil {
			q.KeyCondition = *in.KeyConditionExpression
		}
		if in.FilterExpression != nil {
			q.Filter = *in.FilterExpression
		}
		if in.Limit != nil {
			q.Limit = *in.Limit
		}
		a.log.mu.Lock()
		a.log.Queries = append(a.log.Queries, q)
		a.log.mu.Unlock()
	}
	return out, err
}

// LogQueries makes s record its Queries from now on. Call it before s is
// shared between goroutines.
func (s *Store) LogQueries() *QueryLog {
	l := &QueryLog{}
	s.db = loggingAPI{api: s.db, log: l}
	return l
}
