"""The benchmark: ``python -m benchmarks <scenario>`` (see harness.py and README.md)."""
