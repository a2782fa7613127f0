"""Restore and task metrics for Prometheus (``pip install 'statestore[metrics]'``).

The public face of :mod:`statestore.ops.exporter`, where the code, the metric
names and their labels are documented.
"""

from statestore.ops.exporter import RestoreMetricsCollector, register, start_exporter

__all__ = ["RestoreMetricsCollector", "register", "start_exporter"]
