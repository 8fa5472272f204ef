#!/usr/bin/env bash
# Starts, stops or describes every test database server at once; what
# `make test-all` and CI use.
#
#   scripts/testdb/all.sh start   start each server (installing it first if needed)
#   scripts/testdb/all.sh stop    stop each server
#   scripts/testdb/all.sh status  say which run (exit status 3 if any does not)
#   scripts/testdb/all.sh env     print the DTIMER_TEST_* variables the tests read
#
# TESTDBS selects the servers (default: all of them), e.g.
#   TESTDBS="postgres mysql" scripts/testdb/all.sh start
#
# Servers start one after another: their installs share apt's lock, and on a
# 2-core machine starting Cassandra next to anything else only slows both.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dbs=${TESTDBS:-postgres mysql mongodb dynamodb cassandra}

# var names the environment variable the tests read each server's address from.
var() {
	case "$1" in
	postgres) echo DTIMER_TEST_POSTGRES_URL ;;
	mysql) echo DTIMER_TEST_MYSQL_DSN ;;
	mongodb) echo DTIMER_TEST_MONGODB_URI ;;
	dynamodb) echo DTIMER_TEST_DYNAMODB_ENDPOINT ;;
	cassandra) echo DTIMER_TEST_CASSANDRA_HOSTS ;;
	*)
		echo "all.sh: unknown test database $1" >&2
		exit 2
		;;
	esac
}

case "${1:-}" in
start)
	for db in $dbs; do
		var "$db" >/dev/null
		start=$(date +%s)
		"$here/$db.sh" start
		echo "all.sh: $db ready in $(($(date +%s) - start))s" >&2
	done
	;;
stop)
	rc=0
	for db in $dbs; do
		"$here/$db.sh" stop || rc=1
	done
	exit $rc
	;;
status)
	rc=0
	for db in $dbs; do
		"$here/$db.sh" status || rc=3
	done
	exit $rc
	;;
env)
	for db in $dbs; do
		printf '%s=%s\n' "$(var "$db")" "$("$here/$db.sh" url)"
	done
	;;
*)
	echo "usage: $0 start|stop|status|env" >&2
	exit 2
	;;
esac
