package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

// mongodbStore is a database of its own on the server of
// DTIMER_TEST_MONGODB_URI; the server creates it at migration (MongoDB
// creates databases on first use), the cleanup drops it.
func mongodbStore(t *testing.T) []string {
	uri := storetest.EnvOrSkip(t, "DTIMER_TEST_MONGODB_URI")
	var b [6]byte
	_, _ = rand.Read(b[:])
	database := "e2e_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Errorf("drop database %s: %v", database, err)
			return
		}
		defer func() { _ = client.Disconnect(ctx) }()
		if err := client.Database(database).Drop(ctx); err != nil {
			t.Errorf("drop database %s: %v", database, err)
		}
	})
	return []string{
		"DTIMER_STORE_DRIVER=mongodb",
		"DTIMER_STORE_MONGODB_URI=" + uri,
		"DTIMER_STORE_MONGODB_DATABASE=" + database,
		// Many servers run at once against one test server.
		"DTIMER_STORE_MONGODB_MAX_POOL_SIZE=8",
	}
}
