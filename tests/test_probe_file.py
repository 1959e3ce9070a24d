"""The framework probe's saved file (:mod:`tuner.profile.probe_file`), missing or damaged: one
:class:`ProfileError` naming the file, the field and the command that measures it again."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_stack_terms import STUDY, probe_rows, saved, spec_of
from tuner.cli.main import main
from tuner.layout import ClusterLayout
from tuner.profile.probe import ProbeResult
from tuner.profile.probe_file import load_probe, save_probe
from tuner.profile.run import ProfileError, local_versions

NOW = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)


def test_a_missing_probe_names_the_file_and_the_command_that_measures_it(
    tmp_path: Path,
) -> None:
    """It said ``run tune profile --probe``, which is refused as printed (no study)."""
    spec = spec_of()
    path = tmp_path / "none.stack.yaml"
    with pytest.raises(ProfileError) as exc:
        load_probe(path, spec)
    assert exc.value.file == str(path)
    assert "no framework probe yet (tune profile --study standin --probe measures it)" in str(
        exc.value
    )


def _edited(edit: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        data = yaml.safe_load(path.read_text())
        edit(data)
        path.write_text(yaml.safe_dump(data))

    return write


def _text(content: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(content)


def _bombed(field: str) -> Callable[[Path], None]:
    """``field`` (``rows[0].key`` for a row's, ``versions.torch`` for a mapping's) made a
    "billion laughs": nine levels of nine aliases of the level below."""
    levels = [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]" for i in range(9)]
    bomb = "[" + ", ".join(levels[:-1]) + ", " + levels[-1] + "]"

    def write(path: Path) -> None:
        data = yaml.safe_load(path.read_text())
        node, key = (data["rows"][0], "key") if field.startswith("rows") else (data, field)
        if "." in key:  # versions.torch: a package's version
            parent, key = key.split(".")
            node = node[parent]
        node[key] = "BOMB"
        path.write_text(yaml.safe_dump(data).replace("BOMB", bomb, 1))

    return write


# (id, the damage, words of the message). Each was a traceback, a Python-internal message
# ("'NoneType' object is not subscriptable") or a silently wrong figure before.
DAMAGED: list[tuple[str, Callable[[Path], None], str]] = [
    ("empty", _text(b""), "expected a mapping with a list of rows"),
    ("a-list", _text(b"- 1\n"), "expected a mapping with a list of rows"),
    ("not-utf8", _text(b"rows: caf\xe9\n"), "not UTF-8 text (byte 0xe9"),
    ("deep-nesting", _text(b"x: " + b"[" * 3000 + b"]" * 3000), "nested too deeply"),
    ("cut-short", _text(b"rows: ["),  # "while parsing a flow node": no problem, no line
     "expected the node content, but found '<stream end>' at line 1"),
    ("huge-int-figure", _edited(lambda d: d["rows"][0].update(step_s=10**400)),
     "rows[0].step_s: int too large to convert to float"),
    ("fractional-depth", _edited(lambda d: d["rows"][1].update(depth=1.5)),
     "rows[1].depth: expected a whole number >= 0, got 1.5"),  # read as 1 before
    ("row-a-list", _edited(lambda d: d["rows"].append([1])), "rows[6]: expected a mapping"),
    ("row-without-peak", _edited(lambda d: d["rows"][0].pop("peak_gib")),
     "rows[0].peak_gib is missing"),
    ("no-cost", _edited(lambda d: d.pop("cost")), "cost is missing"),
    ("cost-a-number", _edited(lambda d: d.update(cost=3)), "cost: expected a mapping, got int"),
    ("cost-without-nodes", _edited(lambda d: d["cost"].pop("nodes")), "cost.nodes is missing"),
    ("versions-a-string", _edited(lambda d: d.update(versions="torch")),
     "versions: expected a mapping of package: version"),
    ("created-a-number", _edited(lambda d: d.update(created=5)),
     "created: expected an ISO 8601 time, got 5"),
    ("created-garbage", _edited(lambda d: d.update(created="soon")), "created: Invalid isoformat"),
    # an alias bomb (43 million leaves): its str() or repr built all of it, seconds and a GB;
    # then each field's check was made safe, but a package's version was shown as it was
    # (`tune profile --probe --show --json` walked it): tuner writes no alias, none is read
    *[(f"alias-bomb-{field}", _bombed(field), "aliases (*name) are not allowed")
      for field in ("versions", "created", "versions.torch", "rows[0].key")],
]  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("damage", "words"), [c[1:] for c in DAMAGED],
                         ids=[c[0] for c in DAMAGED])  # fmt: skip
def test_a_damaged_probe_is_one_line_naming_the_field_and_the_remedy(
    tmp_path: Path, damage: Callable[[Path], None], words: str
) -> None:
    spec = spec_of()
    path = saved(tmp_path, spec, NOW)
    damage(path)
    with pytest.raises(ProfileError) as exc:
        load_probe(path, spec)
    text = str(exc.value)
    assert "\n" not in text and exc.value.file == str(path)
    assert words in text and len(text) < 400, text[:500]
    assert text.endswith("; tune profile --study standin --probe measures it again"), text


def test_the_undamaged_probe_loads(tmp_path: Path) -> None:
    """The base of the cases above: each fails for its own damage only."""
    spec = spec_of()
    assert len(load_probe(saved(tmp_path, spec, NOW), spec)["rows"]) == 6


def test_showing_a_probe_without_its_cost_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune profile --probe --show`` read the cost unchecked: a KeyError traceback."""
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    monkeypatch.chdir(tmp_path)
    spec = spec_of()
    path = ClusterLayout(tmp_path / "results", spec.cluster_name).stack_yaml(spec.name)
    result = ProbeResult(rows=tuple(probe_rows(spec)), wall_s=61.0, nodes=1,
                         versions=local_versions())  # fmt: skip
    save_probe(spec, result, path, dt.datetime.now(dt.UTC))  # fresh, of this stack: shown
    _edited(lambda d: d.pop("cost"))(path)
    assert main(["profile", "--study", "study.yaml", "--probe", "--show"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tune: error: {path}: "), lines
    assert "cost is missing" in lines[0]


def test_a_probe_save_stopped_mid_write_keeps_the_last_one_and_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a profile's save: the last good probe stays and no half-written copy is left."""
    spec = spec_of()
    path = saved(tmp_path, spec, NOW)
    before = path.read_bytes()
    kept = {p.name for p in path.parent.iterdir()}

    def full_disk(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", full_disk)
    result = ProbeResult(rows=tuple(probe_rows(spec)), wall_s=1.0, nodes=1,
                         versions=local_versions())  # fmt: skip
    with pytest.raises(OSError, match="No space left"):
        save_probe(spec, result, path, NOW)
    assert path.read_bytes() == before
    assert {p.name for p in path.parent.iterdir()} == kept
