#!/usr/bin/env bash
# Starts a throw-away one-node Apache Cassandra for dtimer's tests, without
# Docker.
#
#   scripts/testdb/cassandra.sh start    install (first time) and start; no-op if running
#   scripts/testdb/cassandra.sh stop     stop it
#   scripts/testdb/cassandra.sh url      print the hosts tests read from DTIMER_TEST_CASSANDRA_HOSTS
#   scripts/testdb/cassandra.sh status   say whether it runs (exit status 3 if not)
#
# Typical use:
#   scripts/testdb/cassandra.sh start
#   cd server && DTIMER_TEST_CASSANDRA_HOSTS=$(../scripts/testdb/cassandra.sh url) go test ./internal/store/cassandra/
#
# Environment:
#   DTIMER_TESTDB_DIR                    where test databases live (default <repo>/.testdb, gitignored)
#   DTIMER_TEST_CASSANDRA_PORT           native protocol port on 127.0.0.1 (default 59042)
#   DTIMER_TEST_CASSANDRA_STORAGE_PORT   inter-node port on 127.0.0.1 (default 57000)
#   DTIMER_TEST_CASSANDRA_VERSION        org.apache.cassandra:cassandra-all version (default 5.0.4)
#   DTIMER_TEST_CASSANDRA_HEAP           JVM heap (default 1g)
#   DTIMER_TEST_CASSANDRA_START_TIMEOUT  seconds to wait for the node to answer (default 180)
#
# Cassandra comes from Maven Central (cassandra-all and its runtime
# dependencies, resolved once by Maven into <testdb>/cassandra/lib-<version>)
# and runs on Java 17 straight from its jars: CassandraDaemon with the module
# flags of Cassandra's conf/jvm17-server.options. The node is tuned for tests,
# not for data: no authentication, commit log synced every 10 s, no snapshots
# on drop or truncate, Paxos v2, long request timeouts for a loaded machine.
# Do not point anything real at it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
port=${DTIMER_TEST_CASSANDRA_PORT:-59042}
storage_port=${DTIMER_TEST_CASSANDRA_STORAGE_PORT:-57000}
version=${DTIMER_TEST_CASSANDRA_VERSION:-5.0.4}
heap=${DTIMER_TEST_CASSANDRA_HEAP:-1g}
base=${DTIMER_TESTDB_DIR:-$repo/.testdb}
dir=$base/cassandra
lib=$dir/lib-$version
conf=$dir/conf
data=$dir/data
logs=$dir/logs
pidfile=$dir/cassandra.pid
# Start-up takes 10-20 s on an idle machine; a loaded CI machine gets more.
start_timeout=${DTIMER_TEST_CASSANDRA_START_TIMEOUT:-180}

self=cassandra.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# find_java prints a Java 17 binary: Cassandra 5.0 runs on 11 or 17, and the
# flags below are those of 17.
find_java() {
	local j
	for j in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} /usr/lib/jvm/java-17-openjdk-*/bin/java "$(command -v java 2>/dev/null || true)"; do
		[ -n "$j" ] && [ -x "$j" ] || continue
		if "$j" -version 2>&1 | head -n 1 | grep -q '"17[."]'; then
			echo "$j"
			return 0
		fi
	done
	return 1
}

ensure_java() {
	if ! java=$(find_java); then
		apt_install openjdk-17-jre-headless
		java=$(find_java) || die "installed openjdk-17-jre-headless but found no Java 17"
	fi
}

