"""Learning quality: every policy on the simulated scenarios, as fractions of an oracle.

Runs `meshroute bench learning` (meshroute_middleware/sim) and writes its JSON report to
benchmarks/results/learning.json. The simulator drives the real Router on a simulated clock;
see docs/benchmarks.md, "Learning quality", for what each column means.

    python benchmarks/bench_learning.py [--quick] [--seed N] [--seeds N] [--workers N]
    python benchmarks/bench_learning.py --held-out --seeds 8 --json PATH   (seeds never tuned on)
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshroute_middleware.app.cli import main

RESULTS = Path(__file__).parent / "results" / "learning.json"

if __name__ == "__main__":
    sys.exit(main(["bench", "learning", "--json", str(RESULTS), *sys.argv[1:]]))
