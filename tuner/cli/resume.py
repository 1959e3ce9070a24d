"""Whether ``tune run`` would resume a study whose file changed: the run refuses it before the
preflight, the dry run says so (the words are :func:`tuner.study.storage.changed_study`)."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import StudyError
from tuner.layout import ResultsLayout
from tuner.spec.study import StudySpec


def changed_here(spec: StudySpec, storage: str | None, results: str) -> str | None:
    """Why ``tune run`` (without ``--force``) refuses to resume ``spec``'s study, or None. Only a
    study in a file here is read (the default SQLite or a journal); another storage is judged
    when the loop opens it, and a study not stored yet is a new one."""
    from tuner.report.leaderboard import load_optuna_study
    from tuner.study.storage import FINGERPRINT_ATTR
    from tuner.study.url import resolve_url

    local = resolve_url(storage, ResultsLayout(Path(results), spec.name)).local_file
    if local is None or not local.exists():
        return None
    try:
        recorded = load_optuna_study(spec, storage, results).user_attrs.get(FINGERPRINT_ATTR)
    except StudyError:
        return None  # not in it yet: the loop creates it
    return changed(spec, recorded)


def changed(spec: StudySpec, recorded: object) -> str | None:
    """Why ``tune run`` refuses to resume ``spec``'s study stored with the fingerprint
    ``recorded`` (None: a study not stored yet, or one stored before fingerprints), or None."""
    from tuner.study.storage import changed_study

    if recorded is not None and recorded != spec.fingerprint():
        return changed_study(spec, str(recorded))
    return None
