#!/usr/bin/env python3
"""``benchmarks/run.py <scenario> [options]``: the same as ``python -m benchmarks`` (see cli.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cli import main

sys.exit(main())
