"""How fast the whole space of a study is enumerated, validated and estimated.

Usage: python benchmarks/enumerate.py [--study gpt-70b] [--repeat 5]
Target (issue 2): >= 20,000 configs per second; the whole gpt-70b space in under 1 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tuner.space.enumerate import enumerate_space
from tuner.spec.file import load_study


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", default="gpt-70b")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    spec = load_study(args.study)
    times: list[float] = []
    report = None
    for _ in range(args.repeat):
        start = time.perf_counter()
        report = enumerate_space(spec)
        times.append(time.perf_counter() - start)
    assert report is not None
    best, median = min(times), statistics.median(times)
    print(f"study {spec.name}: {report.total} configs ({report.counts()})")
    print(f"enumerate + validate + memory + time: median {median:.3f} s, best {best:.3f} s")
    print(
        f"configs per second: median {report.total / median:,.0f}, best {report.total / best:,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
