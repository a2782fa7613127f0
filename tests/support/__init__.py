"""What the tests share: child processes they SIGKILL, a Kafka broker for the
session, the reference model of a restored store, and small worlds for bad input.

``tests`` is on the import path of the test run (pytest's ``pythonpath``) and,
through ``PYTHONPATH`` set in ``conftest.py``, of every child process a test
starts, so modules here import each other as ``support.<module>``.
"""
