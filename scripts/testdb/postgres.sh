#!/usr/bin/env bash
# Starts a throw-away PostgreSQL server for dtimer's tests, without Docker.
#
#   scripts/testdb/postgres.sh start    init (first time) and start; no-op if running
#   scripts/testdb/postgres.sh stop     stop it
#   scripts/testdb/postgres.sh url      print the URL tests read from DTIMER_TEST_POSTGRES_URL
#   scripts/testdb/postgres.sh status   say whether it runs (exit status 3 if not)
#
# Typical use:
#   scripts/testdb/postgres.sh start
#   cd server && DTIMER_TEST_POSTGRES_URL=$(../scripts/testdb/postgres.sh url) go test ./internal/store/...
#
# Environment:
#   DTIMER_TESTDB_DIR          where test databases live (default <repo>/.testdb, gitignored)
#   DTIMER_TEST_POSTGRES_PORT  TCP port on 127.0.0.1 (default 55432)
#
# The server is tuned for tests, not for data: fsync, synchronous_commit and
# full_page_writes are off and anyone on 127.0.0.1 may connect as "postgres"
# without a password (trust). Do not point anything real at it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
port=${DTIMER_TEST_POSTGRES_PORT:-55432}
base=${DTIMER_TESTDB_DIR:-$repo/.testdb}
db=dtimer

self=postgres.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# as_pg runs a server command as the postgres OS user when we are root:
# PostgreSQL refuses to run as root.
as_pg() {
	if is_root; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# find_bindir prints the directory of the real server binaries, preferring the
# newest /usr/lib/postgresql/<version>/bin over wrappers found on PATH.
find_bindir() {
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
		echo "$d"
		return 0
	fi
	if command -v pg_config >/dev/null 2>&1; then
		d=$(pg_config --bindir)
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	fi
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(readlink -f "$(command -v initdb)")"
		return 0
	fi
	return 1
}

install_postgres() {
	say "PostgreSQL server binaries not found; installing the postgresql package"
	apt_install postgresql
}

# pick_dir chooses the directory for this server. The postgres OS user must be
# able to reach it; if it cannot (a private home or work directory), use a
# directory under /tmp named after the repository, so that every subcommand
# finds the same one.
pick_dir() {
	mkdir -p "$base"
	if is_root && ! runuser -u postgres -- test -x "$base" 2>/dev/null; then
		local sum
		sum=$(printf '%s' "$repo" | cksum | cut -d' ' -f1)
		base=/tmp/dtimer-testdb-$sum
		mkdir -p "$base"
		chmod 755 "$base"
		[ "${1:-}" = quiet ] || say "postgres user cannot reach ${DTIMER_TESTDB_DIR:-$repo/.testdb}; using $base"
	fi
	dir=$base/postgres
	data=$dir/data
	run=$dir/run
	log=$dir/postgres.log
}

running() {
	[ -f "$data/PG_VERSION" ] && as_pg "$bindir/pg_ctl" status -D "$data" >/dev/null 2>&1
}

wait_ready() {
	local i
	for i in $(seq 1 60); do
		if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres; then
			return 0
		fi
		sleep 0.5
	done
	die "server did not answer on 127.0.0.1:$port within 30s; see $log"
}

init_cluster() {
	say "initializing $data"
	mkdir -p "$dir"
	if is_root; then
		chown postgres: "$dir"
	fi
	as_pg mkdir -p "$data" "$run"
	as_pg chmod 700 "$data"
	as_pg "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
		die "initdb failed; see $dir/initdb.log"
	as_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# dtimer test server (scripts/testdb/postgres.sh): fast, not durable.
listen_addresses = '127.0.0.1'
unix_socket_directories = '$run'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 128MB
log_min_messages = warning
EOF
}

create_db() {
	local exists
	exists=$("$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
		"SELECT 1 FROM pg_database WHERE datname = '$db'")
	if [ "$exists" != 1 ]; then
		"$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE $db" >/dev/null
		say "created database $db"
	fi
}

cmd_start() {
	if ! bindir=$(find_bindir); then
		install_postgres
		bindir=$(find_bindir) || die "installed postgresql but found no initdb/pg_ctl"
	fi
	pick_dir
	[ -f "$data/PG_VERSION" ] || init_cluster
	if running; then
		say "already running ($data)"
	else
		# The port is given on the command line so that DTIMER_TEST_POSTGRES_PORT
		# applies at every start, not only at init.
		as_pg "$bindir/pg_ctl" start -w -t 30 -D "$data" -l "$log" -o "-p $port" >/dev/null ||
			die "pg_ctl start failed; last lines of $log:$(echo; tail -n 20 "$log" 2>/dev/null)"
		say "started on 127.0.0.1:$port ($data)"
	fi
	wait_ready
	create_db
}

cmd_stop() {
	bindir=$(find_bindir) || die "no PostgreSQL server binaries found"
	pick_dir quiet
	if running; then
		as_pg "$bindir/pg_ctl" stop -w -D "$data" -m fast >/dev/null
		say "stopped"
	else
		say "not running"
	fi
}

cmd_status() {
	bindir=$(find_bindir) || die "no PostgreSQL server binaries found"
	pick_dir quiet
	if running; then
		say "running on 127.0.0.1:$port ($data)"
	else
		say "not running"
		exit 3
	fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) echo "postgres://postgres@127.0.0.1:$port/$db?sslmode=disable" ;;
*)
	echo "usage: $0 start|stop|url|status" >&2
	exit 2
	;;
esac
