"""Answer keys in candidates, and the topic-shared leakage ablation.

**Leak scan** (:func:`scan_candidate`, in :mod:`heldout.protocols.leak_scan`): which training
questions and answers a candidate's text holds (its answer-key share, the examples it encodes,
the families it memorised, by verbatim runs or by family-level keys named by any word that ties
a text to a family), and which val/test/probe data it holds beyond the task's own chance overlap
(red flags, ``leak scan`` exits 1 on any).

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
signs by the table :data:`READINGS`. ``split check`` runs first: a profile not proven
topic-disjoint is said loudly (NOT PROVEN, in the notes, every reading and the JSON), and no
reading then calls a held-out gain a rule. The scoring runs through the session's
:class:`Scorer` and every verdict is appended to the hash-chained ledger ``RUN_DIR/ablation/``;
a re-run scores afresh and appends (results are never read back from a ledger, as for the
harness's held-out scoring)."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from heldout.benchmarks.loading import Task, load_task
from heldout.contracts import Candidate, HeldoutError, candidate_id
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.scoring import DEPLOYMENT, Scorer, Usage
from heldout.protocols.leak_scan import (LeakScan, MatchedSpan, ScanRules, candidate_text, scan_candidate,
                                         scan_examples)
from heldout.protocols.decide import RULES, Contrast, beyond_placebo, contrast, holm, replicates_nothing
from heldout.optimizers.placebo import placebo_candidate
from heldout.protocols.placebo import PLACEBO_METHOD, draws_for, placebo_seeds, stratum
from heldout.protocols.splits import PROBE, SplitCheck, check_profile
from heldout.protocols.stats import mean_interval, two_level_bootstrap
from heldout.protocols.stats.paired import wilcoxon_p

ABLATION_DIR = "ablation"
RESULT_FILE = "ablation.json"
SUBSETS = ("test", "train", "train_encoded", "probe_memorised", "probe_other")


# -- the report hook -----------------------------------------------------------------------------
def answer_key_rows(records: Iterable[RunRecord], *, data_dir: str | None = None,
                    prompt_only: bool = False) -> list[dict[str, Any]]:
    """One row per final candidate (task, profile, method, seed, share, encoded, families,
    red_flags), for a report's answer-key table. A task whose data cannot be loaded gives a row
    with ``share`` None and the reason, never an exception. ``prompt_only`` leaves out tasks that
    are not prompt tasks with training data."""
    tasks: dict[tuple[str, str], Task | str] = {}
    rows = []
    for rec in records:
        if not rec.final_candidate:
            continue
        key = (rec.task, rec.profile)
        if key not in tasks:
            try:
                tasks[key] = load_task(rec.task, rec.profile, data_dir)
            except HeldoutError as exc:
                tasks[key] = str(exc)
        row: dict[str, Any] = {"task": rec.task, "profile": rec.profile, "method": rec.method, "seed": rec.seed,
                               "candidate_id": rec.final_candidate_id}
        loaded = tasks[key]
        if isinstance(loaded, str):
            rows.append({**row, "share": None, "problem": loaded})
            continue
        if prompt_only and (loaded.kind != "prompt" or not loaded.splits.get("train")):
            continue  # a program, or a task with no training data: there is no answer key to hold
        scan = scan_candidate(rec.final_candidate, loaded)
        rows.append({**row, "share": scan.share, "words": scan.words, "encoded": len(scan.encoded),
                     "families": len(scan.memorised_families), "red_flags": len(scan.red_flags)})
    return rows


# -- statistics for one subset -------------------------------------------------------------------
@dataclass
class SubsetGain:
    """Paired gain ``final - baseline`` on one subset, over seeds x examples.

    The verdict is ``seed_contrast`` (see :attr:`separable`); everything else is description.
    ``ci_*``: a percentile interval resampling seeds, then examples (two-level, shared examples
    when every seed has the same ones, nested when the subset differs by seed; one seed: examples
    only). ``sign_test_p``: exact binomial sign test over examples (per-example gain averaged over
    seeds). ``wilcoxon_p``: signed-rank over the same. ``seed_flip_p``: exact sign-flip test
    over the per-seed mean gains (None with one seed; with < 5 seeds it cannot go below 0.0625)."""

    subset: str
    n_examples: int
    n_seeds: int
    baseline: float | None = None
    final: float | None = None
    gain: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str = ""
    sign_test_p: float | None = None
    wilcoxon_p: float | None = None
    seed_flip_p: float | None = None
    wins: int = 0
    losses: int = 0
    seed_contrast: Contrast | None = None
    """The verdict: :func:`heldout.protocols.decide.contrast` of the per-seed mean scores (final
    against baseline, paired by seed), Holm-adjusted over every row the ablation prints."""

    @property
    def separable(self) -> bool:
        """Decided by the seed-paired contrast (the unit is the seed), never by the example-level
        tests above, which are description only."""
        return self.seed_contrast is not None and self.seed_contrast.decided

    @property
    def sign(self) -> str:
        """"+" / "-" when the seed-paired contrast decides, else "0" (also with no examples)."""
        return self.seed_contrast.sign if self.seed_contrast is not None else "0"

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "seed_contrast"}
        return {**out, "separable": self.separable, "sign": self.sign,
                "seed_contrast": self.seed_contrast.as_dict() if self.seed_contrast is not None else None}


def subset_gain(subset: str, cells: Sequence[Mapping[str, tuple[float, float]]], *, n_boot: int = 4000,
                ci: float = 0.95, seed: int = 0, seeds: Sequence[int] | None = None,
                replayed: bool = False, floors: Sequence[Sequence[float]] | None = None) -> SubsetGain:
    """``cells[s]`` maps example id -> (baseline score, final score) for seed ``seeds[s]``
    (default: the position). The verdict is the seed-paired contrast of the per-seed means (a
    family of one here: :func:`ablate` Holm-adjusts every row it prints together); ``replayed``:
    every seed's baseline and final candidates are the same ones (see
    :func:`heldout.protocols.decide.replicates_nothing`). ``floors[s]``: the subset's mean score
    under each placebo draw of seed ``seeds[s]`` (neutral re-wordings of the seed); when every
    seed has some, the verdict is rule ``placebo-floor`` against them instead of the seed's one draw."""
    seed_ids = list(range(len(cells))) if seeds is None else [int(s) for s in seeds]
    if len(seed_ids) != len(cells):
        raise HeldoutError(f"subset_gain: {len(cells)} cells for {len(seed_ids)} seeds")
    kept = [(sid, c) for sid, c in zip(seed_ids, cells) if c]
    cells = [c for _, c in kept]
    if kept:
        base_means = {sid: float(np.mean([v[0] for v in c.values()])) for sid, c in kept}
        final_means = {sid: float(np.mean([v[1] for v in c.values()])) for sid, c in kept}
        by_seed = dict(zip(seed_ids, floors)) if floors is not None else {}
        if by_seed and all(by_seed.get(sid) for sid, _ in kept):
            contrast_ = beyond_placebo({sid: by_seed[sid] for sid, _ in kept}, final_means,
                                       n_examples=min(len(c) for c in cells), labels=("placebo", "final"),
                                       label=subset, alpha=1 - ci, replayed=replayed)
        else:
            contrast_ = contrast(base_means, final_means, n_examples=min(len(c) for c in cells),
                                 labels=("baseline", "final"), label=subset, alpha=1 - ci, replayed=replayed,
                                 examples=dict(kept))
    else:
        contrast_ = None
    ids = sorted({i for c in cells for i in c})
    out = SubsetGain(subset=subset, n_examples=len(ids), n_seeds=len(cells), seed_contrast=contrast_)
    if not cells:
        return out
    base = np.array([v[0] for c in cells for v in c.values()])
    fin = np.array([v[1] for c in cells for v in c.values()])
    out.baseline, out.final, out.gain = float(base.mean()), float(fin.mean()), float((fin - base).mean())
    per_example = np.array([np.mean([c[i][1] - c[i][0] for c in cells if i in c]) for i in ids])
    out.wins, out.losses = int((per_example > 0).sum()), int((per_example < 0).sum())
    untied = out.wins + out.losses
    out.sign_test_p = float(scipy_stats.binomtest(out.wins, untied, 0.5).pvalue) if untied else 1.0
    out.wilcoxon_p = wilcoxon_p(per_example)
    if len(cells) == 1:
        interval = mean_interval(per_example, n_boot=n_boot, ci=ci, seed=seed, method="percentile")
        out.ci_low, out.ci_high, out.ci_method = interval.low, interval.high, f"examples ({interval.method})"
    elif all(set(c) == set(ids) for c in cells):
        a = np.array([[c[i][0] for i in ids] for c in cells])
        b = np.array([[c[i][1] for i in ids] for c in cells])
        two = two_level_bootstrap(a, b, n_boot=n_boot, ci=ci, seed=seed, examples="shared")
        out.ci_low, out.ci_high, out.ci_method = two.ci_low, two.ci_high, "seeds x shared examples"
    else:
        out.ci_low, out.ci_high = _nested_ragged([np.array([v[1] - v[0] for v in c.values()]) for c in cells],
                                                 n_boot, ci, seed)
        out.ci_method = "seeds, then examples within seed"
    if len(cells) >= 2:
        out.seed_flip_p = _sign_flip_p(np.array([np.mean([v[1] - v[0] for v in c.values()]) for c in cells]))
    return out


