"""The identity rule: a run dir holds one experiment.

What a run dir holds (its ledger's ``session_start``, a record's ``experiment``) is compared with
the experiment asked for, setting by setting (:func:`experiment_differences`), whichever heldout
wrote it: an old entry that kept the decoding among its task options is read split
(:func:`split_experiment`), so an old run dir resumes and verifies. Where and when a run happened
(:data:`CIRCUMSTANCES`) and where a model is served (:data:`WHERE_NOT_WHAT`) are not the
experiment. A session refuses to resume on any difference, naming each
(:func:`check_resumable`, :class:`ExperimentMismatch`); a study refuses a finished cell's record
and a study dir's ``study.json`` the same way (:mod:`heldout.protocols.run`,
:mod:`heldout.protocols.study_dir`). What the experiment is, and how a session describes it, is
:func:`heldout.evaluators.records.describe_experiment`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from heldout.contracts import HeldoutError, canonical_json
from heldout.evaluators.scoring import DECODING_OPTIONS, Decoding, without_decoding

# settings that describe *where and when* a run happened, not *what* was run: a resumed session
# may differ in them (they are recorded again in its ``session_resumed`` entry)
CIRCUMSTANCES = ("environment", "started_at")


class ExperimentMismatch(HeldoutError):
    """A run dir re-opened for a different experiment (other task, method, seed, budget...)."""


#: where a model is served, not which model answers: a session whose endpoint died resumes against
#: the same model on another address (the models are named; the record keeps each address it used)
WHERE_NOT_WHAT = frozenset({"base_url"})


def stated_decoding(options: Mapping[str, Any]) -> dict[str, Any]:
    """The decoding a combined ``options`` mapping states (every :class:`Decoding` field; an unset
    one at its default), read as written: an old file's values are compared, not judged."""
    return {**asdict(Decoding()), **{k: options[k] for k in DECODING_OPTIONS if k in options}}


def split_experiment(experiment: Mapping[str, Any]) -> dict[str, Any]:
    """``experiment`` (a ``session_start`` entry, a record's ``experiment``) with its task options
    and its decoding apart, whichever heldout wrote it. Since issue 59 ``options`` are the task
    options and ``decoding`` is ``{"stated", "sent"}``; before, ``options`` held the decoding
    settings a study stated among the task options and ``decoding`` was the worker's decoding as
    sent: such an entry is read as the new form says it, so an old run dir resumes and verifies."""
    out = dict(experiment)
    options = out.get("options")
    if not isinstance(options, Mapping):
        return out
    decoding = out.get("decoding")
    if isinstance(decoding, Mapping) and "stated" not in decoding:  # the form written before issue 59
        stated = stated_decoding(options)
        out["decoding"] = {"stated": stated, "sent": {**decoding, "judge_temperature": stated["judge_temperature"],
                                                      "judge_max_tokens": stated["judge_max_tokens"]}}
    out["options"] = without_decoding(options)
    return out


def experiment_differences(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The settings (``name: recorded -> now``) in which ``now`` differs from the experiment a
    ledger started (each read by :func:`split_experiment`, so a ledger written before decoding had
    its own field compares as one written since). Circumstances (environment, start time) are not
    the experiment."""
    recorded, now = split_experiment(recorded), split_experiment(now)
    out = []
    for key in sorted(set(recorded) | set(now)):
        if key in CIRCUMSTANCES or key == "format_version":
            continue
        if key not in recorded:
            continue  # the ledger predates this field: nothing to compare against
        a, b = recorded.get(key), now.get(key)
        if canonical_json(a) == canonical_json(b):
            continue
        if isinstance(a, dict) and isinstance(b, dict):  # name the sub-settings that differ
            out += [f"{key}.{sub}: {_short(a.get(sub))} -> {_short(b.get(sub))}" for sub in sorted(set(a) | set(b))
                    if canonical_json(a.get(sub)) != canonical_json(b.get(sub)) and sub not in WHERE_NOT_WHAT]
        else:
            out.append(f"{key}: {_short(a)} -> {_short(b)}")
    return out


def _short(value: Any, limit: int = 80) -> str:
    text = canonical_json(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_same_experiment(recorded: Mapping[str, Any] | None, now: Mapping[str, Any], run_dir: str | Path) -> None:
    """Raise :class:`ExperimentMismatch` naming every differing setting."""
    if recorded is None:
        raise ExperimentMismatch(f"{run_dir} holds a ledger without a session_start entry; use a new run dir")
    differing = experiment_differences(recorded, now)
    if differing:
        raise ExperimentMismatch(
            f"{run_dir} holds another experiment ({recorded.get('task')} / {recorded.get('method')} / "
            f"seed {recorded.get('seed')}); it differs in {'; '.join(differing)}. "
            "Use a new run dir (nothing in this one was changed)")


def check_resumable(entries: Iterable[Mapping[str, Any]], now: Mapping[str, Any], run_dir: str | Path) -> None:
    """One run dir = one experiment: :class:`ExperimentMismatch` for a ledger (its ``entries``)
    that another experiment started (:func:`check_same_experiment`) or that holds a finished session."""
    entries = list(entries)
    check_same_experiment(next((e["data"] for e in entries if e["kind"] == "session_start"), None), now, run_dir)
    if any(e["kind"] == "session_end" for e in entries):
        raise ExperimentMismatch(f"{run_dir} holds a finished session (its ledger has a session_end entry); "
                                 "nothing to resume, use a new run dir")
