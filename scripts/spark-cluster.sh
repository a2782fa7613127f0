#!/usr/bin/env bash
# A standalone Spark cluster on 127.0.0.1 from the pyspark package itself: one master and N workers (default 2),
# each worker a separate JVM with 1 core, its own memory limit, work and local directories.
#
#   scripts/spark-cluster.sh start DIR [WORKERS]   start it, wait until every worker registered, print
#                                                  master=spark://127.0.0.1:PORT webui=http://127.0.0.1:PORT workers=N pids=P,P,P
#   scripts/spark-cluster.sh stop DIR              stop every process it started (SIGTERM, then SIGKILL)
#
# PYTHON (default: python3 on PATH) is the interpreter whose pyspark is used; executors run
# spark.pyspark.python, which the driver sets (statestore.restore.spark.spark_session does). Memory per worker:
# SPARK_WORKER_MEMORY (default 1g); daemon heaps: SPARK_DAEMON_MEMORY (default 256m). WORKER<i>_ENV
# (NAME=VALUE words) adds environment to worker i and its executors only, e.g. a host set up differently.
set -euo pipefail

PYTHON=${PYTHON:-python3}
START_TIMEOUT=${SPARK_START_TIMEOUT:-120}
STOP_TIMEOUT=${SPARK_STOP_TIMEOUT:-20}
export SPARK_DAEMON_MEMORY=${SPARK_DAEMON_MEMORY:-256m}
WORKER_MEMORY=${SPARK_WORKER_MEMORY:-1g}

die() { echo "spark-cluster.sh: $*" >&2; exit 1; }

spark_home() {
  "$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null \
    || die "$PYTHON has no pyspark (pip install 'statestore[spark]')"
}

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

alive_workers() {  # alive_workers WEBUI_PORT: how many workers the master lists as ALIVE
  "$PYTHON" - "$1" <<'PY' 2>/dev/null || echo 0
import json, sys, urllib.request
doc = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/json/", timeout=2))
print(sum(1 for w in doc.get("workers", []) if w.get("state") == "ALIVE"))
PY
}

cmd_start() {
  local dir=${1:?usage: spark-cluster.sh start DIR [WORKERS]} workers=${2:-2}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ ! -f "$dir/pids" ] || die "$dir already runs a cluster (stop it first)"
  command -v java >/dev/null || die "java is not installed (a Java 17 JDK)"
  local home; home=$(spark_home)
  export SPARK_HOME=$home SPARK_LOG_DIR=$dir/logs SPARK_NO_DAEMONIZE=1 SPARK_LOCAL_IP=127.0.0.1
  mkdir -p "$dir/logs"
  local port webui pids=()
  port=$(free_port); webui=$(free_port)
  nohup "$home/bin/spark-class" org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$port" \
    --webui-port "$webui" >"$dir/logs/master.out" 2>&1 </dev/null &
  pids+=($!)
  local i
  for i in $(seq 1 "$workers"); do
    mkdir -p "$dir/worker$i/work" "$dir/worker$i/local"
    local extra="WORKER${i}_ENV"
    # shellcheck disable=SC2086  # WORKERi_ENV is a list of NAME=VALUE words
    env ${!extra:-} SPARK_LOCAL_DIRS="$dir/worker$i/local" nohup "$home/bin/spark-class" org.apache.spark.deploy.worker.Worker \
      --host 127.0.0.1 --cores 1 --memory "$WORKER_MEMORY" --work-dir "$dir/worker$i/work" \
      --webui-port "$(free_port)" "spark://127.0.0.1:$port" >"$dir/logs/worker$i.out" 2>&1 </dev/null &
    pids+=($!)
  done
  (IFS=,; echo "${pids[*]}") >"$dir/pids"
  local deadline=$((SECONDS + START_TIMEOUT)) n=0
  while [ $SECONDS -lt $deadline ]; do
    n=$(alive_workers "$webui")
    [ "$n" -ge "$workers" ] && break
    for p in "${pids[@]}"; do
      kill -0 "$p" 2>/dev/null || { tail -20 "$dir"/logs/*.out >&2; cmd_stop "$dir"; die "a cluster process exited during start"; }
    done
    sleep 0.5
  done
  if [ "$n" -lt "$workers" ]; then
    tail -20 "$dir"/logs/*.out >&2
    cmd_stop "$dir"
    die "only $n of $workers workers registered within ${START_TIMEOUT}s"
  fi
  echo "spark://127.0.0.1:$port" >"$dir/master"
  echo "master=spark://127.0.0.1:$port webui=http://127.0.0.1:$webui workers=$workers pids=$(cat "$dir/pids")"
}

cmd_stop() {
  local dir=${1:?usage: spark-cluster.sh stop DIR} p
  [ -f "$dir/pids" ] || return 0
  local pids; IFS=, read -r -a pids <"$dir/pids"
  for p in "${pids[@]}"; do
    pkill -TERM -P "$p" 2>/dev/null || true
    kill -TERM "$p" 2>/dev/null || true
  done
  local deadline=$((SECONDS + STOP_TIMEOUT))
  for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -f "$dir/pids" "$dir/master"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) echo "usage: $0 start DIR [WORKERS] | stop DIR" >&2; exit 2 ;;
esac
