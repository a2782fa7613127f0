"""The ``.checkpoint`` layout (``restore --kafka-streams-version 3.9``) opens in Kafka Streams 3.9's RocksDB.

Kafka Streams 3.6 - 3.9 run rocksdbjni 7.9.2 and open a store with exactly
its column families (``default``, and ``keyValueWithTimestamp`` for a
timestamped store). A small Java program does that on stores statestore
restored for 3.9: it reads every entry, writes one and compacts (so the
files are read and rewritten by that RocksDB). The 4.3+ layout is refused
by it, as Kafka Streams 3.9 would refuse it. Needs Java and Maven (the jar
comes with the interop application's build against Kafka Streams 3.9.0).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statestore import SegmentLog
from support import kstreams_app

ROCKSDBJNI_JAR = "rocksdbjni-7.9.2.jar"
APP = "shop"
STORES = {"latest": "plain", "counts": "timestamped"}

OPEN_STORE = """
import java.util.*;
import org.rocksdb.*;

public class OpenStore {
    public static void main(String[] args) throws Exception {
        RocksDB.loadLibrary();
        List<ColumnFamilyDescriptor> families = new ArrayList<>();
        families.add(new ColumnFamilyDescriptor(RocksDB.DEFAULT_COLUMN_FAMILY));
        for (int i = 1; i < args.length; i++) families.add(new ColumnFamilyDescriptor(args[i].getBytes()));
        List<ColumnFamilyHandle> handles = new ArrayList<>();
        try (DBOptions options = new DBOptions(); RocksDB db = RocksDB.open(options, args[0], families, handles)) {
            ColumnFamilyHandle data = handles.get(handles.size() - 1);
            long entries = 0;
            try (RocksIterator it = db.newIterator(data)) {
                for (it.seekToFirst(); it.isValid(); it.next()) entries++;
            }
            db.put(data, "written-by-7.9".getBytes(), "x".getBytes());
            db.compactRange(data);
            System.out.println("OPENED entries=" + entries + " rocksdb=" + RocksDB.rocksdbVersion());
        } catch (RocksDBException e) {
            System.out.println("REFUSED " + e.getMessage());
        }
    }
}
"""


@pytest.fixture(scope="module")
def classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """rocksdbjni 7.9.2, the jar Kafka Streams 3.9 runs (from the interop application's build against
    it: one Maven run, serialized with the others), and the compiled program."""
    if shutil.which("javac") is None:
        kstreams_app.cannot_build("needs a JDK 17")
    jar = kstreams_app.built("3.9.0") / "libs" / ROCKSDBJNI_JAR
    assert jar.is_file(), f"Kafka Streams 3.9.0 no longer runs {ROCKSDBJNI_JAR}"
    build = tmp_path_factory.mktemp("open-store")
    (build / "OpenStore.java").write_text(OPEN_STORE)
    subprocess.run(["javac", "-cp", str(jar), "OpenStore.java"], cwd=build, check=True, timeout=300)
    return f"{jar}:{build}"


def open_with_rocksdb_7_9(classpath: str, store: Path, fmt: str) -> str:
    families = ["keyValueWithTimestamp"] if fmt == "timestamped" else []
    out = subprocess.run(
        ["java", "-cp", classpath, "OpenStore", str(store), *families],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip()


def test_rocksdb_7_9_opens_the_checkpoint_layout_and_refuses_the_kip_1035_one(
    classpath: str, tmp_path: Path
) -> None:
    log = SegmentLog(tmp_path / "log")
    producer = log.producer("writer")
    producer.begin()
    for store in STORES:
        for i in range(3000):
            producer.send(f"{APP}-{store}-changelog", 0, b"k%d" % (i % 500), b"%d" % i)
    producer.commit()
    producer.close()
    log.close()
    formats = [a for name, fmt in STORES.items() for a in ("--store-format", f"{name}={fmt}")]
    for version in ("3.9", "4.4"):
        args = ["restore", "--log-dir", str(tmp_path / "log"), "--state-dir", str(tmp_path / version)]
        args += ["--app-id", APP, "--kafka-streams-version", version, *formats]
        out = subprocess.run(
            [sys.executable, "-m", "statestore.cli", *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
    for store, fmt in STORES.items():
        legacy = open_with_rocksdb_7_9(classpath, tmp_path / "3.9" / APP / "0_0" / "rocksdb" / store, fmt)
        assert legacy == "OPENED entries=500 rocksdb=7.9.2", legacy
        current = open_with_rocksdb_7_9(classpath, tmp_path / "4.4" / APP / "0_0" / "rocksdb" / store, fmt)
        assert current.startswith("REFUSED") and "offsets" in current, current
