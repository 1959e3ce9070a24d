"""What starts DeepSpeed without ``tune run``'s preflight (``make demo-warmup``'s bare torchrun,
``tune profile --probe``) stops on a stale torch-extension build lock with the preflight's line
and exit 2, instead of waiting on the lock forever; the lock itself is left alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.cli.lockcheck import main as lockcheck

from .sshd import REPO
from .test_preflight import plant_lock, stale


def test_the_warmup_check_names_a_stale_lock_and_leaves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert lockcheck([]) == 0  # no build directory at all
    lock = plant_lock(tmp_path / "ext", "deepspeed_shm_comm")
    assert lockcheck(["--name", "make demo-warmup"]) == 2
    err = capsys.readouterr().err
    assert err == f"make demo-warmup: preflight: localhost: {stale(lock)}\n"
    assert lock.exists()  # a build in another PID namespace may still hold it


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_warmup_stops_on_a_stale_lock_before_torchrun(tmp_path: Path) -> None:
    """The Makefile's own recipe, with a venv whose torchrun does not exist: the check's line
    and nothing of the run (the warm-up's directory is never made)."""
    lock = plant_lock(tmp_path / "ext", "deepspeed_shm_comm")
    venv, warm = tmp_path / "venv", tmp_path / "warmup"
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", f"{venv}/.installed-dev", "demo-warmup",
         f"VENV={venv}", f"PY={sys.executable}", f"DEMO_WARMUP={warm}"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TORCH_EXTENSIONS_DIR":
             str(tmp_path / "ext")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert f"make demo-warmup: preflight: localhost: {stale(lock)}" in done.stderr.splitlines()
    assert done.returncode == 2
    assert not warm.exists()


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_tune_profile_probe_stops_on_a_stale_lock_before_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tuner.profile.probe as probe_module
    from tuner.cli.main import main as tune

    def launched(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the probe was launched on a stale build lock")

    monkeypatch.setattr(probe_module, "run_stack_probe", launched)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    lock = plant_lock(tmp_path / "ext", "deepspeed_shm_comm")
    results = str(tmp_path / "results")
    assert tune(["profile", "--study", "demo", "--probe", "--results", results]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tune: preflight: ")
    assert lines[0].endswith(f": {stale(lock)}")
