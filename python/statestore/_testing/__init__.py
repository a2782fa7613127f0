"""Hooks for the test suite (failures injected on purpose); not part of the API."""
