"""A digest of what an enumeration decides and prints, to compare two trees' results.

Usage: python benchmarks/enumerate_digest.py [--spaces gpt-70b,moe-1e5] [--baseline main]

Per space, in a fresh process: ``enumerate_space(spec, keep_oom=True)`` on the fast path and its
ranking, and a SHA-256 of the counts (``invalid_by_rule`` in its order), the whole ranking (each
config's key and step), the exact peak and sd of the first 200, every out-of-memory config's
key, the memory probes (key, step, peak, sd), the first 100 of the ranking as ``tune space
--json`` prints them, ``stream_space(top=50)``'s counts, ranking and probes, and, on spaces of
under 10^4 configs, the CSV of ``to_frame(include_oom=True)``. ``--baseline REV``: the same on
git revision ``REV``'s tree, side by side; a speed-up of the enumeration must leave every
digest as it was (issue 36: the same viable set, out-of-memory set, ranking and printed
figures).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from enumerate import export_tree, study

from tuner.cli.tables import _candidate_json
from tuner.space.candidates import Candidate
from tuner.space.enumerate import enumerate_space
from tuner.space.stream import stream_space


def _probes(probes: list[Candidate]) -> list[Any]:
    return [(c.config.key(), c.time.step if c.time else None, c.memory.peak, c.memory.sigma)
            for c in probes]  # fmt: skip


def digest(name: str) -> dict[str, Any]:
    """The digests of ``name``'s enumeration in this process (module docstring)."""
    spec = study(name)
    report = enumerate_space(spec, keep_oom=True)
    ranked = report.ranked()
    parts: dict[str, Any] = {
        "counts": [report.counts(), list(report.invalid_by_rule.items())],
        "ranking": [(c.config.key(), c.time.step if c.time else None) for c in ranked],
        "peaks": [(c.memory.peak, c.memory.sigma) for c in ranked[:200]],
        "oom": [c.config.key() for c in report.oom],
        "probes": _probes(report.probes),
        "json": [_candidate_json(c) for c in ranked[:100]],
    }
    stream = stream_space(spec, top=50)
    parts["stream"] = [stream.counts(), [c.config.key() for c in stream.ranked()],
                       _probes(stream.probes)]  # fmt: skip
    if report.total < 10_000:
        parts["csv"] = report.to_frame(include_oom=True).to_csv()
    out = {k: hashlib.sha256(json.dumps(v, default=str).encode()).hexdigest()[:12]
           for k, v in parts.items()}  # fmt: skip
    return {"viable_n": len(report.viable), "oom_n": len(report.oom), **out}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", default="gpt-70b,mixtral-8x7b,llama3-8b")
    parser.add_argument("--baseline", help="a git revision to digest beside this tree")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(digest(args.child)))
        return 0
    here = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": here.parent.parent}
        if args.baseline:
            trees[args.baseline] = export_tree(args.baseline, Path(tmp))
        same = True
        for name in args.spaces.split(","):
            rows = {}
            for label, root in trees.items():  # this script on each tree's tuner
                env = {**os.environ, "PYTHONPATH": str(root)}
                out = subprocess.run([sys.executable, str(here), "--child", name],
                                     capture_output=True, text=True, check=True, cwd=root,
                                     env=env)  # fmt: skip
                rows[label] = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"{name:<14}{label:<8}", " ".join(f"{k}={v}" for k, v in rows[label].items())
                )
            same = same and len({json.dumps(r, sort_keys=True) for r in rows.values()}) == 1
    print("identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
