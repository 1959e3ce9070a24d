"""The report's screenshots in the docs (``make screenshot``) and what they were drawn from.

``docs/images/report-screenshots.json`` records a hash of the files that decide how the report
looks (its template and the modules that fill it) when the pictures are taken; a test fails when
those files have changed since, so the pictures in the docs cannot silently show an old page.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tests.report.browser import SCREENSHOT_WIDTH, png_size

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "docs" / "images"
RECORD = IMAGES / "report-screenshots.json"
SHOTS = ("report-demo.png", "report-large.png")
"""The demo's report, and a generated 200-trial study's (benchmarks/report_size.py)."""
TEMPLATE = tuple(
    REPO / "tuner" / "report" / name
    for name in ("page.html.j2", "page.py", "views.py", "figures.py", "importances.py")
)


def template_hash() -> str:
    """One hash over the report's template and the modules that fill it."""
    digest = hashlib.sha256()
    for path in TEMPLATE:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def record() -> None:
    """Note that the pictures were just taken from the current template."""
    RECORD.write_text(json.dumps({"template_sha256": template_hash(), "shots": SHOTS}) + "\n")


def problems() -> list[str]:
    """Why the docs' screenshots are missing or stale (empty when current)."""
    out = [f"docs/images/{n} is missing" for n in SHOTS if not (IMAGES / n).is_file()]
    out += [
        f"docs/images/{n} is {png_size(IMAGES / n)[0]} px wide, not {SCREENSHOT_WIDTH}"
        for n in SHOTS
        if (IMAGES / n).is_file() and png_size(IMAGES / n)[0] != SCREENSHOT_WIDTH
    ]
    recorded = json.loads(RECORD.read_text()).get("template_sha256") if RECORD.is_file() else None
    if recorded != template_hash():
        out.append(
            "the report's template changed since the screenshots were taken: make screenshot"
        )
    return out
