package app_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/config"
)

// debug.pprof_address serves the profiles on a listener of its own, which
// the API's does not, and which stops with the node.
func TestPprofListener(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t)
	addr := gossipAddrs(t, 2)
	n := c.startWith(func(cfg *config.Config) { cfg.Debug.PprofAddress = addr[1] }, "solo", addr[0])

	get := func(url string) (int, error) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	code, err := get("http://" + addr[1] + "/debug/pprof/cmdline")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	code, err = get(n.url + "/debug/pprof/cmdline")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code, "the API does not serve profiles")

	n.stop(t)
	_, err = get("http://" + addr[1] + "/debug/pprof/cmdline")
	require.Error(t, err, "the listener closes with the node")
}
