"""Every command and study in README.md and docs/ runs, and prints what the page shows.

How each kind of block is checked, and the markers for blocks that need a real cluster or train
for real, are in tests/docs_examples.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_examples import REPO, Block, blocks, check, missing_output, pages


def _ids(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("page", pages(), ids=_ids)
def test_page_examples(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # studies on Slurm: submit mode, as shown
    problems: list[str] = []
    for block in blocks(page):
        if "slow" not in block.markers:
            problems += check(block, tmp_path)
    assert not problems, "\n\n".join(problems)


def _slow_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page) if "slow" in b.markers]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("block", _slow_blocks(), ids=lambda b: b.where)
def test_slow_examples(block: Block, tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="the example trains for real: needs the train extra")
    assert not check(block, tmp_path)


def test_every_page_has_checked_examples_or_none_to_check() -> None:
    """The markers are spelled right: only the known ones, each with a reason or a file name."""
    for page in pages():
        for block in blocks(page):
            assert set(block.markers) <= {"file", "needs-cluster", "slow"}, block.where
            assert all(v.strip() for v in block.markers.values()), block.where


def test_output_is_matched_in_order() -> None:
    printed = "total 10\n  a   b\nviable 3\n"
    assert missing_output(["total 10", "a b", "viable 3"], printed) == []
    assert missing_output(["viable 3", "total 10"], printed) == ["total 10"]
    assert missing_output(["viable 4"], printed) == ["viable 4"]


def test_a_wrong_figure_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```console\n$ tune space --study demo\ntotal 1\n```\n")
    block = Block(REPO / "README.md", 1, "console", blocks(page)[0].text)
    assert check(block, tmp_path)


def test_the_readme_links_point_at_files() -> None:
    """The README is read on its own (outside the docs site): its relative links must resolve."""
    import re

    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (REPO / link).exists()]
    assert missing == []
