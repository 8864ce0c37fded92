"""One module per family of scenarios; each only declares scenarios (``harness.scenario``)."""
