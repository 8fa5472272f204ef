package e2e_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/dtimer/dtimer/server/internal/config"
)

// composeFiles are the Docker compose files shipped in docker/, and the
// database service each must start (none for SQLite). No Docker engine runs
// where the tests do, so they are checked as documents: YAML that parses,
// the services expected, dependencies that exist, no host port used twice,
// and dtimer's environment made only of real config keys that validate.
var composeFiles = map[string][]string{
	"compose.sqlite.yaml":    nil,
	"compose.postgres.yaml":  {"postgres"},
	"compose.mysql.yaml":     {"mysql"},
	"compose.mongodb.yaml":   {"mongodb"},
	"compose.dynamodb.yaml":  {"dynamodb"},
	"compose.cassandra.yaml": {"cassandra"},
	"compose.all.yaml":       {"postgres", "mysql", "mongodb", "dynamodb", "cassandra"},
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	DependsOn   map[string]any    `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// TestComposeFiles is not parallel: it sets the environment to load each
// dtimer service's configuration.
func TestComposeFiles(t *testing.T) {
	dir := filepath.Join("..", "..", "docker")
	found, err := filepath.Glob(filepath.Join(dir, "compose.*.yaml"))
	require.NoError(t, err)
	var names []string
	for _, f := range found {
		names = append(names, filepath.Base(f))
	}
	var want []string
	for n := range composeFiles {
		want = append(want, n)
	}
	slices.Sort(want)
	require.Equal(t, want, names, "docker/compose.*.yaml and the files this test knows")

	envKeys := map[string]bool{}
	for _, k := range append(config.Keys(), "namespaces") {
		envKeys["DTIMER_"+strings.ToUpper(strings.ReplaceAll(k, ".", "_"))] = true
	}
	for name, databases := range composeFiles {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(dir, name))
			require.NoError(t, err)
			var cf composeFile
			require.NoError(t, yaml.Unmarshal(raw, &cf))
			for _, db := range databases {
				require.Contains(t, cf.Services, db, "the database service")
			}
			hostPorts := map[string]string{}
			dtimers := 0
			for sname, s := range cf.Services {
				require.True(t, s.Image != "" || s.Build != nil, "service %s has an image or a build", sname)
				for dep, how := range s.DependsOn {
					require.Contains(t, cf.Services, dep, "service %s depends on a service of the file", sname)
					if m, ok := how.(map[string]any); ok && m["condition"] == "service_healthy" {
						require.NotNil(t, cf.Services[dep].Healthcheck, "service %s waits for %s to be healthy, which has no healthcheck", sname, dep)
					}
				}
				for _, p := range s.Ports {
					host, _, ok := strings.Cut(p, ":")
					require.True(t, ok, "service %s publishes %q as host:container", sname, p)
					require.NotContains(t, hostPorts, host, "host port %s of %s is also %s's", host, sname, hostPorts[host])
					hostPorts[host] = sname
				}
				if s.Build == nil {
					continue
				}
				dtimers++
				require.NotNil(t, s.Healthcheck, "dtimer service %s has a healthcheck", sname)
				require.Equal(t, []string{"CMD", "/usr/local/bin/dtimer-server", "healthcheck"}, s.Healthcheck.Test[:3])
				for k, v := range s.Environment {
					require.True(t, envKeys[k], "%s of service %s is no config key", k, sname)
					t.Setenv(k, v)
				}
				_, err := config.Load("")
				require.NoError(t, err, "the configuration of service %s", sname)
				for k := range s.Environment {
					require.NoError(t, os.Unsetenv(k))
				}
			}
			require.Positive(t, dtimers, "a dtimer service")
		})
	}
}