def _nested_ragged(diffs: list[np.ndarray], n_boot: int, ci: float, seed: int) -> tuple[float, float]:
    """Percentile interval of the cell mean when seeds hold different examples: draw seeds with
    replacement, then examples with replacement within each drawn seed."""
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for k in range(n_boot):
        picked = [diffs[s] for s in rng.integers(0, len(diffs), len(diffs))]
        total = sum(float(d[rng.integers(0, len(d), len(d))].sum()) for d in picked)
        means[k] = total / sum(len(d) for d in picked)
    tail = (1 - ci) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def _sign_flip_p(seed_means: np.ndarray) -> float:
    """Exact two-sided sign-flip p of the mean of per-seed gains (all 2^S flips)."""
    observed = abs(seed_means.mean())
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=len(seed_means))))
    null = np.abs((flips * seed_means).mean(axis=1))
    return float((null >= observed - 1e-12).mean())


# -- the ablation ----------------------------------------------------------------------------------
@dataclass
class MethodAblation:
    task: str
    profile: str
    method: str
    seeds: list[int]
    rows: list[SubsetGain]
    val_gain: float | None
    key_share: list[float]  # per seed
    families_memorised: list[int]  # per seed
    red_flags: list[int]  # per seed
    reading: str = ""
    reading_rule: str = ""
    topic_disjoint: bool = True
    """False when ``split check`` does not prove the profile topic-disjoint (NOT PROVEN, or no
    topic groups to prove it with): the reading then says so and never calls a gain a rule."""
    split_check: str = ""

    def row(self, subset: str) -> SubsetGain:
        return next(r for r in self.rows if r.subset == subset)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"},
                "rows": [r.to_dict() for r in self.rows]}


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
                 f"{self.metric_calls} metric calls scored and ledgered in {ABLATION_DIR}/)"]
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
    paths = sorted(p for p in root.rglob(RECORD_FILE) if ABLATION_DIR not in p.relative_to(root).parts)
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
            self.ledger.append("candidate", {"candidate_id": cid, "components": dict(candidate)})
        examples = task.splits.get(pool, [])
        todo = [ex for ex in examples if (task.name, cid, ex.id) not in self.done]
        verdicts = self.scorer_for[task.name].score_all(candidate, todo, DEPLOYMENT, self.usage,
                                                        f"leak ablation of {task.name} ({pool})") if todo else []
        self.usage.charge(len(todo))
        for ex, verdict in zip(todo, verdicts):
            self.ledger.append("ablation_scoring", {"task": task.name, "profile": task.profile, "pool": pool,
                                                    "candidate_id": cid, "example_id": ex.id,
                                                    "verdict": verdict.to_dict()})
            self.done[(task.name, cid, ex.id)] = verdict.score
        return {ex.id: self.done[(task.name, cid, ex.id)] for ex in examples}


