"""The software versions a training log names, as an export's header shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.logs.versions import tuner_version, versions_in_logs, versions_in_text

# the Megatron-DeepSpeed stand-in prints DeepSpeed's own line as the fork's runs log it
STANDIN = (
    Path(__file__).resolve().parents[1] / "standins" / "megatron_deepspeed" / "pretrain_gpt.py"
)


def test_the_workloads_line_and_deepspeeds_own() -> None:
    log = ("[2026-12-05 16:00:01] rank 0\n"
           "tuner-versions: python=3.11.7 torch=2.13.0+cpu deepspeed=0.19.8\n"
           "[INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.19.9, "
           "git-hash=unknown, git-branch=unknown\n")  # fmt: skip
    assert versions_in_text(log) == {"python": "3.11.7", "torch": "2.13.0+cpu",
                                     "deepspeed": "0.19.8"}  # fmt: skip
    assert versions_in_text(log.split("\n", 2)[2]) == {"deepspeed": "0.19.9"}
    assert "DeepSpeed info: version=" in STANDIN.read_text()


def test_nothing_is_made_up() -> None:
    assert versions_in_text(" > initializing torch distributed ...\n iteration 1/ 10 |") == {}
    # only plain version words: nothing that a shell or a header could misread
    assert versions_in_text("tuner-versions: torch=$(reboot) x=1;y ok=2.0\n") == {"ok": "2.0"}


def test_logs_are_read_at_their_start(tmp_path: Path) -> None:
    (tmp_path / "node-0.log").write_text("tuner-versions: torch=2.13.0\n")
    (tmp_path / "node-1.log").write_text("tuner-versions: torch=2.12.0 deepspeed=0.19.8\n")
    logs = [tmp_path / "node-0.log", tmp_path / "node-1.log", tmp_path / "missing.log"]
    assert versions_in_logs(logs) == {"torch": "2.13.0", "deepspeed": "0.19.8"}
    assert tuner_version()[0].isdigit()


def test_every_name_of_the_logs_package_resolves_where_it_is_defined() -> None:
    """The package's names load on first use (tuner.logs._EXPORTS): each one listed is found,
    in the module that defines it."""
    import importlib

    import tuner.logs as logs

    assert set(logs.__all__) == set(logs._EXPORTS)
    for name in logs.__all__:
        assert getattr(logs, name) is getattr(importlib.import_module(logs._EXPORTS[name]), name)
    with pytest.raises(AttributeError):
        logs.no_such_name  # noqa: B018
