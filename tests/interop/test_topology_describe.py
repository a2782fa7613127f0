"""``--topology`` reads what Kafka Streams itself prints: ``Topology.describe()`` of the interop build's jars.

A small Java program builds a topology with every kind of store the DSL and
the Processor API make (a plain store, a ``count()``, a ``groupBy`` count in
sub-topology 1, tumbling and session windowed counts, a versioned table, a
stream-stream join, a global table) against the Kafka Streams jars of
``interop/kafka-streams`` and prints its description; statestore must find
every store in its sub-topology, with the global one apart.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from statestore.state.topology import parse_topology

ROOT = Path(__file__).resolve().parents[2]

DESCRIBE = """
import java.time.Duration;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.*;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.*;

public class Describe {
    public static void main(String[] args) {
        StreamsBuilder b = new StreamsBuilder();
        b.addStateStore(Stores.keyValueStoreBuilder(
            Stores.persistentKeyValueStore("latest"), Serdes.String(), Serdes.String()));
        KStream<String, String> in = b.stream("input", Consumed.with(Serdes.String(), Serdes.String()));
        in.process(() -> new Processor<String, String, Void, Void>() {
            public void process(Record<String, String> r) {}
        }, "latest");
        in.groupByKey().count(Materialized.as("counts"));
        in.groupBy((k, v) -> v).count();
        in.groupByKey().windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMinutes(5)))
            .count(Materialized.as("tumbling"));
        in.groupByKey().windowedBy(SessionWindows.ofInactivityGapWithNoGrace(Duration.ofMinutes(5)))
            .count(Materialized.as("sessions"));
        b.table("table-input", Materialized.as(Stores.persistentVersionedKeyValueStore(
            "versioned", Duration.ofHours(1))));
        in.join(b.stream("other", Consumed.with(Serdes.String(), Serdes.String())), (x, y) -> x + y,
            JoinWindows.ofTimeDifferenceWithNoGrace(Duration.ofMinutes(1)),
            StreamJoined.with(Serdes.String(), Serdes.String(), Serdes.String()).withStoreName("joined"));
        b.globalTable("global-input", Materialized.as("global"));
        System.out.print(b.build().describe());
    }
}
"""


def test_every_store_of_a_real_description_is_found(tmp_path: Path) -> None:
    if shutil.which("javac") is None or shutil.which("mvn") is None:
        pytest.skip("needs a JDK and Maven")
    classpath = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kafka-streams-app.sh"), "classpath"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=True,
    ).stdout.strip()
    (tmp_path / "Describe.java").write_text(DESCRIBE)
    subprocess.run(["javac", "-cp", classpath, "Describe.java"], cwd=tmp_path, check=True, timeout=300)
    text = subprocess.run(
        ["java", "-cp", f"{classpath}:{tmp_path}", "Describe"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    topology = parse_topology(text)
    subs = {name: s.subtopology for name, s in topology.task_stores.items()}
    assert {name: subs[name] for name in ("latest", "counts", "tumbling", "sessions")} == dict.fromkeys(
        ("latest", "counts", "tumbling", "sessions"), 0
    ), text
    grouped = [name for name in subs if name.startswith("KSTREAM-AGGREGATE-STATE-STORE-")]
    assert len(grouped) == 1 and subs[grouped[0]] == 1, text
    assert (
        subs["versioned"] >= 0 and "joined-this-join-store" in subs and "joined-other-join-store" in subs
    ), text
    assert topology.stores["global"].is_global and "global" not in subs
