"""The wheel ``make wheel`` builds, not the source tree, installed where Spark runs.

The manylinux wheel from ``dist/`` is installed into a fresh virtual
environment outside the clone. There it restores a store, runs the CLI and a
``restore_on_spark`` job whose executors run that environment's interpreter;
then the environment is packed with ``venv-pack`` and shipped to the
standalone cluster's executors with ``--archives env.tar.gz#env`` and
``spark.pyspark.python=./env/bin/python``, and restores there too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import ROOT


def newest_wheel() -> Path:
    wheels = sorted(
        (ROOT / "dist").glob("statestore-*-manylinux_2_28_x86_64.whl"), key=lambda p: p.stat().st_mtime
    )
    if not wheels:
        reason = "no manylinux wheel in dist/: run `make wheel`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return wheels[-1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheel = newest_wheel()
    env = tmp_path_factory.mktemp("wheel-venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    out = subprocess.run(
        [str(env / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[spark]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return env


SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import statestore, statestore._native
    from statestore import SegmentLog, TopicPartition, restore_store
    from statestore.restore.spark import restore_on_spark, spark_session

    root = Path(sys.argv[1])
    assert str(Path(statestore._native.__file__).resolve()).startswith(sys.prefix), statestore._native.__file__
    log = SegmentLog(root / "log")
    p = log.producer("w")
    for part in range(2):
        p.begin()
        for i in range(5000):
            p.send("app-s-changelog", part, b"k%04d" % (i % 700), b"v%d" % i)
        p.commit()
    p.close()
    r = restore_store(root / "one", log, TopicPartition("app-s-changelog", 0))
    assert r.records_applied == 5000, r
    spark = spark_session("local[2]")
    assert spark.sparkContext.getConf().get("spark.pyspark.python") == sys.executable
    rows = restore_on_spark(spark, log_dir=root / "log", state_dir=root / "state", application_id="app",
                            stores=["s"]).collect()
    assert [r.status for r in rows] == ["ok", "ok"], rows
    print("wheel ok", statestore._native.__file__)
""")


def test_the_installed_wheel_restores_runs_the_cli_and_spark(venv: Path, tmp_path: Path) -> None:
    py = venv / "bin" / "python"
    out = subprocess.run(
        [str(py), "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "wheel ok" in out.stdout and str(ROOT) not in out.stdout
    cli = subprocess.run(
        [
            str(venv / "bin" / "statestore"),
            "restore",
            "--log-dir",
            str(tmp_path / "log"),
            "--state-dir",
            str(tmp_path / "cli-state"),
            "--app-id",
            "app",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert cli.returncode == 0 and "2 ok, 0 failed" in cli.stdout, cli.stdout + cli.stderr


def test_a_packed_environment_restores_on_the_standalone_cluster(
    venv: Path, tmp_path: Path, spark_cluster: tuple[str, Path]
) -> None:
    master, _ = spark_cluster
    py = venv / "bin" / "python"
    pack = subprocess.run(
        [sys.executable, "-m", "venv_pack", "-p", str(venv), "-o", str(tmp_path / "env.tar.gz")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pack.returncode == 0, pack.stderr[-2000:]
    subprocess.run(
        [str(py), "-c", SCRIPT.split("r = restore_store")[0], str(tmp_path)],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    spark_home = subprocess.run(
        [str(py), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    submit = Path(spark_home) / "bin" / "spark-submit"
    (tmp_path / "state").mkdir(exist_ok=True)  # on a cluster the state directory must exist (mounted) already
    out = subprocess.run(
        [
            str(submit),
            "--master",
            master,
            "--archives",
            f"{tmp_path / 'env.tar.gz'}#env",
            "--conf",
            "spark.pyspark.python=./env/bin/python",
            "--conf",
            f"spark.pyspark.driver.python={py}",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.executor.memory=512m",
            str(ROOT / "examples" / "restore_job.py"),
            "--log-dir",
            str(tmp_path / "log"),
            "--state-dir",
            str(tmp_path / "state"),
            "--app-id",
            "app",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON")
            },
            "SPARK_HOME": spark_home,
        },
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "2 ok, 0 failed" in out.stdout, out.stdout
