#!/usr/bin/env bash
# Starts a throw-away DynamoDB Local server for dtimer's tests, without Docker.
#
#   scripts/testdb/dynamodb.sh start    fetch (first time) and start; no-op if running
#   scripts/testdb/dynamodb.sh stop     stop it
#   scripts/testdb/dynamodb.sh url      print the endpoint tests read from DTIMER_TEST_DYNAMODB_ENDPOINT
#   scripts/testdb/dynamodb.sh status   say whether it runs (exit status 3 if not)
#
# Typical use:
#   scripts/testdb/dynamodb.sh start
#   cd server && DTIMER_TEST_DYNAMODB_ENDPOINT=$(../scripts/testdb/dynamodb.sh url) go test ./internal/store/dynamodb/
#
# Environment:
#   DTIMER_TESTDB_DIR          where test databases live (default <repo>/.testdb, gitignored)
#   DTIMER_TEST_DYNAMODB_PORT  TCP port on 127.0.0.1 (default 58000)
#
# DynamoDB Local 3.0.0 (Java 17+) and its native SQLite library come from
# Maven Central and are cached under the testdb dir, so a second start is
# fast. DynamoDB Local has no bind-address option: a small launcher, compiled
# here with javac, builds the server as its own main class does and sets the
# host of its Jetty connector to 127.0.0.1 before starting it. The server keeps
# everything in memory (-inMemory): a stop loses all tables. It checks no
# credentials (any access key works). Do not point anything real at it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
port=${DTIMER_TEST_DYNAMODB_PORT:-58000}
base=${DTIMER_TESTDB_DIR:-$repo/.testdb}
dir=$base/dynamodb
lib=$dir/lib
launcher=$dir/launcher
pidfile=$dir/dynamodb.pid
log=$dir/dynamodb.log

version=3.0.0
sqlite_version=1.0.392
main=DtimerDynamoDBLocal