def ablate(run_dir: str | Path, *, baseline: str = "seed", worker=None, data_dir: str | None = None,
           jobs: int = 2, n_boot: int = 4000) -> Ablation:
    """The topic-shared leakage ablation of every finished run under ``run_dir`` (see the module
    docstring). ``baseline`` is ``"seed"`` (the task's seed candidate) or a method name, whose
    final candidate of the same seed is the baseline of each run."""
    records = [r for r in find_records(run_dir) if r.status == "ok" and r.final_candidate]
    if not records:
        raise HeldoutError(f"no finished run records under {run_dir}")
    ledger = Ledger.open(Path(run_dir) / ABLATION_DIR)
    ledger.append("ablation_start", {"baseline": baseline, "runs": len(records)})
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
    try:
        for (task_name, profile), task in tasks.items():
            proven, verdict = split_verdict(check_profile(task))
            ledger.append("ablation_split_check", {"task": task_name, "profile": profile, "topic_disjoint": proven,
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
    finally:
        ledger.append("ablation_end", {"metric_calls": scoring.usage.metric_calls})
        ledger.close()
    result = Ablation(run_dir=str(run_dir), baseline=baseline, methods=methods,
                      metric_calls=scoring.usage.metric_calls, notes=notes, family=family_size)
    (Path(run_dir) / ABLATION_DIR / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return result


def rec_options(records: Sequence[RunRecord], task: str) -> dict[str, Any]:
    """The task options the runs used (the ablation scores under the same ones)."""
    return next((dict(r.options) for r in records if r.task == task), {})


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


def _fmt(row: SubsetGain) -> str:
    if row.gain is None:
        return "n/a (no examples)"
    c = row.seed_contrast
    if c is not None and replicates_nothing(c):
        # one run re-scored by every seed: its per-question evidence, never a seed-level p
        ev = (f", one run: {c.changed[0]} up / {c.changed[1]} down, per-question p {c.p:.3g}"
              if c.changed is not None else ", one run re-scored by every seed")
        return f"{row.gain:+.3f} (n={row.n_examples}{ev})"
    holm_p = "" if c is None else f", Holm p {c.p_holm:.3g}"
    return f"{row.gain:+.3f} (n={row.n_examples}, {row.n_seeds} seeds{holm_p})"


# -- readings: a table of rules over the decided signs -------------------------------------------
READING_AXES = ("exact training questions", "fresh questions of memorised families",
                "fresh questions of other trained families", "held-out topics")
"""The four signs a reading is read from, in order: exact (``train_encoded`` when the candidate
holds a key, else ``train``), ``probe_memorised``, ``probe_other``, ``test``. Each is the sign of
that row's seed-paired contrast after Holm ("0" when undecided or empty)."""


@dataclass(frozen=True)
class ReadingRule:
    """One reading: the signs it applies to (per axis, the set of signs allowed) and its words.
    ``with_key`` replaces ``text`` when the candidate holds an answer key, ``without_key`` when it
    holds none (a gain on training questions without a key is no memorisation of one);
    ``unproven`` replaces it when the profile is not proven topic-disjoint (a held-out gain then
    cannot tell a rule from a topic-level key)."""

    name: str
    pattern: tuple[str, str, str, str]
    text: str
    with_key: str | None = None
    unproven: str | None = None
    without_key: str | None = None

    def matches(self, signs: Sequence[str]) -> bool:
        return all(s in allowed for s, allowed in zip(signs, self.pattern))


READINGS: tuple[ReadingRule, ...] = (
    ReadingRule("transfer", ("+0", "+0", "+0", "+"),
                "The gain transfers to held-out topics: a rule, not a key.",
                with_key="The gain transfers to held-out topics: the candidate holds a rule beside its key.",
                unproven="The gain reaches the held-out split, but that split is not proven topic-disjoint, "
                         "so it cannot tell a rule from a topic-level key."),
    ReadingRule("transfer-mixed", ("+-0", "+-0", "+-0", "+"),
                "Held-out topics gain while other subsets lose: neither a clean rule nor a key."),
    ReadingRule("key-displaces-rule", ("+", "+-0", "+-0", "-"),
                "Memorisation pays on the exact training questions while held-out topics lose: "
                "the key displaced what generalised.",
                without_key="The training questions gain while held-out topics lose, with no answer key in the "
                            "candidate: a training-split gain that did not generalise, not a key."),
    ReadingRule("worse", ("-0", "+-0", "+-0", "-"),
                "The final candidate is worse than the baseline on held-out topics."),
    ReadingRule("topic-level-key", ("+0", "+", "0", "0"),
                "Memorisation pays at the topic level: fresh questions of the memorised families gain, "
                "held-out topics do not (a topic-level answer key)."),
    ReadingRule("topic-shared", ("+0", "+0", "+", "0"),
                "Fresh questions of trained families gain, held-out topics do not: the gain stays "
                "within the training topics (topic-level), it is not a rule that reaches new topics."),
    ReadingRule("exact-only", ("+", "0", "0", "0"),
                "Memorisation pays on the exact training questions only.",
                without_key="Only the training questions gain, and the candidate holds no answer key: a "
                            "training-split gain, not memorisation of a key."),
    ReadingRule("nothing", ("0", "0", "0", "0"),
                "No subset separates from the baseline."),
    ReadingRule("mixed", ("+-0", "+-0", "+-0", "0"),
                "Held-out topics do not separate and the other subsets disagree: no single reading."),
)
"""First match wins; every one of the 3**4 sign patterns matches one rule
(``tests/test_leak_readings.py`` enumerates them and checks no reading contradicts its signs)."""


def reading_rule(signs: Sequence[str]) -> ReadingRule:
    """The first rule of :data:`READINGS` whose pattern admits ``signs``."""
    for rule in READINGS:
        if rule.matches(signs):
            return rule
    raise HeldoutError(f"no reading for signs {tuple(signs)}")  # the table is total; a test proves it


HELD_OUT_ROW = {True: "held-out topics", False: "the held-out split (topics not proven disjoint)"}
"""What the ``test`` row is called: "held-out topics" only on a profile proven topic-disjoint."""


def axis_names(topic_disjoint: bool) -> tuple[str, ...]:
    """:data:`READING_AXES`, with the held-out row named for what it is on this profile."""
    return READING_AXES[:3] + (HELD_OUT_ROW[topic_disjoint],)


def headline(signs: Sequence[str], *, has_key: bool, topic_disjoint: bool) -> str:
    """The reading's first sentences from the signs alone: a loud NOT PROVEN when the profile is
    not proven topic-disjoint, the rule's words, and which axes were decided higher / lower. On
    such a profile the held-out row is never called "held-out topics"."""
    rule = reading_rule(signs)
    text = rule.text
    if has_key and rule.with_key:
        text = rule.with_key
    elif not has_key and rule.without_key:
        text = rule.without_key
    if not topic_disjoint and rule.unproven:
        text = rule.unproven
    if not topic_disjoint:
        text = text.replace("held-out topics", HELD_OUT_ROW[False]).replace("Held-out topics",
                                                                             "The held-out split")
    axes = axis_names(topic_disjoint)
    higher = [a for a, s in zip(axes, signs) if s == "+"]
    lower = [a for a, s in zip(axes, signs) if s == "-"]
    decided = (f" Decided higher on: {', '.join(higher)}." if higher else "") + \
              (f" Decided lower on: {', '.join(lower)}." if lower else "")
    prefix = "" if topic_disjoint else "NOT PROVEN topic-disjoint (split check): "
    return prefix + text + decided


SEED_BLIND = ("Every seed ended on the same candidate (seed-blind): the seeds replicate nothing, so no row has a "
              "seed-level verdict and each number below is one run's.")


def reading_signs(m: MethodAblation) -> tuple[tuple[str, str, str, str], bool]:
    """The four signs of :data:`READING_AXES` for ``m`` and whether its candidates hold a key."""
    encoded = m.row("train_encoded")
    has_key = any(s > 0 for s in m.key_share) and encoded.gain is not None
    exact = encoded if has_key else m.row("train")
    rows = (exact, m.row("probe_memorised"), m.row("probe_other"), m.row("test"))
    return tuple(r.sign for r in rows), has_key  # type: ignore[return-value]


def reading(m: MethodAblation) -> str:
    """The reading in words: the headline from the sign table (:data:`READINGS`), then the
    numbers it was read from, the key, and the validation gain beside the held-out one (numbers
    only: the validation gain is the optimizer's own selection score, not a verdict)."""
    signs, has_key = reading_signs(m)
    rule = reading_rule(signs)
    test, exact = m.row("test"), (m.row("train_encoded") if has_key else m.row("train"))
    mem, other = m.row("probe_memorised"), m.row("probe_other")
    contrasts = [r.seed_contrast for r in m.rows if r.seed_contrast is not None]
    blind = bool(contrasts) and all(c.replayed for c in contrasts)
    held_out = HELD_OUT_ROW[m.topic_disjoint]
    if blind:
        parts = [("" if m.topic_disjoint else "NOT PROVEN topic-disjoint (split check): ") + SEED_BLIND]
    else:
        parts = [headline(signs, has_key=has_key, topic_disjoint=m.topic_disjoint)]
        if rule.name == "exact-only":
            # "only" must not stand beside an undecided gain on another subset
            rest = [(a, r) for a, r in zip(axis_names(m.topic_disjoint)[1:], (mem, other, test))
                    if r.gain is not None and r.gain > 1e-12]
            if rest:
                parts[0] = parts[0].replace(" only.", ";").replace("Only the training questions gain",
                                                                    "The training questions gain")
                parts.append("Not only there: " + ", ".join(f"{a} gain {r.gain:+.3f}" for a, r in rest)
                             + ", undecided at these seeds.")
    parts.append(f"Exact training questions {_fmt(exact)}, fresh questions of memorised families {_fmt(mem)}, "
                 f"of other trained families {_fmt(other)}, {held_out} {_fmt(test)}.")
    if has_key:
        parts.append(f"Answer key in the final candidate ({np.mean(m.key_share):.0%} of its words on average, "
                     f"{max(m.families_memorised)} famil(ies) memorised at most).")
        if signs[0] == "0":
            parts.append(_key_sentence(exact))
    else:
        parts.append("No answer key found in the final candidate(s).")
    if m.val_gain is not None and test.gain is not None:
        if m.val_gain > test.gain + 1e-9:
            ratio = f", {m.val_gain / test.gain:.1f}x" if test.gain > 0 else ""
            parts.append(f"Validation gain {m.val_gain:+.3f} overstates the held-out gain {test.gain:+.3f}{ratio}.")
        else:
            parts.append(f"Validation gain {m.val_gain:+.3f} does not overstate the held-out gain {test.gain:+.3f}.")
    m.reading_rule = "seed-blind" if blind else rule.name
    return " ".join(parts)


def _key_sentence(exact: SubsetGain) -> str:
    """What the key earns on the questions it encodes when that row is not decided: "nothing
    measurable" only when the row's own numbers agree (no replayed run, p not below alpha)."""
    c = exact.seed_contrast
    gain = exact.gain or 0.0
    if c is not None and replicates_nothing(c):
        if c.changed is not None and c.p < c.alpha:
            return (f"On the questions it encodes the key gains {gain:+.3f} in this one run ({c.changed[0]} up, "
                    f"{c.changed[1]} down, per-question p {c.p:.3g}): overwhelming for the run, untested for the "
                    "method (the seeds cannot separate what they do not replicate).")
        return (f"On the questions it encodes the key's gain {gain:+.3f} is one run's and not beyond chance even "
                "there.")
    if c is not None and c.p_holm < c.alpha:
        return (f"On the questions it encodes the key gains {gain:+.3f} (Holm p {c.p_holm:.3g}), but its seed-level "
                "interval includes 0: not separated.")
    return "The key earns nothing measurable even on the questions it encodes."


__all__ = ["ABLATION_DIR", "SUBSETS", "READINGS", "READING_AXES", "ReadingRule", "reading_rule", "headline",
           "reading_signs", "axis_names", "HELD_OUT_ROW", "SEED_BLIND", "MatchedSpan", "LeakScan", "ScanRules", "SubsetGain", "MethodAblation",
           "Ablation", "scan_examples", "scan_candidate", "answer_key_rows", "subset_gain", "ablate",
           "find_records", "reading", "candidate_text", "decide_rows", "split_verdict"]
