#!/usr/bin/env bash
# A 3-node Apache Kafka 4.4.0 cluster on 127.0.0.1 (KRaft, every node a broker and a controller: a quorum of 3),
# from the jars scripts/kafka-broker.sh resolves, for the fault tests (tests/changelog/kafka_cluster) and people.
#
#   scripts/kafka-cluster.sh start DIR [--nodes N] [key=value ...]
#                     format DIR/node1..N (first start only), start every node that is not running, wait until
#                     each client port accepts (a broker opens it once the quorum has unfenced it), print
#                     bootstrap=127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 log_dirs=D1,D2,D3 pids=PID1,PID2,PID3
#   scripts/kafka-cluster.sh stop DIR         SIGCONT (a paused node cannot stop) and SIGTERM every node at once,
#                                             SIGKILL after $KAFKA_STOP_TIMEOUT s (20)
#   scripts/kafka-cluster.sh kill DIR ID      SIGKILL node ID (1..N) and wait until it is gone, as a crash would
#   scripts/kafka-cluster.sh pause DIR ID     SIGSTOP node ID: alive, holding its connections, answering nothing
#   scripts/kafka-cluster.sh resume DIR ID    SIGCONT node ID
#   scripts/kafka-cluster.sh restart DIR ID   stop node ID cleanly (SIGTERM: a controlled shutdown moves its leaders
#                                             away) if it runs, start it again on its ports and log dir, wait for it
#   scripts/kafka-cluster.sh status DIR       the start line; a node that is not running has pid -
#
# `scripts/kafka-broker.sh start DIR --nodes 3` comes here too. The cluster: replication factor 3 by default and for
# the internal topics (offsets, transactions, share state), min.insync.replicas=2 (the transaction log's too),
# broker.session.timeout.ms=4000 with heartbeats every 500 ms, so a dead or paused broker is fenced and its partitions
# get new leaders within about 5 s. Extra key=value arguments are properties for every node (@NODE@ stands for the
# node's id, @PORT@ for its client port). Each node runs with $KAFKA_CLUSTER_HEAP_OPTS (-Xms64m -Xmx256m), the serial
# collector and the C1 compiler only, and few threads: 190-210 MiB resident per node through the fault tests.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/kafka-broker.sh
source "$HERE/scripts/kafka-broker.sh"
CLUSTER_HEAP=${KAFKA_CLUSTER_HEAP_OPTS:-"-Xms64m -Xmx256m"}
CLUSTER_JVM=${KAFKA_CLUSTER_JVM_OPTS:-"-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=64m -Xss512k"}

cprop() { prop "$1/cluster.properties" "$2"; }  # cprop DIR KEY

nth() { echo "$1" | cut -d, -f"$2"; }  # nth CSV I (1-based)

node_dir() {  # node_dir DIR ID: DIR/nodeID, after checking ID
  local dir=$1 id=${2:?a node id is needed} n
  n=$(cprop "$dir" nodes)
  [[ $id =~ ^[0-9]+$ ]] && [ "$id" -ge 1 ] && [ "$id" -le "$n" ] || die "no node $id in $dir (nodes 1..$n)"
  echo "$dir/node$id"
}

