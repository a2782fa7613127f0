#!/usr/bin/env bash
# A single-node Apache Kafka 4.4.0 broker (KRaft combined mode: broker + controller) on 127.0.0.1,
# from Maven Central jars, for the tests, the benchmarks and people.
#
#   scripts/kafka-broker.sh start DIR [key=value ...]   format DIR (first start only), start the broker in the
#                                                       background, wait until its client port accepts, print
#                                                       bootstrap=127.0.0.1:PORT log_dir=DIR/data pid=PID
#   scripts/kafka-broker.sh stop DIR                    SIGTERM, then SIGKILL after $KAFKA_STOP_TIMEOUT s (20)
#   scripts/kafka-broker.sh classpath                   the broker's classpath (resolving the jars if needed)
#   scripts/kafka-broker.sh tools-classpath             Kafka's tools (DumpLogSegments), 4.3.1 jars
#   scripts/kafka-broker.sh start DIR --nodes N [...]   a cluster of N nodes instead (scripts/kafka-cluster.sh, which
#                                                       also stops one: `stop DIR` on a cluster's DIR goes there)
#
# Extra key=value arguments are broker properties (e.g. listeners for SSL; in values, @PORT@ and @CPORT@ stand for
# the PLAINTEXT client and controller ports, @PORT1@..@PORT4@ for four more free ports); they are kept in DIR/server.properties,
# so a restart on the same DIR (after a stop or a SIGKILL) runs the same broker on the same ports and log dir.
# A port taken by someone else between picking and binding makes the broker exit: the first start then retries
# with other ports.
#
# The jars are resolved once with `mvn dependency:copy-dependencies` from interop/kafka-broker/pom.xml into
# $STATESTORE_CACHE/kafka-4.4.0 (default ~/.cache/statestore), through a temporary directory that is renamed into
# place only when complete, so an interrupted or corrupt download is re-resolved rather than half-used.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${STATESTORE_CACHE:-$HOME/.cache/statestore}
KAFKA_VERSION=4.4.0
LIBS=$CACHE/kafka-$KAFKA_VERSION/libs
TOOLS_LIBS=$CACHE/kafka-tools-4.3.1/libs
HEAP=${KAFKA_HEAP_OPTS:-"-Xms128m -Xmx512m"}
START_TIMEOUT=${KAFKA_START_TIMEOUT:-90}
STOP_TIMEOUT=${KAFKA_STOP_TIMEOUT:-20}

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# resolve POM_DIR DEST: copy the runtime dependencies of POM_DIR/pom.xml into DEST, atomically.
resolve() {
  local pom_dir=$1 dest=$2 marker=$2/.complete
  if [ -f "$marker" ] && jars_ok "$dest"; then return 0; fi
  command -v mvn >/dev/null || die "mvn is not installed (apt-get install maven)"
  command -v java >/dev/null || die "java is not installed (a Java 17 JDK)"
  local parent tmp lock
  parent=$(dirname "$dest")
  mkdir -p "$parent"
  # One resolver at a time (parallel test workers start brokers at once); the others then find it done.
  exec {lock}>"$parent/.resolve.lock"
  flock "$lock"
  if [ -f "$marker" ] && jars_ok "$dest"; then exec {lock}>&-; return 0; fi
  tmp=$(mktemp -d "$parent/.resolving-XXXXXX")
  echo "kafka-broker.sh: resolving $(basename "$pom_dir") jars into $dest (once)" >&2
  if ! mvn -q -B -f "$pom_dir/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$tmp/libs" >"$tmp/mvn.log" 2>&1; then
    cat "$tmp/mvn.log" >&2
    rm -rf "$tmp"
    die "could not resolve the jars of $pom_dir/pom.xml (see the Maven output above)"
  fi
  jars_ok "$tmp/libs" || { rm -rf "$tmp"; die "the resolved jars in $tmp/libs are not readable zip files"; }
  (cd "$tmp/libs" && ls -1 ./*.jar | sort) >"$tmp/libs/.complete"
  rm -rf "$dest.old"
  [ -e "$dest" ] && mv "$dest" "$dest.old"
  mv "$tmp/libs" "$dest"
  rm -rf "$tmp" "$dest.old"
  exec {lock}>&-
}

# jars_ok DIR: every jar listed in DIR/.complete (or present) exists and has a zip end record.
jars_ok() {
  local dir=$1 jar
  [ -d "$dir" ] || return 1
  if [ -f "$dir/.complete" ]; then
    while read -r jar; do [ -f "$dir/$jar" ] || return 1; done <"$dir/.complete"
  fi
  python3 - "$dir" <<'PY' || return 1
import sys, zipfile, pathlib
jars = list(pathlib.Path(sys.argv[1]).glob("*.jar"))
sys.exit(0 if jars and all(zipfile.is_zipfile(j) for j in jars) else 1)
PY
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

prop() {  # prop FILE KEY: the value of KEY in a properties file
  sed -n "s/^$2=//p" "$1" | tail -1
}

write_config() {  # write_config DIR PORT CPORT [extra...]
  local dir=$1 port=$2 cport=$3; shift 3
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=16777216
log.cleaner.backoff.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.remove.expired.transaction.cleanup.interval.ms=10000
EOF
  local kv p1 p2 p3 p4
  p1=$(free_port); p2=$(free_port); p3=$(free_port); p4=$(free_port)
  for kv in "$@"; do
    [[ $kv == *=* ]] || die "not a key=value property: $kv"
    # Placeholders for listeners of other security protocols: the client and controller ports, and four more.
    kv=${kv//@PORT@/$port}; kv=${kv//@CPORT@/$cport}; kv=${kv//@PORT1@/$p1}; kv=${kv//@PORT2@/$p2}; kv=${kv//@PORT3@/$p3}
    kv=${kv//@PORT4@/$p4}
    # a later line wins: drop an earlier one of the same key
    sed -i "/^${kv%%=*}=/d" "$dir/server.properties"
    echo "$kv" >>"$dir/server.properties"
  done
  write_log4j "$dir"
}

write_log4j() {  # write_log4j DIR: the broker logs warnings (and its start) to DIR/broker.log
  cat >"$1/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $1/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
EOF
}

running_pid() {  # the pid in DIR/broker.pid if that process is a live broker
  local f=$1/broker.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  grep -q "kafka.Kafka" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

wait_ready() {  # wait_ready DIR PID PORT: 0 once the client port accepts, 1 if the broker died, 2 on timeout
  local dir=$1 pid=$2 port=$3 deadline=$((SECONDS + START_TIMEOUT))
  while [ $SECONDS -lt $deadline ]; do
    kill -0 "$pid" 2>/dev/null || return 1
    if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 1).close()" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  return 2
}

cmd_start() {
  local dir=${1:?usage: kafka-broker.sh start DIR [key=value ...]}; shift
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  resolve "$HERE/interop/kafka-broker" "$LIBS"
  local pid
  if pid=$(running_pid "$dir"); then
    local port; port=$(prop "$dir/server.properties" listeners | sed -n 's/.*PLAINTEXT:\/\/127.0.0.1:\([0-9]*\).*/\1/p')
    echo "bootstrap=127.0.0.1:$port log_dir=$dir/data pid=$pid"
    return 0
  fi
  local attempt first=1 port cport
  [ -f "$dir/data/meta.properties" ] && first=0
  for attempt in 1 2 3 4 5; do
    if [ $first = 1 ]; then
      port=$(free_port); cport=$(free_port)
      [ "$port" != "$cport" ] || continue
      write_config "$dir" "$port" "$cport" "$@"
      java -cp "$LIBS/*" kafka.tools.StorageTool format --ignore-formatted \
        -t "$(python3 -c 'import base64,uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    if "-" not in s: print(s); break')" -c "$dir/server.properties" >"$dir/format.log" 2>&1 \
        || { cat "$dir/format.log" >&2; die "formatting $dir/data failed"; }
    else
      [ $# -eq 0 ] || die "$dir is already formatted: its properties are in $dir/server.properties"
      port=$(prop "$dir/server.properties" listeners | sed -n 's/.*PLAINTEXT:\/\/127.0.0.1:\([0-9]*\).*/\1/p')
    fi
    # shellcheck disable=SC2086
    nohup java $HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
      -Dlog4j2.configurationFile="$dir/log4j2.properties" -Dkafka.logs.dir="$dir" \
      -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" >"$dir/broker.out" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$dir/broker.pid"
    local rc=0
    wait_ready "$dir" "$pid" "$port" || rc=$?
    if [ $rc = 0 ]; then
      echo "bootstrap=127.0.0.1:$port log_dir=$dir/data pid=$pid"
      return 0
    fi
    if [ $rc = 2 ]; then
      kill -KILL "$pid" 2>/dev/null || true
      tail -20 "$dir/broker.out" "$dir/broker.log" >&2 2>/dev/null || true
      die "the broker in $dir did not accept connections on 127.0.0.1:$port within ${START_TIMEOUT}s"
    fi
    if grep -qi "address already in use" "$dir/broker.out" "$dir/broker.log" 2>/dev/null && [ $first = 1 ]; then
      echo "kafka-broker.sh: port $port or $cport was taken, retrying with others" >&2
      rm -rf "$dir/data"
      continue
    fi
    tail -20 "$dir/broker.out" "$dir/broker.log" >&2 2>/dev/null || true
    die "the broker in $dir exited during start (logs: $dir/broker.out, $dir/broker.log)"
  done
  die "no free ports after 5 attempts"
}

cmd_stop() {
  local dir=${1:?usage: kafka-broker.sh stop DIR} pid
  pid=$(running_pid "$dir") || { rm -f "$dir/broker.pid"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "kafka-broker.sh: broker $pid did not stop within ${STOP_TIMEOUT}s, killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$dir/broker.pid"
}

# scripts/kafka-cluster.sh sources this file for the functions above.
[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0

case "${1:-}" in
  start)
    shift
    if [ "${2:-}" = --nodes ]; then exec bash "$HERE/scripts/kafka-cluster.sh" start "$@"; fi
    cmd_start "$@" ;;
  stop)
    shift
    if [ -f "${1:-}/cluster.properties" ]; then exec bash "$HERE/scripts/kafka-cluster.sh" stop "$@"; fi
    cmd_stop "$@" ;;
  classpath) resolve "$HERE/interop/kafka-broker" "$LIBS"; echo "$LIBS/*" ;;
  tools-classpath) resolve "$HERE/interop/kafka-tools" "$TOOLS_LIBS"; echo "$TOOLS_LIBS/*" ;;
  *) echo "usage: $0 start DIR [key=value ...] | stop DIR | classpath | tools-classpath" >&2; exit 2 ;;
esac
