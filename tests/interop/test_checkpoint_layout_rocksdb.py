"""The ``.checkpoint`` layout (``restore --kafka-streams-version 3.9``) opens in Kafka Streams 3.9's RocksDB.

Kafka Streams 3.6 - 3.9 run rocksdbjni 7.9.2 and open a store with exactly
its column families (``default``, and ``keyValueWithTimestamp`` for a
timestamped store). A small Java program does that on stores statestore
restored for 3.9: it reads every entry, writes one and compacts (so the
files are read and rewritten by that RocksDB). The 4.3+ layout is refused
by it, as Kafka Streams 3.9 would refuse it. Needs Java and Maven (the jar
comes from Maven Central once, into ~/.m2).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statestore import SegmentLog

ROCKSDBJNI = "org.rocksdb:rocksdbjni:7.9.2"
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
    if shutil.which("mvn") is None or shutil.which("javac") is None:
        pytest.skip("needs Maven and a JDK")

    def get() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["mvn", "-q", "-B", "dependency:get", f"-Dartifact={ROCKSDBJNI}"],
            capture_output=True,
            text=True,
            timeout=600,
        )

    # Other test workers may be writing the same local Maven repository at this moment: a second try.
    got = get()
    if got.returncode != 0:
        got = get()
    group, artifact, version = ROCKSDBJNI.split(":")
    jar = (
        Path.home()
        / ".m2"
        / "repository"
        / group.replace(".", "/")
        / artifact
        / version
        / f"{artifact}-{version}.jar"
    )
    if got.returncode != 0 or not jar.is_file():
        pytest.skip(
            f"{ROCKSDBJNI} does not resolve (mvn exit {got.returncode}, jar at {jar}: {jar.is_file()}): "
            f"{got.stdout[-300:]} {got.stderr[-300:]}"
        )
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
