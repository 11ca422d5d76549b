"""Gather run records for a report: find them, check each against its ledger, group them.

Rule: a run counts only when its ledger verifies *and* its run record is the one the session
wrote (its sha256 is in the ledger's ``session_end`` entry, see
:func:`heldout.evaluators.records.anchor_problem`), with the same head hash and entry count and
the same held-out scores as the ledger's ``test_scoring`` entries. An edited ``run_record.json``
is therefore excluded (the reason names the file) and can never change a table. Anything else
that does not verify is excluded and listed with the reason, never silently dropped or used.

Pooling rule: runs of one task whose worker model, profile, budget, visibility policy or
verifier differ are never pooled: each group gets its own label (``task [worker model: x]``,
naming only the settings that differ), so tables and the gate treat them as separate rows.

API (kept stable for the gate): :func:`collect_runs` -> :class:`RunSet` with ``runs`` (verified,
finished), ``failed``, ``excluded`` (path + reason) and ``cells()``; :func:`pooling_conflicts`
names the settings in which two run sets differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from heldout.contracts import HeldoutError, MetricSpec, Verdict
from heldout.files import lock_holder, read_user_json
from heldout.evaluators.ledger import LEDGER_FILE, LOCK_FILE, MAX_RECORD_BYTES, LedgerError, read_entries, verify_ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord, anchor_problem
from heldout.protocols.folders import GENERALISATION_DIR, LEAK_ABLATION_DIR, LEAK_RESULT_FILE, RECIPE_DIR, VERIFIER_ABLATION_DIR


class ReportError(HeldoutError):
    """The runs cannot make the requested report or check (nothing found, nothing to pair...)."""


@dataclass
class Run:
    """One verified run: its record, the directory it came from, and the task label tables use
    (the task name, plus ``[profile]`` when the report holds that task under two profiles)."""

    path: Path
    record: RunRecord
    label: str = ""
    ledger: list[dict[str, Any]] | None = field(default=None, repr=False)
    """The ledger entries as verified, when :func:`collect_runs` was asked to keep them (the
    results store loads these, not a later read of a file that may have changed since)."""
    _test_scores: dict[str, float] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.label = self.label or self.record.task

    @property
    def metric(self) -> MetricSpec:
        """The metric the run's record states (a record from before directions: higher is better)."""
        return MetricSpec.from_record(self.record.experiment)

    def test_scores(self) -> dict[str, float]:
        """Per held-out example, the value it counts as: its score, or the metric's
        ``failure_score`` when the verdict is invalid (a crash is never the best cost). Read once
        per run: the tables ask for it per example."""
        if self._test_scores is None:
            metric = self.metric
            self._test_scores = {v["example_id"]: metric.reading(Verdict.from_dict(v))
                                 for v in self.record.test_verdicts}
        return dict(self._test_scores)


@dataclass(frozen=True)
class Excluded:
    """A run left out of every table and test, and why."""

    path: Path
    reason: str
    # the cell it belongs to, where its ledger names it (so the tables can mark the cell's row)
    task: str | None = None
    method: str | None = None
    seed: int | None = None

    @property
    def incomplete(self) -> bool:
        """Its infrastructure failed: the cell has no score yet, and --resume gives it one."""
        return self.reason.startswith("INCOMPLETE")


PROTOCOL_FOLDERS = {LEAK_ABLATION_DIR: "leak ablate (topic-shared leakage ablation)",
                    VERIFIER_ABLATION_DIR: "compare verifiers (canonical re-scoring of each variant)",
                    GENERALISATION_DIR: "protocol generalisation (the protocol's own ledger: design, answer, reading)",
                    RECIPE_DIR: "recipe baseline (each final candidate minus its answer key, scored)"}
"""Folders a protocol command writes inside a study's run dir: a ledger of its own scoring, no
run record. They are not runs (never "interrupted") and never enter a table."""


@dataclass
class ProtocolFolder:
    """A protocol command's folder (see :data:`PROTOCOL_FOLDERS`): what wrote it, how many
    ledger entries it holds and whether its ledger verifies."""

    path: Path
    kind: str
    entries: int
    verified: bool
    summary: list[str] = field(default_factory=list)

    def describe(self) -> str:
        state = "ledger verifies" if self.verified else "LEDGER DOES NOT VERIFY"
        return (f"protocol folder {self.path}: {self.kind}, {self.entries} ledger entries, {state}"
                + "".join(f"; {line}" for line in self.summary))


