#!/usr/bin/env python3
"""``benchmarks/run.py <scenario> [options]``: the same as ``python -m benchmarks`` (see harness.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import main

sys.exit(main())
