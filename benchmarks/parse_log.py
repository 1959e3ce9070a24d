"""Wall time of ``tune parse-log FILE --json`` on generated logs: parsing must grow linearly.

Usage: python benchmarks/parse_log.py [--sizes 1,10,100] [--keep DIR]

Logs are written to a temporary directory (or ``--keep DIR``): a Megatron run whose iteration lines
are mixed with the NCCL INFO and warning lines real jobs print (one iteration line in ten), one
made only of iteration lines, and a 2 MB line without a newline or a space. Each is parsed by a
fresh ``tune`` process, as a user or the study loop would; the first row is an empty log (the
interpreter's start-up and imports). Figures go to stdout; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

MB = 1 << 20
ITERATION = (
    " [2025-01-02 03:04:{s:02d}] iteration {i:8d}/{n:8d} | consumed samples: {c:12d} | elapsed "
    "time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 243.6 | learning rate:"
    " 1.420000E-05 | global batch size:   128 | lm loss: 1.818812E+00 | loss scale: 1.0 | grad "
    "norm: 1.300 | num zeros: 0.0 | number of skipped iterations:   0 | number of nan iterations:"
    "   0 |"
)
NOISE = (
    "gpu{r:03d}:1234:1290 [{g}] NCCL INFO Channel {c:02d}/32 : 0[{g}] -> 1[{g}] via P2P/IPC",
    "[rank{r}]:[W102 03:04:05.123456 ProcessGroupNCCL.cpp:4561] Warning: TORCH_NCCL_AVOID_"
    "RECORD_STREAMS is the default now, this environment variable is thus deprecated.",
    "/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:92: UserWarning: None of "
    "the inputs have requires_grad=True. Gradients will be None",
)


def mixed_lines(noise_per_iteration: int) -> Iterator[str]:
    """An endless Megatron log: iteration lines with ``noise_per_iteration`` lines between."""
    i = 0
    while True:
        i += 1
        for k in range(noise_per_iteration):
            yield NOISE[k % len(NOISE)].format(r=k % 64, g=k % 8, c=k % 32)
        yield ITERATION.format(s=i % 60, i=i, n=10**7, c=128 * i, ms=5000.0 + i % 97)


def write_log(path: Path, size: int, noise_per_iteration: int) -> None:
    written = 0
    with path.open("w") as f:
        for line in mixed_lines(noise_per_iteration):
            f.write(line + "\n")
            written += len(line) + 1
            if written >= size:
                return


def parse(path: Path) -> tuple[float, dict[str, object]]:
    """Seconds ``tune parse-log PATH --json`` took, and its JSON object."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.cli.main", "parse-log", str(path), "--json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    result: dict[str, object] = json.loads(proc.stdout)
    return seconds, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,10,100", help="mixed log sizes in MB")
    parser.add_argument(
        "--keep", type=Path, default=None, help="write the logs here and keep them"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cases: list[tuple[str, Path]] = []
        empty = root / "empty.log"
        empty.write_text("")
        cases.append(("empty log (start-up)", empty))
        for mb in (int(s) for s in args.sizes.split(",")):
            path = root / f"mixed-{mb}mb.log"
            write_log(path, mb * MB, noise_per_iteration=9)
            cases.append((f"{mb} MB mixed", path))
        path = root / "iterations-10mb.log"
        write_log(path, 10 * MB, noise_per_iteration=0)
        cases.append(("10 MB iteration lines only", path))
        line = root / "one-line-2mb.log"
        line.write_text("x" * (2 * MB))
        cases.append(("2 MB single line", line))
        print(f"{'log':28s} {'MB':>7s} {'seconds':>8s} {'MB/s':>7s}  outcome, iterations")
        for label, path in cases:
            seconds, out = parse(path)
            size = path.stat().st_size / MB
            rate = f"{size / seconds:7.1f}" if size >= 1 else "      -"
            print(
                f"{label:28s} {size:7.1f} {seconds:8.2f} {rate}  "
                f"{out['outcome']}, {out['iterations']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