write_node_config() {  # write_node_config DIR ID [extra...]
  local dir=$1 id=$2; shift 2
  local n nd port cport voters="" i rf isr
  n=$(cprop "$dir" nodes); nd=$dir/node$id
  port=$(nth "$(cprop "$dir" ports)" "$id"); cport=$(nth "$(cprop "$dir" controller_ports)" "$id")
  for ((i = 1; i <= n; i++)); do
    voters+="${voters:+,}$i@127.0.0.1:$(nth "$(cprop "$dir" controller_ports)" "$i")"
  done
  rf=$((n < 3 ? n : 3)); isr=$((n < 2 ? n : 2))
  mkdir -p "$nd"
  cat >"$nd/server.properties" <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$nd/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
broker.session.timeout.ms=4000
broker.heartbeat.interval.ms=500
replica.lag.time.max.ms=10000
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
background.threads=2
num.replica.fetchers=1
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=16777216
log.cleaner.backoff.ms=1000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.remove.expired.transaction.cleanup.interval.ms=10000
EOF
  local kv
  for kv in "$@"; do
    [[ $kv == *=* ]] || die "not a key=value property: $kv"
    kv=${kv//@NODE@/$id}; kv=${kv//@PORT@/$port}
    sed -i "/^${kv%%=*}=/d" "$nd/server.properties"  # a later line wins
    echo "$kv" >>"$nd/server.properties"
  done
  write_log4j "$nd"
}

launch_node() {  # launch_node DIR ID: start the JVM of node ID in the background
  local nd=$1/node$2 pid
  # shellcheck disable=SC2086
  nohup java $CLUSTER_HEAP $CLUSTER_JVM -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$nd/log4j2.properties" -Dkafka.logs.dir="$nd" \
    -cp "$LIBS/*" kafka.Kafka "$nd/server.properties" >"$nd/broker.out" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$nd/broker.pid"
}

status_line() {  # the start line of DIR
  local dir=$1 n i bs="" dirs="" pids="" pid
  n=$(cprop "$dir" nodes)
  for ((i = 1; i <= n; i++)); do
    bs+="${bs:+,}127.0.0.1:$(nth "$(cprop "$dir" ports)" "$i")"
    dirs+="${dirs:+,}$dir/node$i/data"
    pid=$(running_pid "$dir/node$i") || pid=-
    pids+="${pids:+,}$pid"
  done
  echo "bootstrap=$bs log_dirs=$dirs pids=$pids"
}

start_nodes() {  # start_nodes DIR ID...: launch those not running, wait for all; 1 if one exited, 2 on a timeout
  local dir=$1 id rc; shift
  for id in "$@"; do running_pid "$dir/node$id" >/dev/null || launch_node "$dir" "$id"; done
  for id in "$@"; do
    rc=0
    wait_ready "$dir/node$id" "$(cat "$dir/node$id/broker.pid")" "$(nth "$(cprop "$dir" ports)" "$id")" || rc=$?
    if [ $rc != 0 ]; then echo "$id"; return $rc; fi
  done
}

node_failed() {  # node_failed DIR ID RC: report a node that did not come up, and give up
  local nd=$1/node$2
  tail -20 "$nd/broker.out" "$nd/broker.log" >&2 2>/dev/null || true
  if [ "$3" = 2 ]; then die "node $2 in $1 did not accept connections within ${START_TIMEOUT}s (logs: $nd)"; fi
  die "node $2 in $1 exited during start (logs: $nd/broker.out, $nd/broker.log)"
}

cmd_cluster_start() {
  local dir=${1:?usage: kafka-cluster.sh start DIR [--nodes N] [key=value ...]}; shift
  local n=3
  if [ "${1:-}" = --nodes ]; then n=${2:?--nodes needs a number}; shift 2; fi
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 9 ] || die "--nodes must be 1..9, not $n"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  resolve "$HERE/interop/kafka-broker" "$LIBS"
  local ids i failed rc
  if [ -f "$dir/cluster.properties" ]; then
    [ $# -eq 0 ] || die "$dir is already formatted: its properties are in $dir/node*/server.properties"
    [ "$(cprop "$dir" nodes)" = "$n" ] || die "$dir holds a cluster of $(cprop "$dir" nodes) nodes, not $n"
    mapfile -t ids < <(seq 1 "$n")
    rc=0; failed=$(start_nodes "$dir" "${ids[@]}") || rc=$?
    [ $rc = 0 ] || node_failed "$dir" "$failed" $rc
    status_line "$dir"
    return 0
  fi
  local attempt ports cports cluster_id p
  mapfile -t ids < <(seq 1 "$n")
  for attempt in 1 2 3 4 5; do
    ports=""; cports=""
    for ((i = 1; i <= 2 * n; i++)); do
      p=$(free_port)
      if ((i <= n)); then ports+="${ports:+,}$p"; else cports+="${cports:+,}$p"; fi
    done
    [ "$(echo "$ports,$cports" | tr , '\n' | sort -u | wc -l)" = $((2 * n)) ] || continue
    cluster_id=$(python3 -c 'import base64,uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    if "-" not in s: print(s); break')
    printf 'nodes=%s\nports=%s\ncontroller_ports=%s\ncluster_id=%s\n' "$n" "$ports" "$cports" "$cluster_id" \
      >"$dir/cluster.properties.new"
    mv "$dir/cluster.properties.new" "$dir/cluster.properties"
    local fpids=()
    for i in "${ids[@]}"; do
      write_node_config "$dir" "$i" "$@"
      java -Xmx128m -XX:TieredStopAtLevel=1 -cp "$LIBS/*" kafka.tools.StorageTool format --ignore-formatted \
        -t "$cluster_id" -c "$dir/node$i/server.properties" >"$dir/node$i/format.log" 2>&1 &
      fpids+=($!)
    done
    for i in "${ids[@]}"; do
      wait "${fpids[$((i - 1))]}" || { cat "$dir/node$i/format.log" >&2; rm -f "$dir/cluster.properties";
                                       die "formatting $dir/node$i/data failed"; }
    done
    rc=0; failed=$(start_nodes "$dir" "${ids[@]}") || rc=$?
    if [ $rc = 0 ]; then
      status_line "$dir"
      return 0
    fi
    if [ $rc = 1 ] && grep -qi "address already in use" "$dir/node$failed/broker.out" "$dir/node$failed/broker.log" \
        2>/dev/null; then
      echo "kafka-cluster.sh: a port of node $failed was taken, retrying with others" >&2
      cmd_cluster_stop "$dir"
      for i in "${ids[@]}"; do rm -rf "$dir/node$i"; done
      rm -f "$dir/cluster.properties"
      continue
    fi
    cmd_cluster_stop "$dir"
    node_failed "$dir" "$failed" $rc
  done
  die "no free ports after 5 attempts"
}

cmd_cluster_stop() {
  local dir=${1:?usage: kafka-cluster.sh stop DIR} n i pid pids=()
  [ -f "$dir/cluster.properties" ] || return 0
  n=$(cprop "$dir" nodes)
  for ((i = 1; i <= n; i++)); do
    if pid=$(running_pid "$dir/node$i"); then
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  local deadline=$((SECONDS + STOP_TIMEOUT))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "kafka-cluster.sh: node process $pid did not stop within ${STOP_TIMEOUT}s, killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  for pid in "${pids[@]}"; do while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done; done
  for ((i = 1; i <= n; i++)); do running_pid "$dir/node$i" >/dev/null || rm -f "$dir/node$i/broker.pid"; done
}

cmd_signal() {  # cmd_signal SIGNAL DIR ID
  local sig=$1 dir=${2:?usage: kafka-cluster.sh kill|pause|resume DIR ID} nd pid
  nd=$(node_dir "$dir" "${3:-}")
  pid=$(running_pid "$nd") || die "node $3 in $dir is not running"
  kill "-$sig" "$pid"
  if [ "$sig" = KILL ]; then
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$nd/broker.pid"
  fi
}

cmd_restart() {
  local dir=${1:?usage: kafka-cluster.sh restart DIR ID} nd rc=0 failed
  dir=$(cd "$dir" && pwd)
  nd=$(node_dir "$dir" "${2:-}")
  if pid=$(running_pid "$nd"); then kill -CONT "$pid" 2>/dev/null || true; fi
  cmd_stop "$nd"
  failed=$(start_nodes "$dir" "$2") || rc=$?
  [ $rc = 0 ] || node_failed "$dir" "$failed" $rc
  status_line "$dir"
}

case "${1:-}" in
  start) shift; cmd_cluster_start "$@" ;;
  stop) shift; cmd_cluster_stop "$@" ;;
  kill) shift; cmd_signal KILL "$@" ;;
  pause) shift; cmd_signal STOP "$@" ;;
  resume) shift; cmd_signal CONT "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  status)
    shift
    [ -f "${1:?usage: kafka-cluster.sh status DIR}/cluster.properties" ] || die "no cluster in $1"
    status_line "$(cd "$1" && pwd)" ;;
  *) echo "usage: $0 start DIR [--nodes N] [key=value ...] | stop DIR | kill|pause|resume|restart DIR ID | status DIR" >&2
     exit 2 ;;
esac
