#!/usr/bin/env bash
# Starts a throw-away MariaDB server (the MySQL driver's test server), without
# Docker.
#
#   scripts/testdb/mysql.sh start    init (first time) and start; no-op if running
#   scripts/testdb/mysql.sh stop     stop it
#   scripts/testdb/mysql.sh url      print the DSN tests read from DTIMER_TEST_MYSQL_DSN
#   scripts/testdb/mysql.sh status   say whether it runs (exit status 3 if not)
#
# Typical use:
#   scripts/testdb/mysql.sh start
#   cd server && DTIMER_TEST_MYSQL_DSN=$(../scripts/testdb/mysql.sh url) go test ./internal/store/mysql/
#
# Environment:
#   DTIMER_TESTDB_DIR       where test databases live (default <repo>/.testdb, gitignored)
#   DTIMER_TEST_MYSQL_PORT  TCP port on 127.0.0.1 (default 53306)
#
# The server is tuned for tests, not for data: the redo log is not flushed at
# commit, the doublewrite buffer and binary log are off, root has no password
# on the server's own socket, and the user "dtimer" (password "dtimer") may do
# anything from 127.0.0.1. Do not point anything real at it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
port=${DTIMER_TEST_MYSQL_PORT:-53306}
base=${DTIMER_TESTDB_DIR:-$repo/.testdb}
dir=$base/mysql
data=$dir/data
run=$dir/run
sock=$run/mysqld.sock
pidfile=$run/mysqld.pid
log=$dir/mariadb.log
db=dtimer
user=dtimer
password=dtimer

self=mysql.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# find_bin prints the path of the first of its arguments found on PATH or in
# /usr/sbin (which a non-root PATH often lacks).
find_bin() {
	local name
	for name in "$@"; do
		if command -v "$name" >/dev/null 2>&1; then
			command -v "$name"
			return 0
		fi
		if [ -x "/usr/sbin/$name" ]; then
			echo "/usr/sbin/$name"
			return 0
		fi
	done
	return 1
}

find_bins() {
	server=$(find_bin mariadbd mysqld) || return 1
	installdb=$(find_bin mariadb-install-db mysql_install_db) || return 1
	admin=$(find_bin mariadb-admin mysqladmin) || return 1
	client=$(find_bin mariadb mysql) || return 1
}

install_mariadb() {
	say "MariaDB server binaries not found; installing the mariadb-server package"
	apt_install mariadb-server
}

# The server refuses to run as root unless told to; this throw-away server
# runs as whoever starts it, so that its files stay reachable under the repo.
user_flag() {
	if is_root; then
		echo --user=root
	fi
}

pid() { cat "$pidfile" 2>/dev/null || true; }

running() {
	local p
	p=$(pid)
	[ -n "$p" ] && kill -0 "$p" 2>/dev/null && "$admin" --no-defaults --socket="$sock" -uroot ping >/dev/null 2>&1
}

init_datadir() {
	say "initializing $data"
	mkdir -p "$data" "$run"
	# shellcheck disable=SC2046
	"$installdb" --no-defaults $(user_flag) --datadir="$data" --auth-root-authentication-method=normal \
		--skip-test-db >"$dir/install-db.log" 2>&1 ||
		die "mariadb-install-db failed; see $dir/install-db.log"
}

# wait_ready waits until the server answers on its socket; given the pid of a
# server just started, it stops waiting as soon as that process has exited.
wait_ready() {
	local i started=${1:-}
	for i in $(seq 1 60); do
		if "$admin" --no-defaults --connect-timeout=2 --socket="$sock" -uroot ping >/dev/null 2>&1; then
			return 0
		fi
		if [ -n "$started" ] && ! kill -0 "$started" 2>/dev/null; then
			die "server exited; last lines of $log:$(echo; tail -n 20 "$log" 2>/dev/null)"
		fi
		sleep 0.5
	done
	die "server did not answer within 30s; see $log"
}

# setup_user creates the tests' user and database; idempotent.
setup_user() {
	"$client" --no-defaults --socket="$sock" -uroot <<EOF
CREATE USER IF NOT EXISTS '$user'@'127.0.0.1' IDENTIFIED BY '$password';
GRANT ALL PRIVILEGES ON *.* TO '$user'@'127.0.0.1';
CREATE DATABASE IF NOT EXISTS \`$db\`;
EOF
}

cmd_start() {
	if ! find_bins; then
		install_mariadb
		find_bins || die "installed mariadb-server but found no mariadbd/mariadb-install-db"
	fi
	mkdir -p "$dir" "$run"
	[ -d "$data/mysql" ] || init_datadir
	if ! running; then
		rm -f "$sock" "$pidfile"
		# The flags are given at every start (no option file), so that a
		# changed DTIMER_TEST_MYSQL_PORT applies. Small buffers: several test
		# servers share a 2-core machine. One file per table would cost a file
		# creation and removal per test database, the shared tablespace does not.
		# shellcheck disable=SC2046
		setsid "$server" --no-defaults $(user_flag) \
			--datadir="$data" --socket="$sock" --pid-file="$pidfile" --log-error="$log" \
			--bind-address=127.0.0.1 --port="$port" --skip-name-resolve \
			--character-set-server=utf8mb4 --collation-server=utf8mb4_bin \
			--max-connections=500 --performance-schema=OFF --skip-log-bin \
			--innodb-buffer-pool-size=128M --innodb-log-file-size=64M \
			--innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-flush-method=nosync \
			--innodb-file-per-table=0 \
			</dev/null >>"$dir/stdout.log" 2>&1 &
		wait_ready $!
		say "started on 127.0.0.1:$port ($data)"
	else
		say "already running ($data)"
	fi
	setup_user
}

cmd_stop() {
	find_bins || die "no MariaDB server binaries found"
	if ! running; then
		say "not running"
		return 0
	fi
	local p i
	p=$(pid)
	"$admin" --no-defaults --socket="$sock" -uroot shutdown >/dev/null 2>&1 || kill "$p" 2>/dev/null || true
	for i in $(seq 1 60); do
		kill -0 "$p" 2>/dev/null || {
			say "stopped"
			return 0
		}
		sleep 0.5
	done
	die "server (pid $p) did not stop within 30s"
}

cmd_status() {
	find_bins || die "no MariaDB server binaries found"
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
url) echo "$user:$password@tcp(127.0.0.1:$port)/$db" ;;
*)
	echo "usage: $0 start|stop|url|status" >&2
	exit 2
	;;
esac
