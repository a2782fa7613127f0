#!/usr/bin/env bash
# The Kafka Streams 4.4.0 application of interop/kafka-streams (Java 17), built once and cached outside the clone.
#
#   scripts/kafka-streams-app.sh build          build it if needed; print the directory holding app.jar and libs/
#   scripts/kafka-streams-app.sh classpath      its classpath (building it if needed)
#   scripts/kafka-streams-app.sh run ARGS...    run statestore.interop.StreamsApp with ARGS (see its javadoc)
#
# KAFKA_STREAMS_VERSION (default: the pom's, 4.4.0) builds and runs it against another Kafka Streams, e.g. 3.9.0 or
# 4.2.0 for the .checkpoint layout; before 4.3 the sources using 4.3+ APIs (SINCE_4_3 below) are left out, and
# HeadersChoices.java reaches them by name.
#
# The build goes to $STATESTORE_CACHE/kafka-streams-app/<hash of pom.xml and sources> (default cache
# ~/.cache/statestore; kafka-streams-app-<version>/ for another version): `mvn package` for app.jar and
# `mvn dependency:copy-dependencies` for its runtime jars, in a temporary directory renamed into place only when
# complete, so an interrupted build is redone, never half-used, and a changed source builds a new directory.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${STATESTORE_CACHE:-$HOME/.cache/statestore}
MODULE=$HERE/interop/kafka-streams
HEAP=${KSTREAMS_HEAP_OPTS:-"-Xms256m -Xmx1g"}
POM_VERSION=4.4.0
VERSION=${KAFKA_STREAMS_VERSION:-$POM_VERSION}
SINCE_4_3=(HeadersTopologies.java)

die() { echo "kafka-streams-app.sh: $*" >&2; exit 1; }

hash_sources() {
  (cd "$MODULE" && find pom.xml src -type f | LC_ALL=C sort | xargs sha256sum) | sha256sum | cut -c1-16
}

build() {
  local dest tmp lock name
  grep -q "<version>$POM_VERSION</version>" "$MODULE/pom.xml" || die "pom.xml no longer asks for Kafka Streams $POM_VERSION"
  name=kafka-streams-app
  [ "$VERSION" = "$POM_VERSION" ] || name=kafka-streams-app-$VERSION
  dest=$CACHE/$name/$(hash_sources)
  if [ -f "$dest/.complete" ] && [ -f "$dest/app.jar" ]; then echo "$dest"; return 0; fi
  command -v mvn >/dev/null || die "mvn is not installed (apt-get install maven)"
  command -v javac >/dev/null || die "javac is not installed (a Java 17 JDK)"
  mkdir -p "$CACHE/$name"
  # One build at a time, of any version (parallel test workers may ask at once, and Maven's local
  # repository is not safe for concurrent downloads); the others then find it done.
  exec {lock}>"$CACHE/.kafka-streams-app-build.lock"
  flock "$lock"
  if [ -f "$dest/.complete" ] && [ -f "$dest/app.jar" ]; then echo "$dest"; return 0; fi
  tmp=$(mktemp -d "$CACHE/$name/.building-XXXXXX")
  echo "kafka-streams-app.sh: building $MODULE against Kafka Streams $VERSION into $dest (once)" >&2
  cp -r "$MODULE/pom.xml" "$MODULE/src" "$tmp/"
  if [ "$VERSION" != "$POM_VERSION" ]; then
    sed -i "0,/<version>$POM_VERSION<\/version>/s//<version>$VERSION<\/version>/" "$tmp/pom.xml"
    if [ "$(printf '%s\n' 4.3 "$VERSION" | sort -V | head -1)" != 4.3 ]; then
      for f in "${SINCE_4_3[@]}"; do find "$tmp/src" -name "$f" -delete; done
    fi
  fi
  if ! (cd "$tmp" && mvn -q -B package -DskipTests \
          && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/libs") \
        >"$tmp/mvn.log" 2>&1; then
    cat "$tmp/mvn.log" >&2
    rm -rf "$tmp"
    die "could not build $MODULE (see the Maven output above)"
  fi
  cp "$tmp/target/kafka-streams-app-1.jar" "$tmp/app.jar"
  rm -rf "$tmp/target" "$tmp/src"
  touch "$tmp/.complete"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  echo "$dest"
}

case "${1:-}" in
  build) build ;;
  classpath) d=$(build); echo "$d/app.jar:$d/libs/*" ;;
  run)
    shift
    d=$(build)
    # shellcheck disable=SC2086
    exec java $HEAP -XX:+UseG1GC -Djava.awt.headless=true -cp "$d/app.jar:$d/libs/*" statestore.interop.StreamsApp "$@"
    ;;
  *) echo "usage: $0 build | classpath | run ARGS..." >&2; exit 2 ;;
esac
