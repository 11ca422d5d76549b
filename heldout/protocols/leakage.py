"""The topic-shared leakage ablation: its runner (:func:`ablate`).

Its rooms: the leak scan (:mod:`heldout.protocols.leak_scan`: which training questions and
answers a candidate's text holds, its answer-key share, the families it memorised, and which
val/test/probe data it holds beyond the task's chance overlap; ``leak scan`` exits 1 on any red
flag), the statistics of one subset (:mod:`heldout.protocols.leak_statistics`) and the reading
rules (:mod:`heldout.protocols.leak_readings`).

**Topic-shared ablation** (:func:`ablate`): for the baseline (the task's seed candidate) and
every optimised final candidate of a study's run dir, score with no further search on

* ``test``: the topic-disjoint held-out split;
* ``train``: the exact training questions, and ``train_encoded``: those the candidate's key holds;
* ``probe_memorised`` / ``probe_other``: the ``shared_topic_probe`` pool (fresh questions from
  training families) split by whether the candidate memorised that family;

and report per subset the mean paired gain over the baseline. **The verdict** ("higher" /
"lower") is the seed-paired contrast of :mod:`heldout.protocols.decide` (the unit is the seed:
each seed's mean score of its final candidate against the baseline's on the same subset, paired
by seed), Holm-adjusted over every row the command prints; an interval resampling seeds then
examples, exact sign and Wilcoxon tests over examples and an exact sign-flip over seeds are
printed beside it as description, never as a verdict. The reading is generated from the decided
signs by the table :data:`~heldout.protocols.leak_readings.READINGS`. ``split check`` runs first:
a profile not proven topic-disjoint is said loudly (NOT PROVEN, in the notes, every reading and the JSON), and no
reading then calls a held-out gain a rule. The scoring runs through the session's
:class:`Scorer` and every verdict is appended to the hash-chained ledger ``RUN_DIR/ablation/``;
a re-run scores afresh and appends (results are never read back from a ledger, as for the
harness's held-out scoring). Each run of it is one session of the chain, ``ablation_start`` to
``ablation_end``; one stopped mid-way (a stop, a dead endpoint) ends ``status: incomplete``, so its
scorings are never read as a finished ablation's beside the re-run's."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from heldout.benchmarks.loading import Task, load_task
from heldout.contracts import Candidate, HeldoutError, candidate_id, json_safe
from heldout.files import lock_holder, write_text_atomically
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Scorer
from heldout.models import DEPLOYMENT
from heldout.optimizers.placebo import placebo_candidate
from heldout.protocols.decide import RULES, holm, replicates_nothing
from heldout.protocols.folders import LEAK_ABLATION_DIR, LEAK_RESULT_FILE
from heldout.protocols.leak_readings import reading
from heldout.protocols.leak_scan import scan_candidate
from heldout.protocols.leak_statistics import MethodAblation, subset_gain
from heldout.protocols.minimum_budgets import check_minimum_budgets, recorded_cells
from heldout.protocols.placebo import PLACEBO_METHOD, draws_for, placebo_seeds, stratum
from heldout.protocols.splits import PROBE, SplitCheck, check_profile
from heldout.protocols.study_dir import STUDY_LOCK

SUBSETS = ("test", "train", "train_encoded", "probe_memorised", "probe_other")


@dataclass
class Ablation:
    run_dir: str
    baseline: str
    methods: list[MethodAblation]
    metric_calls: int
    notes: list[str] = field(default_factory=list)
    family: int = 0  # rows Holm-adjusted together

    @property
    def topic_disjoint(self) -> bool:
        return all(m.topic_disjoint for m in self.methods)

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "baseline": self.baseline, "metric_calls": self.metric_calls,
                "notes": self.notes, "topic_disjoint": self.topic_disjoint, "family": self.family,
                "rule": RULES["seed-paired-contrast"].name, "unit": RULES["seed-paired-contrast"].unit,
                "methods": [m.to_dict() for m in self.methods]}

    def describe(self) -> str:
        lines = [f"topic-shared leakage ablation of {self.run_dir} (baseline: {self.baseline}; "
                 f"{self.metric_calls} metric calls scored and ledgered in {LEAK_ABLATION_DIR}/)"]
        lines.append(f"verdicts: seed-paired contrast (unit: the seed; final vs baseline per seed), Holm over the "
                     f"{self.family} rows printed with examples; example-level sign / Wilcoxon p are description only")
        lines += [f"note: {n}" for n in self.notes]
        for m in self.methods:
            lines.append(f"\n{m.task} [{m.profile}] {m.method}, seeds {m.seeds}: answer-key share "
                         + ", ".join(f"{s:.1%}" for s in m.key_share))
            lines.append(f"  split check: {m.split_check}" if m.topic_disjoint else
                         f"  split check: NOT PROVEN topic-disjoint: {m.split_check}")
            lines.append(f"  {'subset':<16} {'n':>5} {'seeds':>5} {'gain':>8} {'seed CI':>19} {'Holm p':>8} "
                         f"{'verdict':>8} | {'ex. sign p':>10} {'wilcoxon':>8}")
            for r in m.rows:
                if r.gain is None or r.seed_contrast is None:
                    lines.append(f"  {r.subset:<16} {r.n_examples:>5} {r.n_seeds:>5}  (no examples)")
                    continue
                c = r.seed_contrast
                ci_text = f"[{c.low:+.3f}, {c.high:+.3f}]"
                verdict = "1 run" if replicates_nothing(c) else {"+": "higher", "-": "lower", "0": "-"}[r.sign]
                lines.append(f"  {r.subset:<16} {r.n_examples:>5} {r.n_seeds:>5} {r.gain:>+8.3f} {ci_text:>19} "
                             f"{c.p_holm:>8.3g} {verdict:>8} | {r.sign_test_p:>10.3g} {r.wilcoxon_p:>8.3g}")
            lines.append(f"  {'val (selection)':<16} {'':>5} {'':>5} "
                         + (f"{m.val_gain:>+8.3f}" if m.val_gain is not None else "       -"))
            lines.append("  reading: " + m.reading)
        return "\n".join(lines)


def find_records(run_dir: str | Path) -> list[RunRecord]:
    """Every finished run record under ``run_dir`` (the ablation's own folder excluded)."""
    root = Path(run_dir)
    paths = sorted(p for p in root.rglob(RECORD_FILE) if LEAK_ABLATION_DIR not in p.relative_to(root).parts)
    return [RunRecord.load(p.parent) for p in paths]


class _AblationScorer:
    """Scores each (candidate, pool) once per ablation, through the session's Scorer, appending
    every verdict to the ablation ledger. Like the harness's held-out scoring, results are always
    fresh: nothing already in a ledger is read back as a result."""

    def __init__(self, ledger: Ledger, scorer_for: Mapping[str, Scorer]) -> None:
        self.ledger = ledger
        self.scorer_for = scorer_for
        self.usage = Usage()
        self.done: dict[tuple[str, str, str], float] = {}
        self.known: set[str] = set()

    def scores(self, task: Task, candidate: Candidate, pool: str) -> dict[str, float]:
        cid = candidate_id(candidate)
        if cid not in self.known:
            self.known.add(cid)
            self.ledger.append_entry("candidate", {"candidate_id": cid, "components": dict(candidate)})
        examples = task.splits.get(pool, [])
        todo = [ex for ex in examples if (task.name, cid, ex.id) not in self.done]
        verdicts = self.scorer_for[task.name].score_all(candidate, todo, DEPLOYMENT, self.usage,
                                                        f"leak ablation of {task.name} ({pool})") if todo else []
        self.usage.charge(len(todo))
        for ex, verdict in zip(todo, verdicts):
            self.ledger.append_entry("ablation_scoring", {"task": task.name, "profile": task.profile, "pool": pool,
                                                          "candidate_id": cid, "example_id": ex.id,
                                                          "verdict": verdict.to_dict()})
            self.done[(task.name, cid, ex.id)] = verdict.score
        return {ex.id: self.done[(task.name, cid, ex.id)] for ex in examples}


def ablate(run_dir: str | Path, *, baseline: str = "seed", worker=None, data_dir: str | None = None,
           jobs: int = 2, n_boot: int = 4000) -> Ablation:
    """The topic-shared leakage ablation of every finished run under ``run_dir`` (see the module
    docstring). ``baseline`` is ``"seed"`` (the task's seed candidate) or a method name, whose
    final candidate of the same seed is the baseline of each run."""
    for lock in sorted(Path(run_dir).rglob(STUDY_LOCK)):  # a study still running: its finished runs are a part
        holder = lock_holder(lock)
        if holder is not None and holder != os.getpid():
            raise HeldoutError(f"the study in {lock.parent} is still running (process {holder} holds it): an "
                               "ablation now would be of the runs finished so far; run it once the study has finished")
    records = [r for r in find_records(run_dir) if r.status == "ok" and r.final_candidate]
    if not records:
        raise HeldoutError(f"no finished run records under {run_dir}")
    # a run below its method's minimum is the seed under the method's name: no gain of it is the method's
    check_minimum_budgets(recorded_cells(records), "leak ablate", "re-run it with at least that budget")
    ledger = Ledger.open(Path(run_dir) / LEAK_ABLATION_DIR)
    ledger.append_entry("ablation_start", {"baseline": baseline, "runs": len(records)})
    tasks: dict[tuple[str, str], Task] = {}
    for rec in records:
        if (rec.task, rec.profile) not in tasks:
            tasks[(rec.task, rec.profile)] = load_task(rec.task, rec.profile, data_dir)
    scorers = {t.name: Scorer(t.benchmark, worker, None, rec_options(records, t.name), jobs, ledger=ledger)
               for t in tasks.values()}
    scoring = _AblationScorer(ledger, scorers)
    notes: list[str] = []
    methods: list[MethodAblation] = []
    family_size = 0
    finished = False
    try:
        for (task_name, profile), task in tasks.items():
            proven, verdict = split_verdict(check_profile(task))
            ledger.append_entry("ablation_split_check", {"task": task_name, "profile": profile, "topic_disjoint": proven,
                                                         "verdict": verdict})
            if not proven:
                notes.append(f"{task_name} [{profile}] is NOT PROVEN topic-disjoint ({verdict}): held-out gains "
                             "cannot be told from topic-level keys, and no reading calls them a rule")
            if PROBE not in task.splits:
                notes.append(f"{task_name} [{profile}] has no {PROBE} pool: the probe rows are empty "
                             "(build one with `heldout split build --probe K`)")
            group_records = [r for r in records if (r.task, r.profile) == (task_name, profile)]
            # placebo draws are the baseline's noise floor, not a method under study
            names = sorted({r.method for r in group_records if r.method not in (baseline, PLACEBO_METHOD)})
            for method in names:
                runs = sorted((r for r in group_records if r.method == method), key=lambda r: r.seed)
                m = _ablate_method(task, method, runs, group_records, baseline, scoring, n_boot)
                m.topic_disjoint, m.split_check = proven, verdict
                methods.append(m)
        family_size = decide_rows(methods)
        finished = True
    finally:
        # a stop or a dead endpoint mid-way: the session's scorings stay in the chain, marked as an
        # ablation that did not finish (a re-run scores afresh in a session of its own)
        ledger.append_entry("ablation_end", {"metric_calls": scoring.usage.metric_calls,
                                             "status": "ok" if finished else "incomplete"})
        ledger.close()
    result = Ablation(run_dir=str(run_dir), baseline=baseline, methods=methods,
                      metric_calls=scoring.usage.metric_calls, notes=notes, family=family_size)
    write_text_atomically(Path(run_dir) / LEAK_ABLATION_DIR / LEAK_RESULT_FILE, json.dumps(json_safe(result.to_dict()), indent=1, default=str))
    return result


def rec_options(records: Sequence[RunRecord], task: str) -> dict[str, Any]:
    """The options the runs used, their decoding among them (the ablation scores under the same ones)."""
    return next((r.options_as_stated for r in records if r.task == task), {})


def _baseline_for(task: Task, rec: RunRecord, group_records: Sequence[RunRecord], baseline: str) -> tuple[Candidate, RunRecord | None]:
    if baseline == "seed":
        return task.benchmark.seed_candidate(), None
    match = next((r for r in group_records if r.method == baseline and r.seed == rec.seed), None)
    if match is None:
        raise HeldoutError(f"baseline method {baseline!r} has no finished run with seed {rec.seed} "
                           f"for {task.name} [{task.profile}]")
    return dict(match.final_candidate), match


def _ablate_method(task: Task, method: str, runs: Sequence[RunRecord], group_records: Sequence[RunRecord],
                   baseline: str, scoring: _AblationScorer, n_boot: int) -> MethodAblation:
    by_subset: dict[str, list[dict[str, tuple[float, float]]]] = {s: [] for s in SUBSETS}
    floors: dict[str, list[list[float]]] = {s: [] for s in SUBSETS}
    val_gains, shares, families, flags = [], [], [], []
    candidates: set[tuple[str, str]] = set()  # (baseline, final) ids over seeds
    probe_groups = {ex.id: ex.group for ex in task.splits.get(PROBE, [])}
    for rec in runs:
        base_cand, base_rec = _baseline_for(task, rec, group_records, baseline)
        final = dict(rec.final_candidate)
        candidates.add((candidate_id(base_cand), candidate_id(final)))
        scan = scan_candidate(final, task)
        shares.append(scan.share)
        families.append(len(scan.memorised_families))
        flags.append(len(scan.red_flags))
        pairs: dict[str, dict[str, tuple[float, float]]] = {}
        for pool in ("test", "train", PROBE):
            if pool not in task.splits:
                pairs[pool] = {}
                continue
            b, f = scoring.scores(task, base_cand, pool), scoring.scores(task, final, pool)
            pairs[pool] = {i: (b[i], f[i]) for i in b}
        encoded = set(scan.encoded)
        memorised = set(scan.memorised_families)
        by_subset["test"].append(pairs["test"])
        by_subset["train"].append(pairs["train"])
        by_subset["train_encoded"].append({i: v for i, v in pairs["train"].items() if i in encoded})
        by_subset["probe_memorised"].append({i: v for i, v in pairs[PROBE].items() if probe_groups[i] in memorised})
        by_subset["probe_other"].append({i: v for i, v in pairs[PROBE].items() if probe_groups[i] not in memorised})
        # the seed's noise floor: this seed's placebo draws scored on the very same questions (the
        # study's placebo runs, else drawn here: a placebo reads no score, so drawing it is free)
        draws = [dict(r.final_candidate) for r in group_records if baseline == "seed" and r.method == PLACEBO_METHOD
                 and r.status == "ok" and r.final_candidate and stratum(r.seed) == rec.seed]
        if not draws and baseline == "seed" and task.kind == "prompt":
            draws = [placebo_candidate(dict(base_cand), seed)[0]
                     for seed in placebo_seeds([rec.seed], draws_for(len(runs), family=len(SUBSETS)))]
        placebo_scores = [{pool: scoring.scores(task, d, pool) if pool in task.splits else {}
                           for pool in ("test", "train", PROBE)} for d in draws]
        for name, pool in (("test", "test"), ("train", "train"), ("train_encoded", "train"),
                           ("probe_memorised", PROBE), ("probe_other", PROBE)):
            ids = list(by_subset[name][-1])
            floors[name].append([float(np.mean([ps[pool][i] for i in ids])) for ps in placebo_scores] if ids else [])
        final_val = rec.verdict_scores("val")
        base_val = base_rec.verdict_scores("val") if base_rec is not None else (
            scoring.scores(task, base_cand, "val") if task.splits.get("val") else {})
        common = [i for i in final_val if i in base_val]
        if common:
            val_gains.append(float(np.mean([final_val[i] - base_val[i] for i in common])))
    seeds = [r.seed for r in runs]
    rows = [subset_gain(s, by_subset[s], n_boot=n_boot, seeds=seeds, replayed=len(candidates) == 1,
                        floors=floors[s]) for s in SUBSETS]
    return MethodAblation(task=task.name, profile=task.profile, method=method, seeds=seeds,
                          rows=rows, val_gain=float(np.mean(val_gains)) if val_gains else None,
                          key_share=shares, families_memorised=families, red_flags=flags)


def decide_rows(methods: Sequence[MethodAblation]) -> int:
    """Holm-adjust the seed-paired contrasts of every row the ablation prints (all methods, all
    subsets with examples) together, then write each method's reading from the decided signs.
    Returns the family size."""
    slots = [(m, k) for m in methods for k, r in enumerate(m.rows) if r.seed_contrast is not None]
    adjusted = holm([m.rows[k].seed_contrast for m, k in slots])  # type: ignore[misc]
    for (m, k), c in zip(slots, adjusted):
        m.rows[k].seed_contrast = c
    for m in methods:
        m.reading = reading(m)
    return len(slots)


def split_verdict(check: SplitCheck) -> tuple[bool, str]:
    """(proven topic-disjoint, the split check's verdict line). A profile without topic groups
    proves nothing about topics, so it is not proven either."""
    grouped = any(c["groups"] for c in check.pools.values())
    line = check.describe().splitlines()[0]
    return check.ok and grouped, line + ("" if check.ok else ": " + "; ".join(check.problems))


__all__ = ["SUBSETS", "Ablation", "ablate", "decide_rows", "find_records",
           "rec_options", "split_verdict"]
