package cassandra

import "github.com/gocql/gocql"

// SessionOf exposes a store's session to the driver's tests, which need it
// to set up states that only a crash or another process can leave behind.
func SessionOf(s *Store) *gocql.Session { return s.session }
