// Package dynamodb is the Amazon DynamoDB store driver (aws-sdk-go-v2).
//
// # Schema
//
// One table. Its partition key pk is the shard partition ("<namespace>#<shard>",
// unambiguous because the shard number after the last '#' has none); its sort
// key sk is "s" for the shard row and "t#<timer id>" for a timer. A timer is
// therefore one item addressed by (namespace, id): an upsert is a plain Put,
// whatever the timer's position or status, and there is no second item to
// keep in step with it.
//
// The firing order is a local secondary index, "pos", on the same partition
// key and the string attribute pos = "<due time in ms, 16 digits>#<UUID in
// hex>", whose byte order is Position order. Only pending timers carry pos,
// so the index is sparse: failed timers and the shard row are not in it. A
// window read is one Query of that index between two pos bounds with an exact
// Limit and no filter (a filter would apply after the limit and shorten
// pages), paged until the limit is met; a range delete reads the keys of the
// same index range. Local secondary indexes allow strongly consistent reads,
// which every read here uses, and project ALL attributes so a window needs no
// second read per timer.
//
// # Fencing
//
// Every fenced timer write is a TransactWriteItems of a ConditionCheck on the
// shard row (version = fence) and the write itself: DynamoDB commits both or
// neither, and a claim (an UpdateItem of the shard row) is serialised with
// those transactions, so once ShardClaim has returned no write under an older
// fence can commit.
//
// A range delete can remove more timers than one transaction can hold (100
// items), so it is made atomic with respect to claims by an intent on the
// shard row. The delete first sets intent = (bound, token) on the shard row,
// conditional on the fence: that write is its commit point. It then deletes
// the timers of the index range in transactions that each check the token is
// still there, and finally removes the intent. (Not BatchWriteItem: its
// deletes are unconditional, so a node paused between reading the range and
// its batch arriving could delete a timer re-created under the same key after
// a takeover.) While an intent is set:
//
//   - a create or update that would put a pending timer at or before its
//     bound fails its condition, finishes the delete itself, and retries, so
//     no timer written after the commit point is swallowed by the delete;
//   - a claim finishes the delete before it bumps the version (and removes
//     the intent with it), so the new owner never loads a timer the delete
//     removes, and the old owner's remaining transactions, which check the
//     token, fail and delete nothing more;
//   - a new range delete finishes the old one first.
//
// Reads do not look at intents: a read racing a range delete may see part of
// it done, as a read racing the engine's own deletes already may see timers
// the engine has fired.
//
// Times are stored as Unix milliseconds; durations as whole milliseconds.
package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dtimer/dtimer/server/internal/store"
)

// Billing modes of Config.BillingMode.
const (
	BillingOnDemand    = "on_demand"
	BillingProvisioned = "provisioned"
)

// Config configures the driver.
type Config struct {
	// Region is the AWS region. Empty takes it from the default chain
	// (AWS_REGION, the shared config); it must resolve to something.
	Region string
	// Endpoint overrides the service URL: DynamoDB Local, a VPC endpoint. Empty
	// uses the region's endpoint.
	Endpoint string
	// Table is dtimer's table; Migrate creates it.
	Table string
	// AccessKeyID and SecretAccessKey are static credentials; both empty uses
	// the default credential chain (environment, shared files, instance or
	// task role).
	AccessKeyID     string
	SecretAccessKey string
	// BillingMode of a table Migrate creates: BillingOnDemand (default) or
	// BillingProvisioned with ReadCapacity and WriteCapacity units.
	BillingMode   string
	ReadCapacity  int64
	WriteCapacity int64
	// MaxConns caps the HTTP connections to the endpoint; 0 means 64.
	MaxConns int
}

// Store implements store.Store on DynamoDB.
type Store struct {
	db        api
	transport *http.Transport
	table     string
	cfg       Config
}

var _ store.Store = (*Store)(nil)

