"""Fault-injection tests: real processes, signals, restarts, races, skewed
clocks, a model-based state machine and a bad-input table.

See RELIABILITY.md at the repository root for what each test proves.
"""
