"""The command line's number options read numbers as the study file does: ASCII digits only
(``int`` and ``float`` take any Unicode digit, so ``--n-trials ４`` was 4 launches, while the study
file's ``search.n_trials: ４`` is refused); one line naming the option, exit status 2."""

from __future__ import annotations

import pytest

from tuner.cli.main import main
from tuner.errors import ConfigError
from tuner.report.data import TrialRow, find_trial

# a fullwidth, an Arabic-Indic and a Devanagari 4
DIGITS = ["\uff14", "\u0664", "\u096a"]

OPTIONS = [
    (["run", "--study", "gpt-70b", "--dry-run"], "--n-trials"),
    (["space", "--study", "gpt-70b"], "--top"),
    (["best", "--study", "gpt-70b"], "--train-iters"),
    (["profile", "--study", "gpt-70b"], "--repeats"),
    (["profile", "--study", "gpt-70b"], "--message-bytes"),
]


def _refused(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(command)
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    return captured.err


@pytest.mark.parametrize("digit", DIGITS)
@pytest.mark.parametrize(("command", "option"), OPTIONS)
def test_a_unicode_digit_in_a_whole_number_option_is_refused_naming_it(
    command: list[str], option: str, digit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused([*command, option, digit], capsys)
    assert err.startswith(f"tune: error: argument {option}: expected a whole number, got "
                          f"{digit!r}"), err  # fmt: skip


@pytest.mark.parametrize("value", ["\uff14.5", "1\u0665"])
def test_a_unicode_digit_in_a_number_option_is_refused_naming_it(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--train-tokens ４.５`` was 4.5 tokens (``float`` reads it)."""
    err = _refused(["report", "--study", "gpt-70b", "--train-tokens", value], capsys)
    assert err.startswith(f"tune: error: argument --train-tokens: expected a number, got "
                          f"{value!r}"), err  # fmt: skip


@pytest.mark.parametrize("value", ["0", "-5", "-1e9", "inf", "nan"])
def test_train_tokens_is_a_finite_number_above_zero_where_it_is_parsed(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One check (tuner.cli.options.positive_number), argparse's line naming the option; the
    handler held a second one, after the type's ASCII check."""
    err = _refused(["report", "--study", "gpt-70b", f"--train-tokens={value}"], capsys)
    words = f"argument --train-tokens: must be a finite number > 0, got {value} "
    assert err.startswith(f"tune: error: {words}"), err


def test_a_unicode_digit_names_no_baseline_trial() -> None:
    """``--baseline ４`` was trial 4 (``str.isdigit`` and ``int`` read it)."""
    none = dict.fromkeys(("predicted_step_s", "measured_step_s", "predicted_peak_gib",
                          "measured_peak_gib", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
                          "start", "end"))  # fmt: skip
    rows = [TrialRow(number=4, outcome="ok", config=None, reason="", launched=True,
                     gpu_hours=1.0, **none)]  # type: ignore[arg-type]  # fmt: skip
    assert find_trial(rows, "4") is rows[0]
    with pytest.raises(ConfigError, match="matches no measured trial"):
        find_trial(rows, "\uff14")
