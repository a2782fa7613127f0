#!/usr/bin/env bash
# Install the Debian packages the build needs, only those that are missing.
# Safe to run again: it does nothing when everything is present.
set -euo pipefail

need=()
# fiu-utils/libfiu-dev: libfiu's fiu-run and its POSIX preload, which inject I/O errors into the
# system calls of the fault-injection tests (tests/faults/test_io_faults.py).
for pkg in libclang-dev clang build-essential pkg-config fiu-utils libfiu-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# The Kafka tests run an Apache Kafka broker from Maven Central jars (scripts/kafka-broker.sh): Java 17+ and Maven.
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
# The Kafka Streams application of the interoperability tests (interop/kafka-streams) is compiled: a JDK.
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need+=(maven)
if ((${#need[@]})); then
    echo "setup: installing Debian packages: ${need[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo (Rust toolchain) is required but not on PATH" >&2; exit 1; }
command -v python3 >/dev/null || { echo "setup: python3 (>= 3.11) is required" >&2; exit 1; }