// api is the part of the DynamoDB client the driver uses.
type api interface {
	CreateTable(context.Context, *dynamodb.CreateTableInput, ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(context.Context, *dynamodb.PutItemInput, ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	Query(context.Context, *dynamodb.QueryInput, ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// precision is that of the stored Unix milliseconds.
const precision = time.Millisecond

// tableName is DynamoDB's rule for table names.
var tableName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{3,255}$`)

// New checks cfg, builds the client and checks that the server answers. It
// does not migrate.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("dynamodb: %w", err)
	}
	if cfg.BillingMode == "" {
		cfg.BillingMode = BillingOnDemand
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 64
	}
	// A buildable client, so that the SDK's loader can apply what the
	// environment asks of the transport (AWS_CA_BUNDLE); the transport it
	// ends up with is then taken out, so that Close can release its
	// connections.
	conns := func(tr *http.Transport) {
		tr.MaxIdleConns = cfg.MaxConns
		tr.MaxIdleConnsPerHost = cfg.MaxConns
		tr.MaxConnsPerHost = cfg.MaxConns
	}
	opts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(conns)),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, "")))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: load aws config: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("dynamodb: region is not set (store.dynamodb.region or AWS_REGION)")
	}
	bc, ok := awsCfg.HTTPClient.(*awshttp.BuildableClient)
	if !ok {
		return nil, fmt.Errorf("dynamodb: unexpected http client %T", awsCfg.HTTPClient)
	}
	tr := bc.GetTransport()
	awsCfg.HTTPClient = &http.Client{Transport: tr}
	db := dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	s := &Store{db: db, transport: tr, table: cfg.Table, cfg: cfg}
	if err := s.Ping(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, fmt.Errorf("dynamodb: connect: %w", err)
	}
	return s, nil
}

func (c Config) validate() error {
	if !tableName.MatchString(c.Table) {
		return fmt.Errorf("table %q must be 3 to 255 letters, digits, '_', '-' or '.'", c.Table)
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("endpoint %q must be an http:// or https:// URL", c.Endpoint)
		}
		if u.User != nil {
			return errors.New("endpoint must not contain credentials; use access_key_id and secret_access_key")
		}
	}
	if (c.AccessKeyID == "") != (c.SecretAccessKey == "") {
		return errors.New("access_key_id and secret_access_key must be set together")
	}
	switch c.BillingMode {
	case "", BillingOnDemand:
		if c.ReadCapacity != 0 || c.WriteCapacity != 0 {
			return errors.New("read_capacity and write_capacity apply only to billing_mode provisioned")
		}
	case BillingProvisioned:
		if c.ReadCapacity < 1 || c.WriteCapacity < 1 {
			return errors.New("billing_mode provisioned needs read_capacity and write_capacity of at least 1")
		}
	default:
		return fmt.Errorf("billing_mode must be %q or %q, got %q", BillingOnDemand, BillingProvisioned, c.BillingMode)
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("max_conns must not be negative, got %d", c.MaxConns)
	}
	return nil
}

// Precision implements store.Store.
func (s *Store) Precision() time.Duration { return precision }

// Ping implements store.Store: DescribeTable of dtimer's table, which needs
// no permission beyond the table; "no such table" still shows the server
// answers.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &s.table})
	var nf *types.ResourceNotFoundException
	if err != nil && !errors.As(err, &nf) {
		return translate("ping", err)
	}
	return nil
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.transport.CloseIdleConnections()
	return nil
}

// Attribute names. Short, since every item carries them and they count
// toward item size and capacity units.
const (
	attrPK      = "pk"
	attrSK      = "sk"
	attrPos     = "pos"
	attrVersion = "v"
	attrOwner   = "o"
	attrClaimed = "ca"
	// The range-delete intent on the shard row: its bound (a pos value), its
	// token, and whether someone other than its writer worked on it.
	attrIntentUpTo   = "rd"
	attrIntentToken  = "rt"
	attrIntentHelped = "rh"

	posIndex = "pos"
	skShard  = "s"
)

// Migrate implements store.Store: it creates the table with its index if it
// does not exist, waits until it is active, and checks that an existing table
// has the shape this driver needs. Nodes migrating at once race on
// CreateTable; the losers see the table in use and wait for it like the rest.
func (s *Store) Migrate(ctx context.Context) error {
	desc, err := s.describe(ctx)
	if err != nil {
		return translate("migrate", err)
	}
	if desc == nil {
		if err := s.createTable(ctx); err != nil {
			return translate("migrate", err)
		}
	}
	for delay := 200 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		desc, err = s.describe(ctx)
		if err != nil {
			return translate("migrate", err)
		}
		if desc != nil && desc.TableStatus == types.TableStatusActive {
			return checkShape(desc)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return translate("migrate", fmt.Errorf("table %s not active: %w", s.table, ctx.Err()))
		case <-t.C:
		}
	}
}

// describe returns the table's description, or nil if it does not exist.
func (s *Store) describe(ctx context.Context) (*types.TableDescription, error) {
	out, err := s.db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &s.table})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return out.Table, nil
}

func (s *Store) createTable(ctx context.Context) error {
	str := types.ScalarAttributeTypeS
	in := &dynamodb.CreateTableInput{
		TableName: &s.table,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(attrPK), AttributeType: str},
			{AttributeName: aws.String(attrSK), AttributeType: str},
			{AttributeName: aws.String(attrPos), AttributeType: str},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(attrPK), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(attrSK), KeyType: types.KeyTypeRange},
		},
		LocalSecondaryIndexes: []types.LocalSecondaryIndex{{
			IndexName: aws.String(posIndex),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(attrPK), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(attrPos), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}},
	}
	if s.cfg.BillingMode == BillingProvisioned {
		in.BillingMode = types.BillingModeProvisioned
		in.ProvisionedThroughput = &types.ProvisionedThroughput{
			ReadCapacityUnits:  aws.Int64(s.cfg.ReadCapacity),
			WriteCapacityUnits: aws.Int64(s.cfg.WriteCapacity),
		}
	} else {
		in.BillingMode = types.BillingModePayPerRequest
	}
	_, err := s.db.CreateTable(ctx, in)
	var inUse *types.ResourceInUseException
	if errors.As(err, &inUse) {
		return nil // another node created it, or it is being created
	}
	return err
}

// checkShape rejects a table this driver cannot use, such as one created by
// hand without the pos index (a local secondary index cannot be added later).
func checkShape(d *types.TableDescription) error {
	keys := map[string]types.KeyType{}
	for _, k := range d.KeySchema {
		keys[aws.ToString(k.AttributeName)] = k.KeyType
	}
	if keys[attrPK] != types.KeyTypeHash || keys[attrSK] != types.KeyTypeRange || len(keys) != 2 {
		return fmt.Errorf("dynamodb: migrate: table %s exists with another key schema (want pk HASH, sk RANGE)", aws.ToString(d.TableName))
	}
	for _, ix := range d.LocalSecondaryIndexes {
		if aws.ToString(ix.IndexName) != posIndex {
			continue
		}
		ok := len(ix.KeySchema) == 2 && aws.ToString(ix.KeySchema[1].AttributeName) == attrPos &&
			ix.Projection != nil && ix.Projection.ProjectionType == types.ProjectionTypeAll
		if ok {
			return nil
		}
	}
	return fmt.Errorf("dynamodb: migrate: table %s exists without the local secondary index %q (pk, pos) projecting ALL; "+
		"it cannot be added to an existing table: use another table name", aws.ToString(d.TableName), posIndex)
}

// translate wraps a native error for op; the one place native errors become
// store errors is here and in the callers' reading of condition failures.
// Context errors stay matchable through the wrap.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return fmt.Errorf("dynamodb: %s: table missing (run migrate): %w", op, err)
	}
	return fmt.Errorf("dynamodb: %s: %w", op, err)
}