# ensure_jars resolves cassandra-all and its runtime dependencies into $lib
# once; later starts reuse them.
ensure_jars() {
	if [ -f "$lib/.complete" ]; then
		return 0
	fi
	command -v mvn >/dev/null 2>&1 || apt_install maven
	say "resolving org.apache.cassandra:cassandra-all:$version from Maven Central into $lib"
	local pomdir=$dir/pom-$version
	mkdir -p "$pomdir"
	cat >"$pomdir/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dtimer.testdb</groupId>
  <artifactId>cassandra-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>$version</version>
    </dependency>
  </dependencies>
</project>
EOF
	rm -rf "$lib.tmp"
	(cd "$pomdir" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$lib.tmp") >"$dir/mvn.log" 2>&1 ||
		die "maven could not resolve cassandra-all $version; see $dir/mvn.log"
	ls "$lib.tmp"/cassandra-all-*.jar >/dev/null 2>&1 || die "no cassandra-all jar after resolution; see $dir/mvn.log"
	touch "$lib.tmp/.complete"
	rm -rf "$lib"
	mv "$lib.tmp" "$lib"
}

write_config() {
	mkdir -p "$conf" "$data" "$logs"
	cat >"$conf/cassandra.yaml" <<EOF
# dtimer test node (scripts/testdb/cassandra.sh): fast, not durable.
cluster_name: dtimer-test
num_tokens: 1
initial_token: 0
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1:$storage_port"
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: $storage_port
native_transport_port: $port
start_native_transport: true
data_file_directories: [$data/data]
commitlog_directory: $data/commitlog
saved_caches_directory: $data/saved_caches
hints_directory: $data/hints
cdc_raw_directory: $data/cdc_raw
commitlog_sync: periodic
commitlog_sync_period: 10000ms
# Tests drop their keyspaces; snapshots of them would only fill the disk.
auto_snapshot: false
snapshot_on_duplicate_row_detection: false
hinted_handoff_enabled: false
dynamic_snitch: false
# Every dtimer write is a lightweight transaction; Paxos v2 (Cassandra 4.1+)
# takes fewer round trips than v1: the driver's tests run about a third faster.
paxos_variant: v2
# Small memory, a small machine shared with other servers.
memtable_heap_space: 128MiB
memtable_offheap_space: 128MiB
key_cache_size: 16MiB
counter_cache_size: 0MiB
concurrent_reads: 8
concurrent_writes: 8
concurrent_counter_writes: 4
concurrent_compactors: 1
# A loaded 2-core machine: time out late rather than flake.
read_request_timeout: 20000ms
range_request_timeout: 20000ms
write_request_timeout: 20000ms
counter_write_request_timeout: 20000ms
cas_contention_timeout: 10000ms
truncate_request_timeout: 60000ms
request_timeout: 20000ms
EOF
	cat >"$conf/logback.xml" <<'EOF'
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${cassandra.logdir}/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
EOF
}

# pid prints the node's pid if it runs (a live process started from our
# config, not a recycled pid).
pid() {
	local p
	[ -f "$pidfile" ] || return 1
	p=$(cat "$pidfile")
	[ -n "$p" ] && kill -0 "$p" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "-Dcassandra.config=file://$conf/cassandra.yaml" || return 1
	echo "$p"
}

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

wait_ready() {
	local p=$1 i
	for i in $(seq 1 $((start_timeout * 2))); do
		# The native transport is the last thing a node starts: once it
		# accepts connections the node serves CQL.
		if answers; then
			return 0
		fi
		if ! kill -0 "$p" 2>/dev/null; then
			die "cassandra exited during start-up; last lines of $logs/system.log:$(echo; tail -n 30 "$logs/system.log" 2>/dev/null; tail -n 10 "$logs/stdout.log" 2>/dev/null)"
		fi
		sleep 0.5
	done
	die "cassandra did not answer on 127.0.0.1:$port within ${start_timeout}s; see $logs/system.log"
}

cmd_start() {
	mkdir -p "$dir"
	local p
	if p=$(pid); then
		say "already running (pid $p, $dir)"
		wait_ready "$p"
		return 0
	fi
	ensure_java
	ensure_jars
	write_config
	local jamm
	jamm=$(ls "$lib"/jamm-*.jar | head -n 1) || die "no jamm jar in $lib"
	# setsid: the node outlives this script and the shell that ran it.
	setsid "$java" \
		-Xms"$heap" -Xmx"$heap" -Xss256k -XX:+ExitOnOutOfMemoryError \
		-XX:+UseG1GC -XX:+ParallelRefProcEnabled -XX:MaxTenuringThreshold=1 -XX:G1HeapRegionSize=16m \
		-XX:MaxDirectMemorySize=512m \
		-javaagent:"$jamm" \
		-Djdk.attach.allowAttachSelf=true \
		--add-exports java.base/jdk.internal.misc=ALL-UNNAMED \
		--add-exports java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED \
		--add-exports java.rmi/sun.rmi.registry=ALL-UNNAMED \
		--add-exports java.rmi/sun.rmi.server=ALL-UNNAMED \
		--add-exports java.sql/java.sql=ALL-UNNAMED \
		--add-exports java.base/java.lang.ref=ALL-UNNAMED \
		--add-exports jdk.unsupported/sun.misc=ALL-UNNAMED \
		--add-exports jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED \
		--add-exports jdk.attach/sun.tools.attach=ALL-UNNAMED \
		--add-opens java.base/java.lang.module=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.loader=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.ref=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.reflect=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.math=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.module=ALL-UNNAMED \
		--add-opens java.base/jdk.internal.util.jar=ALL-UNNAMED \
		--add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
		--add-opens java.base/sun.nio.ch=ALL-UNNAMED \
		--add-opens java.base/java.io=ALL-UNNAMED \
		--add-opens java.base/java.lang.reflect=ALL-UNNAMED \
		--add-opens jdk.compiler/com.sun.tools.javac=ALL-UNNAMED \
		--add-opens java.base/java.lang=ALL-UNNAMED \
		--add-opens java.base/java.util=ALL-UNNAMED \
		-Dio.netty.tryReflectionSetAccessible=true \
		-Dio.netty.allocator.useCacheForAllThreads=true \
		-Dio.netty.allocator.maxOrder=11 \
		-Dcassandra.config="file://$conf/cassandra.yaml" \
		-Dcassandra.storagedir="$data" \
		-Dcassandra.logdir="$logs" \
		-Dlogback.configurationFile="file://$conf/logback.xml" \
		-Dcassandra-foreground=yes \
		-Dcassandra.skip_wait_for_gossip_to_settle=0 \
		-Dcassandra.superuser_setup_delay_ms=0 \
		-Dcassandra.test.flush_local_schema_changes=false \
		-cp "$conf:$lib/*" \
		org.apache.cassandra.service.CassandraDaemon \
		</dev/null >"$logs/stdout.log" 2>&1 &
	p=$!
	echo "$p" >"$pidfile"
	say "starting (pid $p, $dir); this takes a while"
	wait_ready "$p"
	say "started on 127.0.0.1:$port"
}

cmd_stop() {
	local p i
	if ! p=$(pid); then
		say "not running"
		return 0
	fi
	kill "$p"
	for i in $(seq 1 60); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$p" 2>/dev/null; then
		say "still running after 30s; killing"
		kill -9 "$p" 2>/dev/null || true
	fi
	rm -f "$pidfile"
	say "stopped"
}

cmd_status() {
	local p
	if p=$(pid) && answers; then
		say "running on 127.0.0.1:$port (pid $p, $dir)"
	else
		say "not running"
		exit 3
	fi
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
url) echo "127.0.0.1:$port" ;;
*)
	echo "usage: $0 start|stop|url|status" >&2
	exit 2
	;;
esac
