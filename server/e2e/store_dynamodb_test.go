package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

// dynamodbStore is a table of its own on the DynamoDB (Local) endpoint of
// DTIMER_TEST_DYNAMODB_ENDPOINT; the server creates it at migration, the
// cleanup deletes it. DynamoDB Local accepts any credentials.
func dynamodbStore(t *testing.T) []string {
	endpoint := storetest.EnvOrSkip(t, "DTIMER_TEST_DYNAMODB_ENDPOINT")
	const region, key, secret = "us-east-1", "dtimer", "dtimer"
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "e2e_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		tr := http.DefaultTransport.(*http.Transport).Clone()
		defer tr.CloseIdleConnections()
		c := dynamodb.New(dynamodb.Options{
			Region:       region,
			BaseEndpoint: aws.String(endpoint),
			Credentials:  credentials.NewStaticCredentialsProvider(key, secret, ""),
			HTTPClient:   &http.Client{Transport: tr},
		})
		_, err := c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
		var nf *types.ResourceNotFoundException
		if err != nil && !errors.As(err, &nf) {
			t.Errorf("delete table %s: %v", table, err)
		}
	})
	return []string{
		"DTIMER_STORE_DRIVER=dynamodb",
		"DTIMER_STORE_DYNAMODB_ENDPOINT=" + endpoint,
		"DTIMER_STORE_DYNAMODB_REGION=" + region,
		"DTIMER_STORE_DYNAMODB_TABLE=" + table,
		"DTIMER_STORE_DYNAMODB_ACCESS_KEY_ID=" + key,
		"DTIMER_STORE_DYNAMODB_SECRET_ACCESS_KEY=" + secret,
		// Many servers run at once against one DynamoDB Local.
		"DTIMER_STORE_DYNAMODB_MAX_CONNS=16",
	}
}
