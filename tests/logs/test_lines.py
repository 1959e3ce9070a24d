"""Line splitting and selection: linear, bounded, and the same lines the parsers would read."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.logs import classify, deepspeed, lines


def _chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab \n\r\x0b\u2028", max_size=80), st.integers(min_value=1, max_value=9))
def test_split_lines_is_splitlines_across_chunk_boundaries(text: str, size: int) -> None:
    got = list(lines.split_lines(_chunked(text, size)))
    # a "\r\n" cut between two chunks may leave one extra empty line; nothing else differs
    assert [g for g in got if g] == [e for e in text.splitlines() if e]
    assert list(lines.split_lines([text])) == text.splitlines()


def test_long_lines_are_cut_and_never_held() -> None:
    cut = lines.MAX_LINE_CHARS
    text = "x" * (5 * cut) + "\nshort\n" + "y" * (3 * cut)
    for size in (7, cut - 1, cut + 1, len(text)):
        assert [len(line) for line in lines.split_lines(_chunked(text, size))] == [cut, 5, cut]
        selected = list(lines.select_lines(_chunked(text, size), ["x", "short", "y"]))
        assert [len(line) for line in selected] == [cut, 5, cut]


def _scan_all(text: str) -> tuple[deepspeed.DeepSpeedScan, classify.FailureScan]:
    found, failures = deepspeed.DeepSpeedScan(), classify.FailureScan()
    for line in lines.log_lines(text):
        found.feed(line)
        failures.feed(line)
    return found, failures


def _scan_selected(text: str) -> tuple[deepspeed.DeepSpeedScan, classify.FailureScan]:
    found, failures = deepspeed.DeepSpeedScan(), classify.FailureScan()
    markers = (*deepspeed.MARKERS, *classify.MARKERS)
    for line in lines.clean_lines(lines.select_lines(lines.text_chunks(text), markers)):
        found.feed(line)
        failures.feed(line)
    return found, failures


def test_selected_lines_give_the_same_scan_on_every_fixture(fixtures_dir: Path) -> None:
    """The markers name every line a parser reads: skipping the others changes nothing."""
    for path in sorted(fixtures_dir.glob("*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        assert _scan_selected(text) == _scan_all(text), path.name


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([*deepspeed.MARKERS, *classify.MARKERS, "Traceback (most recent "
                             "call last):", "ValueError: x", " iteration 3/ 9 | elapsed time per "
                             "iteration (ms): 5.0 |", "AssertionError"]),
            st.text(alphabet="|:=[]()0123456789.eE- abrnoitsGBM\r\n", max_size=30),
        ),
        max_size=12,
    )
)  # fmt: skip
def test_selected_lines_give_the_same_scan_on_arbitrary_text(parts: list[str]) -> None:
    text = "".join(parts)
    assert _scan_selected(text) == _scan_all(text)
