"""Restore every store of an application on a Spark cluster: the job ``spark-submit`` runs.

    spark-submit --master spark://HOST:7077 \\
        --conf spark.pyspark.python=/path/to/venv/bin/python \\
        examples/restore_job.py --log-dir /shared/changelog --state-dir /shared/state --app-id word-count

or, with the changelog on a Kafka cluster (every task fetches its own partition)::

    spark-submit ... examples/restore_job.py --kafka broker1:9092,broker2:9092 \\
        --kafka-config security.protocol=SSL --state-dir /shared/state --app-id word-count

The executors need statestore importable by ``spark.pyspark.python`` (or a
packed environment shipped with ``--archives env.tar.gz#env`` and
``spark.pyspark.python=./env/bin/python``), and must see ``--log-dir`` and
``--state-dir`` at the same paths as the driver (a shared file system); the
state directory must exist there (a host where it does not answers with
failed rows naming it); with ``--kafka`` they must reach the brokers instead
of seeing a log directory. Prints one line per (store, partition), then one
indented line per earlier attempt that failed, and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession

from statestore.restore.planning import changelog_stores, parse_partitions
from statestore.restore.staging import kafka_changelog, kafka_conf
from statestore.spark import check_master, restore_on_spark


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--log-dir", help="the changelog segment log (a shared file system)")
    source.add_argument("--kafka", metavar="BOOTSTRAP", help="the changelog is on this Kafka cluster")
    ap.add_argument(
        "--kafka-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka property for the Kafka clients, e.g. security.protocol=SSL (repeatable)",
    )
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--store", action="append", default=None, help="a store (repeatable; default: all)")
    ap.add_argument("--partitions", default=None, help="e.g. 0-7 or 0,2,5-7 (default: every partition found)")
    args = ap.parse_args()
    kafka: dict[str, str] | None = None
    if args.kafka is not None:
        from statestore.changelog.kafka.common import parse_properties

        try:
            kafka = {"bootstrap.servers": args.kafka, **parse_properties(args.kafka_config)}
        except ValueError as e:
            ap.error(f"--kafka-config: {e}")
    check_master()  # a master nobody answers: an error now, not after a minute of retries
    spark = SparkSession.builder.appName(f"statestore-restore-{args.app_id}").getOrCreate()
    # the process's changelog for these properties, the one restore_on_spark plans with too
    source = args.log_dir if kafka is None else kafka_changelog(kafka_conf(kafka))
    stores = args.store or changelog_stores(source, args.app_id)
    rows = restore_on_spark(
        spark,
        log_dir=args.log_dir,
        kafka=kafka,
        state_dir=args.state_dir,
        application_id=args.app_id,
        stores=stores,
        partitions=None if args.partitions is None else parse_partitions(args.partitions),
    ).collect()
    for r in rows:
        print(
            f"{r.task_id} {r.store} {r.status} records={r.records_applied} lag={r.lag} attempts={r.attempts} "
            f"{r.error or ''}".rstrip()
        )
        for failure in (r.failed_attempts or "").splitlines():
            print(f"    {failure}")
    failed = sum(1 for r in rows if r.status != "ok")
    print(f"{len(rows) - failed} ok, {failed} failed")
    spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