def protocol_folder(run_dir: Path) -> ProtocolFolder | None:
    """The protocol folder ``run_dir`` is, or None: a known folder name, a ledger, no run record,
    and a first entry that is not a session's (an interrupted session starts with
    ``session_start`` and stays an interrupted run)."""
    if run_dir.name not in PROTOCOL_FOLDERS or (run_dir / RECORD_FILE).exists():
        return None
    try:
        entries, _ = read_entries(run_dir / LEDGER_FILE)
    except LedgerError:
        return None
    if not entries or entries[0].get("kind") == "session_start":
        return None
    folder = ProtocolFolder(run_dir, PROTOCOL_FOLDERS[run_dir.name], len(entries), verify_ledger(run_dir).ok)
    ends = [e.get("data") or {} for e in entries if e.get("kind") == "generalisation_end"]
    if run_dir.name == GENERALISATION_DIR:
        folder.summary.append(f"answer {ends[-1].get('answer')!r}" if ends else "no answer yet (the protocol has not "
                                                                                "finished; re-run its command)")
    if run_dir.name == RECIPE_DIR:
        folder.summary.append(f"{sum(e.get('kind') == 'recipe' for e in entries)} recipe(s) built")
    result = run_dir / LEAK_RESULT_FILE
    if run_dir.name == LEAK_ABLATION_DIR and result.is_file():
        try:
            data = read_user_json(result, LEAK_RESULT_FILE, max_bytes=MAX_RECORD_BYTES, error=ReportError)
            for m in data.get("methods", []):
                folder.summary.append(f"{m['task']} [{m['profile']}] {m['method']}: reading {m.get('reading_rule')!r}"
                                      + ("" if m.get("topic_disjoint", True) else ", NOT PROVEN topic-disjoint"))
        except (ReportError, ValueError, KeyError, TypeError):
            folder.summary.append(f"{LEAK_RESULT_FILE} unreadable")
    return folder


@dataclass
class RunSet:
    """Verified runs (status ``ok``), failed runs (the optimizer crashed: no held-out score),
    excluded runs (ledger or record does not verify, or a duplicate cell) and the protocol
    folders found beside them."""

    runs: list[Run] = field(default_factory=list)
    failed: list[Run] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    protocols: list[ProtocolFolder] = field(default_factory=list)
    def tasks(self) -> list[str]:
        return sorted({r.label for r in self.runs})

    def methods(self) -> list[str]:
        return sorted({r.record.method for r in self.runs})

    def metric(self, task: str) -> MetricSpec:
        """The metric of a task label's runs: one spec, or :class:`ReportError` when its runs
        disagree on it (a cost read as a score would turn every "better" around)."""
        specs = {run.metric for run in self.runs + self.failed if run.label == task}
        if len(specs) > 1:
            raise ReportError(f"runs of {task} state different metrics ("
                              + "; ".join(sorted(f"{s.name}, {s.direction}" for s in specs))
                              + "): compare runs of one task version")
        return specs.pop() if specs else MetricSpec("score")

    def cells(self) -> dict[tuple[str, str], dict[int, Run]]:
        """``(task label, method) -> {seed: run}`` over verified, finished runs."""
        out: dict[tuple[str, str], dict[int, Run]] = {}
        for run in self.runs:
            out.setdefault((run.label, run.record.method), {})[run.record.seed] = run
        return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}

    def settings(self, task: str | None = None) -> dict[str, list[str]]:
        """What every table must state, as the distinct values seen (one value when uniform)."""
        runs = [r for r in self.runs if task is None or r.label == task]
        seen: dict[str, set[str]] = {"profile": set(), "policy": set(), "budget": set(),
                                     "tolerance": set(), "drift": set(), "worker model": set(),
                                     "verifier": set(), "prompt setting": set(), "metric": set()}
        for run in runs:
            rec = run.record
            seen["profile"].add(rec.profile)
            seen["policy"].add(str(rec.policy.get("name", rec.policy)))
            seen["budget"].add(describe_budget(rec.budget))
            tol = rec.options.get("tolerance")
            seen["tolerance"].add("task default" if tol is None else f"{tol:g}")
            seen["drift"].add("none" if not rec.drift else f"{rec.task}: " + json.dumps(rec.drift, sort_keys=True))
            key = rec.pooling_key()
            seen["worker model"].add(key["worker model"])
            seen["verifier"].add(key["verifier"])
            seen["metric"].add(f"{run.metric.name} ({run.metric.direction})")
            setting = rec.experiment.get("prompt_setting")
            if setting:  # prompt tasks: the setting, how it was sent, whether it reproduces a published one
                sent_as = setting.get("sent_as")  # records before completions existed do not say
                sent = f", sent as a {sent_as}" if sent_as else ""
                seen["prompt setting"].add(f"{setting['name']}{sent} ({setting['reference']})")
        return {k: sorted(v) for k, v in seen.items()}


