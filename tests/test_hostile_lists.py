"""The comma lists of ``tune``'s command line (``--columns``, ``--rerun``, ``--message-bytes``)
follow one rule (:func:`tuner.cli.options.comma_list`): an empty item or one given twice is
refused in one line naming the option, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.cli.main import main

LISTS = [
    (["run", "--study", "demo", "--dry-run", "--rerun"], "--rerun", "timeout"),
    (["space", "--study", "demo", "--top", "2", "--columns"], "--columns", "config"),
    (["profile", "--study", "demo", "--dry-run", "--message-bytes"], "--message-bytes", "1024"),
]


@pytest.mark.parametrize(("argv", "option", "item"), LISTS, ids=[o for _, o, _ in LISTS])
@pytest.mark.parametrize("form", [",,", "{0},", "{0},,{0}x", "{0},{0}"])
def test_an_empty_or_repeated_item_is_refused_naming_the_option(
    argv: list[str], option: str, item: str, form: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--rerun ,,`` was accepted as no outcome where ``--columns ,,,`` was refused;
    ``--columns config,config`` showed the column twice (refused rather than deduplicated:
    the order asked for is the table's, and a repeat is a slip to point at, not a wish)."""
    text = form.format(item)
    status = None
    try:
        status = main([*argv, text, "--results", str(tmp_path)])
    except SystemExit as exit_:  # argparse's usage error
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("tune: error: ") and option in err, err
    why = f"{item!r} given twice" if form == "{0},{0}" else "an empty item"
    assert f"{why} in {text!r}" in err, err
