package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/membership"
	"github.com/dtimer/dtimer/server/internal/routing"
)

// relayedTimerJSON is a timer as an owner node would answer it.
const relayedTimerJSON = `{"namespace":"billing","id":"invoice-42","executeAt":"2026-03-01T08:00:00.000Z",` +
	`"callbackUrl":"https://billing.example.com/hooks/reminder","payload":null,` +
	`"retryPolicy":{"maxAttempts":5,"maxAttemptsDuration":"24h0m0s","initialInterval":"1s","backoffMultiplier":2,"maxInterval":"1m0s"},` +
	`"callbackTimeoutSeconds":10,"createdAt":"2026-02-20T14:31:07.120Z","updatedAt":"2026-02-20T14:31:07.120Z","attempts":0,"status":"PENDING"}`

func sampleCluster() *routing.ClusterView {
	return &routing.ClusterView{
		Node: "node-a",
		Members: []membership.Member{
			{Name: "node-a", GossipAddress: "10.0.0.1:7946", HTTPAddress: "10.0.0.1:8080", State: membership.StateAlive, Protocol: 1},
			{Name: "node-b", GossipAddress: "10.0.0.2:7946", HTTPAddress: "10.0.0.2:8080", State: membership.StateAlive, Protocol: 1, Draining: true},
		},
		Namespaces: []routing.NamespaceView{{Name: "billing", NumShards: 2, Shards: []routing.ShardView{
			{Shard: 0, Owner: "node-a", Version: 3, ClaimedAt: testNow, AssignedTo: "node-a"},
			{Shard: 1, AssignedTo: "node-a"},
		}}},
	}
}

func TestClusterView(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.svc.clusterV = sampleCluster()
	rec := b.do(t, http.MethodGet, "/api/v1/cluster", nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, `{"node":"node-a",
		"members":[
			{"name":"node-a","gossipAddress":"10.0.0.1:7946","httpAddress":"10.0.0.1:8080","state":"alive","draining":false,"protocolVersion":1},
			{"name":"node-b","gossipAddress":"10.0.0.2:7946","httpAddress":"10.0.0.2:8080","state":"alive","draining":true,"protocolVersion":1}],
		"namespaces":[{"name":"billing","numShards":2,"shards":[
			{"shard":0,"owner":"node-a","version":3,"claimedAt":"2026-02-20T14:31:07.120Z","assignedTo":"node-a"},
			{"shard":1,"owner":"","version":0,"assignedTo":"node-a"}]}]}`, rec.Body.String())

	b.svc.clusterErr = errors.New("store down")
	requireError(t, b.do(t, http.MethodGet, "/api/v1/cluster", nil), http.StatusInternalServerError, CodeInternal)
}

func TestWritesForAnotherOwnerAreForwardedAndRelayed(t *testing.T) {
	t.Parallel()
	owner := &routing.NotLocalError{Node: "node-b", HTTPAddress: "10.0.0.2:8080"}
	for _, tc := range []struct {
		path, body string
		relay      *routing.Relayed
	}{
		{pathCreate, validCreate, &routing.Relayed{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(relayedTimerJSON)}},
		{pathUpdate, validUpdate, &routing.Relayed{Status: 404, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"error":"TIMER_NOT_FOUND","message":"gone","timestamp":"2026-02-20T14:31:07.120Z"}`)}},
		{pathDelete, validKey, &routing.Relayed{Status: 503, Header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"7"}, "X-Other": {"dropped"}},
			Body: []byte(`{"error":"SHARD_UNAVAILABLE","message":"moving","timestamp":"2026-02-20T14:31:07.120Z"}`)}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.svc.setErr(owner)
			b.svc.relay = tc.relay
			// Spacing the owner must see byte for byte.
			body := strings.Replace(tc.body, `{"namespace"`, "{ \"namespace\"", 1)
			rec := b.do(t, http.MethodPost, tc.path, strings.NewReader(body), "Content-Type", "application/json")
			require.Equal(t, tc.relay.Status, rec.Code)
			require.Equal(t, string(tc.relay.Body), rec.Body.String())
			require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			require.Equal(t, tc.relay.Header.Get("Retry-After"), rec.Header().Get("Retry-After"))
			require.Empty(t, rec.Header().Get("X-Other"))
			require.Equal(t, owner, b.svc.sentTo)
			require.Equal(t, tc.path, b.svc.sentPath)
			require.Equal(t, body, string(b.svc.sentBody))
		})
	}
}

func TestForwardFailureIsShardUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.svc.setErr(&routing.NotLocalError{Node: "node-b", HTTPAddress: "10.0.0.2:8080"})
	b.svc.relayErr = fmt.Errorf("%w: connection refused", routing.ErrShardUnavailable)
	rec := b.do(t, http.MethodPost, pathCreate, strings.NewReader(validCreate), "Content-Type", "application/json")
	requireError(t, rec, http.StatusServiceUnavailable, CodeShardUnavailable)
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
}

func TestForwardedCallsAreNotForwardedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.do(t, http.MethodPost, pathCreate, strings.NewReader(validCreate), "Content-Type", "application/json")
	b.do(t, http.MethodPost, pathCreate, strings.NewReader(validCreate), "Content-Type", "application/json", routing.ForwardedHeader, "node-b")
	require.Equal(t, []bool{false, true}, b.svc.forwarded)
}

func TestBadInputIsNeverForwarded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.svc.setErr(&routing.NotLocalError{Node: "node-b", HTTPAddress: "10.0.0.2:8080"})
	rec := b.do(t, http.MethodPost, pathCreate, strings.NewReader(`{"namespace":"billing"}`), "Content-Type", "application/json")
	requireError(t, rec, http.StatusBadRequest, CodeInvalidInput)
	require.Nil(t, b.svc.sentTo)
}
