"""The wheel: its name, what it ships (py.typed, templates, studies, catalogs), its command."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import tuner

REPO = Path(__file__).resolve().parents[1]


def test_distribution_name_is_written_once() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == tuner.DISTRIBUTION
    assert project["scripts"] == {"tune": "tuner.cli.main:main"}


@pytest.mark.slow
def test_wheel_ships_the_package_data(tmp_path: Path) -> None:
    # A copy, because setuptools writes build/ and *.egg-info next to the sources. No build
    # isolation: the test environment's setuptools builds it and nothing is downloaded.
    src = tmp_path / "src"
    shutil.copytree(REPO / "tuner", src / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(src)],
        check=True, cwd=tmp_path, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith(f"{tuner.DISTRIBUTION}-{tuner.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [
        "tuner/py.typed", "tuner/catalog/gpus.yaml", "tuner/catalog/models.yaml",
        "tuner/templates/megatron_gpt.sh.j2", "tuner/templates/deepspeed_gpt.sh.j2",
        "tuner/templates/megatron_deepspeed_gpt.sh.j2",
        "tuner/templates/ds_config.json.j2", "tuner/studies/gpt-70b.yaml",
        "tuner/studies/hostfile-gpt-70b", "tuner/launch/megatron_flags.py",
        "tuner/report/page.html.j2", "tuner/report/plotly_white.json",
    ]  # fmt: skip
    assert [name for name in shipped if name not in names] == []
    assert not any(n.startswith(("tests/", "benchmarks/", "workloads/")) for n in names)
    info = f"{tuner.DISTRIBUTION}-{tuner.__version__}.dist-info"
    entry_points = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "tune = tuner.cli.main:main" in entry_points