def describe_budget(budget: dict[str, Any]) -> str:
    parts = [f"{budget.get('metric_calls')} metric calls"]
    if budget.get("architect_tokens") is not None:
        parts.append(f"{budget['architect_tokens']} architect tokens")
    if budget.get("wall_seconds") is not None:
        parts.append(f"{budget['wall_seconds']:g} s wall")
    return ", ".join(parts)


def find_run_dirs(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Every directory under ``paths`` (recursively) that holds a run record or a ledger, in
    sorted order. A run dir with a ledger but no record is reported (interrupted run)."""
    seen: set[Path] = set()
    for root in paths:
        root = Path(root)
        if not root.exists():
            raise ReportError(f"run dir {root} does not exist")
        found = [root] if (root / RECORD_FILE).exists() or (root / LEDGER_FILE).exists() else []
        found += [p.parent for p in root.rglob(RECORD_FILE)] + [p.parent for p in root.rglob(LEDGER_FILE)]
        for run_dir in sorted(set(found)):
            resolved = run_dir.resolve()
            if resolved not in seen:
                seen.add(resolved)
                yield run_dir


def check_run(run_dir: Path) -> tuple[RunRecord | None, list[dict[str, Any]], str | None]:
    """``(record, ledger entries, None)`` when the run verifies, else ``(None, [], reason)``."""
    if not (run_dir / RECORD_FILE).exists():
        return None, [], _unfinished_reason(run_dir)
    try:
        record = RunRecord.load(run_dir)
    except (HeldoutError, TypeError) as exc:
        return None, [], f"run record unreadable: {exc}"
    ledger = verify_ledger(run_dir)
    if not ledger.ok:
        return None, [], "ledger does not verify: " + "; ".join(ledger.problems[:3])
    entries = ledger.checked  # one read: the entries verified are the entries compared
    problem = anchor_problem(record, entries, ledger.head, run_dir / RECORD_FILE)
    mismatch = problem or _header_mismatch(record, entries) or _test_scores_mismatch(record, entries)
    if mismatch:
        return None, [], mismatch
    if record.status == "ok" and not record.test_verdicts:
        return None, [], (f"{run_dir / RECORD_FILE}: no held-out example was scored (the profile's test split "
                          "is empty), so it has no held-out score")
    return record, entries, None


def _ledger_entries(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return read_entries(run_dir / LEDGER_FILE)[0]
    except LedgerError:
        return []


def _excluded(run_dir: Path, reason: str) -> Excluded:
    """An excluded run, with its cell as its ledger's ``session_start`` names it (when it does)."""
    start = next((e.get("data") or {} for e in _ledger_entries(run_dir) if e.get("kind") == "session_start"), {})
    seed = start.get("seed")
    return Excluded(run_dir, reason, start.get("task"), start.get("method"), seed if isinstance(seed, int) else None)


def _unfinished_reason(run_dir: Path) -> str:
    """Why a run dir has a ledger and no record: its infrastructure failed (the ledger's last
    ``session_incomplete`` entry says where) or the session was interrupted."""
    entries = _ledger_entries(run_dir)
    last = next((e for e in reversed(entries) if e.get("kind") in ("session_incomplete", "session_start",
                                                                    "session_resumed")), None)
    if last is not None and last["kind"] == "session_incomplete":
        data = last.get("data") or {}
        return (f"INCOMPLETE, no score: the infrastructure failed during {data.get('phase', '?')} "
                f"({str(data.get('error', ''))[:400]}); fix it and resume the study with --resume")
    holder = lock_holder(run_dir / LOCK_FILE)
    if holder is not None:  # its writer holds the ledger: running now, not interrupted
        return (f"RUNNING, no record yet: its session is still running (process {holder} holds its ledger); report "
                "again once the study has finished")
    return "no run record (the session was interrupted before it finished; resume it)"


def _header_mismatch(record: RunRecord, entries: list[dict[str, Any]]) -> str | None:
    """Task, profile, seed, method and settings must be the ones the session started with."""
    start = next((e["data"] for e in entries if e["kind"] == "session_start"), None)
    if start is None:
        return "ledger has no session_start entry"
    fields = ("task", "profile", "seed", "method", "budget", "policy", "limits", "options", "drift")
    differing = [f for f in fields if json.dumps(start.get(f), sort_keys=True, default=str)
                 != json.dumps(getattr(record, f), sort_keys=True, default=str)]
    if differing:
        return f"run record's {', '.join(differing)} differ from the ledger's session_start"
    return None


def _test_scores_mismatch(record: RunRecord, entries: list[dict[str, Any]]) -> str | None:
    """The held-out scores a report uses must be the ones the ledger holds."""
    ledger_scores = {e["data"]["example_id"]: float(e["data"]["verdict"]["score"]) for e in entries
                     if e["kind"] == "test_scoring" and e["data"]["candidate_id"] == record.final_candidate_id}
    record_scores = record.verdict_scores("test")
    if record_scores != ledger_scores:
        differing = sorted(k for k in set(record_scores) | set(ledger_scores)
                           if record_scores.get(k) != ledger_scores.get(k))
        return (f"run record's held-out scores differ from its ledger on {len(differing)} example(s) "
                f"(first: {differing[:3]})")
    return None


def collect_runs(paths: Iterable[str | Path], keep_ledgers: bool = False,
                 on_counted: Callable[[Run, list[dict[str, Any]]], None] | None = None) -> RunSet:
    """Load and verify every run under ``paths``. Raises :class:`ReportError` when no run dir
    is found at all; excluded runs are returned, not raised (the report lists them).
    ``keep_ledgers``: keep each run's verified ledger entries on it (``Run.ledger``).
    ``on_counted(run, entries)``: called with each run as it is counted, and its ledger entries
    as verified, which are then let go (a reader of every entry holds one ledger at a time)."""
    result = RunSet()
    by_key: dict[tuple[str, str, str, int], Run] = {}
    any_found = False
    for run_dir in find_run_dirs(paths):
        any_found = True
        folder = protocol_folder(run_dir)
        if folder is not None:
            result.protocols.append(folder)
            continue
        record, entries, reason = check_run(run_dir)
        if record is None:
            result.excluded.append(_excluded(run_dir, reason or "unknown"))
            continue
        run = Run(run_dir, record, ledger=entries if keep_ledgers else None)
        key = (record.task, record.method, record.seed, json.dumps(record.pooling_key(), sort_keys=True))
        if key in by_key:
            result.excluded.append(Excluded(run_dir, f"duplicate of {by_key[key].path} (same task, settings, "
                                                     f"method and seed); only the first is used"))
            continue
        by_key[key] = run
        (result.runs if record.status == "ok" else result.failed).append(run)
        if on_counted is not None:
            on_counted(run, entries)
    if not any_found:
        raise ReportError("no run records found under " + ", ".join(str(p) for p in paths))
    _label_profiles(result)
    return result


POOLING_SETTINGS = ("profile", "examples", "worker model", "budget", "policy", "verifier")


def _label_profiles(runs: RunSet) -> None:
    """Runs of one task that differ in a pooling setting are different comparisons: label them
    apart, naming only the settings that differ (e.g. ``bbh/x [worker model: m2]``)."""
    keys: dict[str, list[dict[str, str]]] = {}
    for run in runs.runs + runs.failed:
        keys.setdefault(run.record.task, []).append(run.record.pooling_key())
    differing_by_task = {task: _differing_settings(seen) for task, seen in keys.items()}
    for run in runs.runs + runs.failed:
        differing = differing_by_task[run.record.task]
        if differing:
            mine = run.record.pooling_key()
            run.label = f"{run.record.task} [" + "; ".join(
                mine[s] if s == "profile" else f"{s}: {_compact(mine[s])}" for s in differing) + "]"


def _differing_settings(keys: list[dict[str, str]]) -> list[str]:
    """The pooling settings in which one task's runs differ (computed once per task: per run,
    it made collecting a 10,000-run study quadratic)."""
    differing = [s for s in POOLING_SETTINGS if len({k[s] for k in keys}) > 1]
    if "profile" in differing and len({(k["profile"], k["examples"]) for k in keys}) == \
            len({k["profile"] for k in keys}):
        differing.remove("examples")  # other profiles hold other examples: the name says it
    return differing


def _compact(value: str) -> str:
    try:
        data = json.loads(value)
    except ValueError:
        return value
    return describe_budget(data) if isinstance(data, dict) and "metric_calls" in data else value


def pooling_conflicts(a: RunSet, b: RunSet) -> list[str]:
    """The pooling settings (worker model, profile, budget, policy, verifier) in which two run
    sets differ, per task, as ``"task: setting a -> b"``; empty when they can be compared."""
    out = []
    def values(rs: RunSet, task: str, setting: str) -> set[str]:
        return {r.record.pooling_key()[setting] for r in rs.runs if r.record.task == task}
    for task in sorted({r.record.task for r in a.runs} & {r.record.task for r in b.runs}):
        for setting in POOLING_SETTINGS:
            va, vb = values(a, task, setting), values(b, task, setting)
            if va != vb:
                out.append(f"{task}: {setting} {' | '.join(sorted(va))} -> {' | '.join(sorted(vb))}")
    return out
