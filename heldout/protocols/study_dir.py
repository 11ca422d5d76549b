"""One run dir = one experiment: a study's folder and its ``study.json``.

:func:`open_study` writes ``study.json`` once (the cells and the experiment settings, each named
so a difference can be stated: :func:`study_description`); re-opening the dir with other settings
is an :class:`~heldout.evaluators.same_experiment.ExperimentMismatch` naming the differing settings, and
an existing study is continued only when asked (``resume=True``, ``heldout run --resume``). The
dir is then held by this process (:func:`claim_study_dir`): one study process per run dir."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from heldout.contracts import HeldoutError, canonical_json
from heldout.evaluators.ledger_io import LockHeld, hold_lock
from heldout.evaluators.same_experiment import ExperimentMismatch, stated_decoding
from heldout.evaluators.scoring import without_decoding
from heldout.files import read_user_json, remove_stale_temp_files, write_text_atomically
from heldout.protocols.run import Cell, StudyConfig, shortened

STUDY_FILE = "study.json"
STUDY_FORMAT = 2
STUDY_LOCK = "study.lock"
_CLAIMED: dict[str, int] = {}  # run roots this process holds the study lock of (fd per root)


def study_description(cells: list[Cell], config: StudyConfig) -> dict[str, Any]:
    """What ``study.json`` holds: the cells and the experiment settings, each named so a
    difference can be stated."""
    return {
        "format_version": STUDY_FORMAT,
        "tasks": sorted({c.task for c in cells}),
        "methods": {name: asdict(m) for name, m in sorted({c.method.name: c.method for c in cells}.items())},
        "seeds": sorted({c.seed for c in cells}),
        "budgets": {t: sorted({c.budget for c in cells if c.task == t}) for t in sorted({c.task for c in cells})},
        "profiles": sorted({c.profile for c in cells}),
        "verifiers": sorted({c.verifier for c in cells}),
        "options": [dict(o) for o in {canonical_json(c.options): c.options for c in cells}.values()],
        "decoding": list({canonical_json(asdict(c.decoding)): asdict(c.decoding) for c in cells}.values()),
        **{f"config.{k}": v for k, v in config.experiment().items()},
        "cells": [{**{k: v for k, v in asdict(c).items() if k != "resolved"}, "method": asdict(c.method)}
                  for c in cells],
    }


class StudyInUse(HeldoutError):
    """Another process is running (or resuming) the study in this run dir."""


def claim_study_dir(root: Path) -> None:
    """Hold an exclusive lock on the study in ``root`` for the rest of this process (the kernel
    releases it when the process ends, so kill -9 then ``--resume`` works). Idempotent within one
    process; a second process gets :class:`StudyInUse` naming the holder, and writes nothing."""
    key = str(root.resolve())
    if key in _CLAIMED:
        return
    try:
        _CLAIMED[key] = hold_lock(root / STUDY_LOCK)
    except LockHeld as held:
        raise StudyInUse(f"{root} is in use by another study process ({held.holder}): one study process per "
                         "run dir; wait for it to finish, then --resume") from None


def open_study(cells: list[Cell], config: StudyConfig, *, resume: bool | None = False) -> Path:
    """Claim ``config.run_root`` for this study. A new dir gets ``study.json``; an existing one
    is continued only with ``resume`` (``None``: continue when the settings are the same) and
    only when its settings equal these; otherwise :class:`ExperimentMismatch` names the
    differing settings. Nothing is written to an existing study dir that is refused (the caller
    runs :func:`check_infrastructure` first, so a study that cannot run writes nothing). The dir is
    then held by this process (:func:`claim_study_dir`): two ``--resume`` started together on one
    study get one runner and one clear :class:`StudyInUse`, never a torn ``study.json``."""
    root = Path(config.run_root)
    _settle_study(root, cells, config, resume, write=False)  # refuse before touching anything
    root.mkdir(parents=True, exist_ok=True)
    claim_study_dir(root)
    # what a study killed mid-write left (a temp file never renamed into place) goes now, while
    # this process holds the dir and nothing of it runs yet
    remove_stale_temp_files(root)
    return _settle_study(root, cells, config, resume, write=True)  # again: the dir may have changed meanwhile


def _settle_study(root: Path, cells: list[Cell], config: StudyConfig, resume: bool | None, *, write: bool) -> Path:
    path = root / STUDY_FILE
    wanted = study_description(cells, config)
    if not path.exists():
        if resume is True:
            raise HeldoutError(f"nothing to resume: {root} holds no study ({STUDY_FILE}); drop --resume to start one")
        if root.exists() and any(p.name != STUDY_LOCK for p in root.iterdir()):
            raise ExperimentMismatch(f"{root} is not empty and holds no {STUDY_FILE}; use a new run dir")
        if write:
            write_text_atomically(path, json.dumps(wanted, indent=1))
        return path
    recorded = split_study_options(read_user_json(path, "the study's record", error=ExperimentMismatch))
    differing = [f"{key}: {shortened_json(recorded.get(key))} -> {shortened_json(wanted.get(key))}"
                 for key in wanted if key != "cells" and canonical_json(recorded.get(key)) != canonical_json(wanted[key])]
    if differing:
        raise ExperimentMismatch(f"{root} holds another study; it differs in {'; '.join(differing)}. "
                                 "Use a new run dir (nothing in this one was changed)")
    if resume is False:
        raise ExperimentMismatch(f"{root} already holds this study; pass --resume to continue it "
                                 "(finished cells are kept, interrupted ones resume from their ledgers)")
    return path


def split_study_options(recorded: Any) -> Any:
    """A ``study.json`` as this heldout writes it: one written before issue 59 kept the decoding
    settings among each ``options`` (and had no ``decoding``); they are split as the cells split them."""
    if not isinstance(recorded, dict) or "decoding" in recorded or not isinstance(recorded.get("options"), list):
        return recorded
    parts = [(stated_decoding(o), without_decoding(o))
             for o in recorded["options"] if isinstance(o, dict)]
    return {**recorded, "options": list({canonical_json(t): t for _, t in parts}.values()),
            "decoding": list({canonical_json(d): d for d, _ in parts}.values())}


def shortened_json(value: Any) -> str:
    return shortened(canonical_json(value))


__all__ = ["STUDY_FILE", "STUDY_FORMAT", "STUDY_LOCK", "StudyInUse", "claim_study_dir", "open_study",
           "study_description"]
