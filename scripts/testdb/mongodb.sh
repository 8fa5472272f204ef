#!/usr/bin/env bash
# Starts a throw-away MongoDB-compatible server (FerretDB v1 on the
# PostgreSQL test server) for the MongoDB driver's tests, without Docker.
#
#   scripts/testdb/mongodb.sh start    build FerretDB (first time) and start it; no-op if running
#   scripts/testdb/mongodb.sh stop     stop it
#   scripts/testdb/mongodb.sh url      print the URI tests read from DTIMER_TEST_MONGODB_URI
#   scripts/testdb/mongodb.sh status   say whether it runs (exit status 3 if not)
#
# Typical use:
#   scripts/testdb/mongodb.sh start
#   cd server && DTIMER_TEST_MONGODB_URI=$(../scripts/testdb/mongodb.sh url) go test ./internal/store/mongodb/
#
# Environment:
#   DTIMER_TESTDB_DIR               where test databases live (default <repo>/.testdb, gitignored)
#   DTIMER_TEST_MONGODB_PORT        wire-protocol port on 127.0.0.1 (default 57017)
#   DTIMER_TEST_MONGODB_DEBUG_PORT  FerretDB's HTTP debug port on 127.0.0.1 (default 57018)
#
# FerretDB is built from the Go module proxy (`go install` of it fails: its
# version file is generated), once; the binary is kept under the test
# directory, so later starts take a second. It needs Go (1.22 or later) on
# PATH. It stores its data in the database dtimer_ferretdb of the PostgreSQL
# test server (scripts/testdb/postgres.sh, started if needed). Its SQLite
# handler needs nothing else but stalls under the tests' concurrent writes.
# It has no authentication, no replica set and no transactions, and its
# updates are not atomic (see docs/drivers/mongodb.md). Do not point anything
# real at it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
port=${DTIMER_TEST_MONGODB_PORT:-57017}
debug_port=${DTIMER_TEST_MONGODB_DEBUG_PORT:-57018}
base=${DTIMER_TESTDB_DIR:-$repo/.testdb}
version=v1.24.0
dir=$base/mongodb
bin=$dir/bin/ferretdb-$version
state=$dir/state
pgdb=dtimer_ferretdb
pidfile=$dir/ferretdb.pid
log=$dir/ferretdb.log

self=mongodb.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_go() {
	say "go not found; installing the golang-go package"
	apt_install golang-go
}

# build_ferretdb builds FerretDB from the module proxy's copy of its source
# into $bin. The source in the module cache is read-only and lacks
# build/version/version.txt, which the build embeds, hence the copy.
build_ferretdb() {
	command -v go >/dev/null 2>&1 || install_go
	say "building FerretDB $version (once; about two minutes)"
	local src work
	# GOWORK=off: the test directory may lie inside the dtimer workspace.
	src=$(cd / && GOWORK=off GOFLAGS=-mod=mod go mod download -json "github.com/FerretDB/FerretDB@$version" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$src" ] && [ -d "$src" ] || die "go mod download github.com/FerretDB/FerretDB@$version gave no source directory"
	mkdir -p "$dir/bin"
	work=$(mktemp -d "$dir/build.XXXXXX")
	cp -R "$src/." "$work/"
	chmod -R u+w "$work"
	echo "$version" >"$work/build/version/version.txt"
	if ! (cd "$work" && GOWORK=off CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" ./cmd/ferretdb) >"$dir/build.log" 2>&1; then
		rm -rf "$work"
		die "go build of FerretDB failed; see $dir/build.log"
	fi
	rm -rf "$work"
	mv "$bin.tmp" "$bin"
}

pid() { cat "$pidfile" 2>/dev/null || true; }

# answers checks FerretDB's readiness probe (it pings the backend), or, without
# curl, that the wire-protocol port accepts connections.
answers() {
	if command -v curl >/dev/null 2>&1; then
		curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$debug_port/debug/readyz" 2>/dev/null
	else
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
	fi
}

running() {
	local p
	p=$(pid)
	[ -n "$p" ] && kill -0 "$p" 2>/dev/null && answers
}

# wait_ready waits until the server answers; given the pid of a server just
# started, it stops waiting as soon as that process has exited.
wait_ready() {
	local i started=${1:-}
	for i in $(seq 1 60); do
		if answers; then
			return 0
		fi
		if [ -n "$started" ] && ! kill -0 "$started" 2>/dev/null; then
			die "server exited; last lines of $log:$(echo; tail -n 20 "$log" 2>/dev/null)"
		fi
		sleep 0.5
	done
	die "server did not answer within 30s; see $log"
}

# pg_url starts the PostgreSQL test server if needed, creates FerretDB's
# database in it and prints its URL.
pg_url() {
	local url psql
	"$repo/scripts/testdb/postgres.sh" start >&2
	url=$("$repo/scripts/testdb/postgres.sh" url)
	psql=$(ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1 || true)
	[ -n "$psql" ] || psql=$(command -v psql) || die "psql not found"
	if [ "$("$psql" "$url" -tAc "SELECT 1 FROM pg_database WHERE datname = '$pgdb'")" != 1 ]; then
		"$psql" "$url" -qc "CREATE DATABASE $pgdb" >/dev/null
	fi
	echo "$url" | sed "s#/[^/?]*?#/$pgdb?#"
}

cmd_start() {
	[ -x "$bin" ] || build_ferretdb
	mkdir -p "$state"
	if running; then
		say "already running"
		return 0
	fi
	local p
	p=$(pid)
	if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
		# Started but not answering yet (another start in progress).
		wait_ready "$p"
		say "already running"
		return 0
	fi
	local pg
	pg=$(pg_url)
	# Flags are given at every start, so that changed ports apply.
	setsid "$bin" --handler=postgresql --postgresql-url="$pg" --state-dir="$state" \
		--listen-addr="127.0.0.1:$port" --debug-addr="127.0.0.1:$debug_port" \
		--telemetry=disable --log-level=error --log-format=text \
		</dev/null >>"$log" 2>&1 &
	echo $! >"$pidfile"
	wait_ready $!
	say "started on 127.0.0.1:$port (data in PostgreSQL database $pgdb)"
}

cmd_stop() {
	local p i
	p=$(pid)
	if [ -z "$p" ] || ! kill -0 "$p" 2>/dev/null; then
		rm -f "$pidfile"
		say "not running"
		return 0
	fi
	kill "$p"
	for i in $(seq 1 60); do
		if ! kill -0 "$p" 2>/dev/null; then
			rm -f "$pidfile"
			say "stopped"
			return 0
		fi
		sleep 0.5
	done
	die "server (pid $p) did not stop within 30s"
}

cmd_status() {
	if running; then
		say "running on 127.0.0.1:$port"
	else
		say "not running"
		exit 3
	fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) echo "mongodb://127.0.0.1:$port/" ;;
*)
	echo "usage: $0 start|stop|url|status" >&2
	exit 2
	;;
esac