self=dynamodb.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# java_major prints the major version of the java on PATH, or nothing.
java_major() {
	command -v java >/dev/null 2>&1 || return 0
	java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

install_tools() {
	local want=()
	local major
	major=$(java_major)
	if [ -z "$major" ] || [ "$major" -lt 17 ] || ! command -v javac >/dev/null 2>&1; then
		want+=(openjdk-17-jdk-headless)
	fi
	command -v mvn >/dev/null 2>&1 || want+=(maven)
	command -v curl >/dev/null 2>&1 || want+=(curl)
	[ ${#want[@]} -eq 0 ] && return 0
	apt_install "${want[@]}"
	major=$(java_major)
	[ -n "$major" ] && [ "$major" -ge 17 ] || die "DynamoDB Local $version needs Java 17 or newer on PATH"
}

# fetch copies DynamoDB Local and its dependencies from Maven Central into
# $lib, once. The Maven repository is kept under $dir too.
fetch() {
	[ -f "$lib/.complete" ] && return 0
	say "fetching DynamoDB Local $version from Maven Central into $lib"
	local work=$dir/fetch
	rm -rf "$work" "$lib"
	mkdir -p "$work"
	cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dtimer.testdb</groupId>
  <artifactId>dynamodb-local</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>software.amazon.dynamodb</groupId>
      <artifactId>DynamoDBLocal</artifactId>
      <version>$version</version>
    </dependency>
    <dependency>
      <groupId>com.almworks.sqlite4java</groupId>
      <artifactId>libsqlite4java-linux-amd64</artifactId>
      <version>$sqlite_version</version>
      <type>so</type>
    </dependency>
  </dependencies>
</project>
EOF
	mvn -q -B -f "$work/pom.xml" -Dmaven.repo.local="$dir/m2" \
		dependency:copy-dependencies -DoutputDirectory="$lib" >"$dir/fetch.log" 2>&1 ||
		die "maven could not fetch DynamoDB Local; see $dir/fetch.log"
	# sqlite4java loads lib<name>.so from java.library.path, where <name> is
	# sqlite4java-linux-amd64 followed by its version, or without it: give it
	# the unversioned name it tries first.
	cp "$lib/libsqlite4java-linux-amd64-$sqlite_version.so" "$lib/libsqlite4java-linux-amd64.so"
	touch "$lib/.complete"
}

# build_launcher compiles the launcher that binds the server to 127.0.0.1.
build_launcher() {
	[ -f "$launcher/$main.class" ] && return 0
	mkdir -p "$launcher"
	cat >"$launcher/$main.java" <<'EOF'
import java.lang.reflect.Field;

import org.eclipse.jetty.server.Connector;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

import software.amazon.dynamodb.services.local.main.ServerRunner;
import software.amazon.dynamodb.services.local.server.DynamoDBProxyServer;

// Builds DynamoDB Local from the usual command line, as its ServerRunner
// does, then binds its Jetty connectors to the host named by the system
// property dtimer.host before starting it: DynamoDB Local itself always
// listens on every interface.
public final class DtimerDynamoDBLocal {
	public static void main(String[] args) throws Exception {
		String host = System.getProperty("dtimer.host", "127.0.0.1");
		DynamoDBProxyServer proxy = ServerRunner.createServerFromCommandLineArgs(args);
		Field f = DynamoDBProxyServer.class.getDeclaredField("server");
		f.setAccessible(true);
		Server server = (Server) f.get(proxy);
		int bound = 0;
		for (Connector c : server.getConnectors()) {
			if (c instanceof ServerConnector) {
				((ServerConnector) c).setHost(host);
				bound++;
			}
		}
		if (bound == 0) {
			throw new IllegalStateException("no Jetty connector to bind to " + host);
		}
		proxy.start();
		System.out.println("DynamoDB Local listening on " + host);
	}
}
EOF
	javac -d "$launcher" -cp "$lib/*" "$launcher/$main.java" >"$dir/javac.log" 2>&1 ||
		die "javac failed; see $dir/javac.log"
}

running() {
	[ -f "$pidfile" ] || return 1
	local pid
	pid=$(cat "$pidfile")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$main"
}

# answers checks that the server serves the DynamoDB API: ListTables answers
# with a table list. DynamoDB Local accepts any signature.
answers() {
	curl -s -m 2 -X POST "http://127.0.0.1:$port/" \
		-H 'Content-Type: application/x-amz-json-1.0' \
		-H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
		-H 'Authorization: AWS4-HMAC-SHA256 Credential=dtimer/20250101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=00' \
		-d '{}' 2>/dev/null | grep -q TableNames
}

wait_ready() {
	local pid=$1 i
	for i in $(seq 1 120); do
		if answers; then
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || die "server exited; last lines of $log:$(echo; tail -n 20 "$log" 2>/dev/null)"
		sleep 0.5
	done
	die "server did not answer on 127.0.0.1:$port within 60s; see $log"
}

cmd_start() {
	mkdir -p "$dir"
	if running; then
		say "already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
		wait_ready "$(cat "$pidfile")"
		return 0
	fi
	if answers; then
		die "something else answers on 127.0.0.1:$port; set DTIMER_TEST_DYNAMODB_PORT"
	fi
	install_tools
	fetch
	build_launcher
	# Small heap: tables are tiny and short-lived. SerialGC keeps the JVM from
	# taking cores the tests need.
	nohup java -Xms64m -Xmx512m -XX:+UseSerialGC \
		-Djava.library.path="$lib" -Ddtimer.host=127.0.0.1 \
		-cp "$launcher:$lib/*" "$main" \
		-inMemory -sharedDb -port "$port" -disableTelemetry \
		>"$log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >"$pidfile"
	wait_ready "$pid"
	say "started on 127.0.0.1:$port (pid $pid, log $log)"
}

cmd_stop() {
	if ! running; then
		rm -f "$pidfile"
		say "not running"
		return 0
	fi
	local pid i
	pid=$(cat "$pidfile")
	kill "$pid"
	for i in $(seq 1 40); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.25
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
	say "stopped"
}

cmd_status() {
	if running; then
		say "running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
	else
		say "not running"
		exit 3
	fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) echo "http://127.0.0.1:$port" ;;
*)
	echo "usage: $0 start|stop|url|status" >&2
	exit 2
	;;
esac
