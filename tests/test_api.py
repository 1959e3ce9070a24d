"""The Python API: ``import tuner`` is light, its names resolve, and the README's example runs."""

from __future__ import annotations

import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import tuner
from tuner.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_import_is_light_and_has_a_version() -> None:
    code = (
        "import sys, tuner; heavy = {'optuna', 'pandas', 'jinja2', 'paramiko', 'numpy'}; "
        "print(sorted(heavy & set(sys.modules))); print(tuner.__version__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         check=True).stdout.splitlines()  # fmt: skip
    assert out[0] == "[]"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", out[1]), out[1]


def test_every_public_name_resolves() -> None:
    assert set(tuner.__all__) == {"DISTRIBUTION", "__version__", *tuner._LAZY}
    for name in tuner.__all__:
        assert getattr(tuner, name) is not None, name
    assert tuner.leaderboard is importlib.import_module("tuner.report.leaderboard").leaderboard
    with pytest.raises(AttributeError):
        tuner.no_such_name  # noqa: B018


def test_estimate_takes_a_config_or_knobs() -> None:
    spec = tuner.load_study("llama3-8b")
    by_knobs = tuner.estimate(spec, tp=2, sp=False)
    assert by_knobs == tuner.estimate("llama3-8b", by_knobs.config)
    assert by_knobs.config.tp == 2 and by_knobs.valid and by_knobs.memory is not None
    with pytest.raises(ConfigError, match="unknown key"):
        tuner.estimate(spec, tensor_parallel=2)
    with pytest.raises(TypeError):
        tuner.estimate(spec, by_knobs.config, tp=2)
    invalid = tuner.estimate(spec, tp=3)
    assert not invalid.valid and not invalid.fits and invalid.time is None


API_PAGE = REPO / "docs" / "guides" / "python-api.md"
"""The Python API's page of the docs (it was the README's "Python API" section)."""


def readme_examples() -> list[tuple[int, str]]:
    """The ``python`` blocks of the Python API page, with their line numbers."""
    text = API_PAGE.read_text()
    section = text
    first_line = 1
    return [
        (first_line + section[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"```python\n(.*?)```", section, re.S)
    ]


def run_doctest(source: str, line: int, globs: dict[str, object] | None = None) -> None:
    name = str(API_PAGE.relative_to(REPO))
    test = doctest.DocTestParser().get_doctest(source, globs or {}, name, name, line)
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=report.append)
    assert result.attempted > 0 and result.failed == 0, "".join(report)


def test_readme_has_the_examples() -> None:
    blocks = readme_examples()
    assert len(blocks) == 2 and "tuner.run(" in blocks[1][1]


def test_readme_estimate_example() -> None:
    line, source = readme_examples()[0]
    run_doctest(source, line)


@pytest.mark.slow
def test_readme_run_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run example, verbatim, on a fast study of the same name.

    Why not the shipped demo: it trains a real model with DeepSpeed (minutes, the train extra).
    ``studies/demo.yaml`` under the current directory comes first in the study look-up, so here
    the name means a Megatron stand-in study on local processes (the study loop tests' one).
    """
    from tests.test_study import SURFACE, study_data

    data = study_data(tmp_path, SURFACE)
    data["name"] = "demo"
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "demo.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    line, source = readme_examples()[1]
    run_doctest(source, line, {"tuner": tuner})  # the first block imported it
    assert (tmp_path / "results" / "demo" / "study.db").is_file()
