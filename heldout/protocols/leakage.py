"""Answer keys in candidates, and the topic-shared leakage ablation.

**Leak scan** (:func:`scan_candidate`): after normalisation (SQuAD rules: case, ASCII
punctuation, articles), which training questions and answers does a candidate's text contain?
A question counts when a run of at least ``max(8, half its words)`` of its words (all of them if
it is shorter) appears verbatim; an answer counts when it appears within ``window`` words of its
own question's match, or anywhere when it has at least ``standalone_answer_words`` words (short
answers such as "yes" or "1912" occur in any prose). The result: the answer-key share of the
candidate by word count, the training examples it encodes, the families (groups) it memorised,
and every matched span. Val/test/probe answers found, and test/probe questions found, are
**red flags**: the optimizer never saw them.

**Topic-shared ablation** (:func:`ablate`): for the baseline (the task's seed candidate) and
every optimised final candidate of a study's run dir, score with no further search on

* ``test``: the topic-disjoint held-out split;
* ``train``: the exact training questions, and ``train_encoded``: those the candidate's key holds;
* ``probe_memorised`` / ``probe_other``: the ``shared_topic_probe`` pool (fresh questions from
  training families) split by whether the candidate memorised that family;

and report per subset the mean paired gain over the baseline with an interval that resamples
seeds (then examples), an exact sign test and a Wilcoxon signed-rank test over examples, an
exact sign-flip test over seeds, and n; the validation gain beside them; and the reading in
words. The scoring runs through the session's :class:`Scorer` and every verdict is appended to
the hash-chained ledger ``RUN_DIR/ablation/``; a re-run scores afresh and appends (results are
never read back from a ledger, as for the harness's held-out scoring)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from heldout.benchmarks.loading import Task, load_task
from heldout.contracts import Candidate, Example, HeldoutError, Verdict, candidate_id, check_candidate
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.session import DEPLOYMENT, Scorer, Usage
from heldout.protocols.splits import PROBE, answer_text, question_text, words
from heldout.protocols.stats import mean_interval, two_level_bootstrap
from heldout.protocols.stats.paired import wilcoxon_p

ABLATION_DIR = "ablation"
RESULT_FILE = "ablation.json"
SUBSETS = ("test", "train", "train_encoded", "probe_memorised", "probe_other")


# -- leak scan -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatchedSpan:
    example_id: str
    pool: str
    field: str  # "question" | "answer"
    group: str | None
    start: int  # word positions in the normalised candidate text
    end: int
    text: str


@dataclass
class LeakScan:
    """What of the task's data a candidate holds. ``share`` = words of the candidate covered by
    matched training questions/answers, over all its words; ``flagged_share`` the same for
    val/test/probe matches (red flags)."""

    task: str
    profile: str
    candidate_id: str
    words: int
    key_words: int
    share: float
    flagged_share: float
    encoded: list[str]  # training example ids the candidate encodes
    memorised_families: list[str]
    spans: list[MatchedSpan] = field(default_factory=list)
    red_flags: list[MatchedSpan] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, limit: int = 12) -> str:
        lines = [f"{self.task} profile {self.profile!r} candidate {self.candidate_id[:12]}: "
                 f"answer-key share {self.share:.1%} ({self.key_words} of {self.words} words); "
                 f"{len(self.encoded)} training example(s) encoded from {len(self.memorised_families)} "
                 f"famil(ies)"]
        if self.memorised_families:
            lines.append("  families memorised: " + "; ".join(self.memorised_families[:limit])
                         + (" ..." if len(self.memorised_families) > limit else ""))
        for span in self.spans[:limit]:
            lines.append(f"  {span.pool}:{span.example_id} {span.field:<8} words {span.start}-{span.end}: "
                         f"{span.text[:80]!r}")
        if len(self.spans) > limit:
            lines.append(f"  ... and {len(self.spans) - limit} more spans (--json lists all)")
        if self.red_flags:
            lines.append(f"  RED FLAG: {len(self.red_flags)} match(es) of data the optimizer never saw "
                         f"({self.flagged_share:.1%} of the words):")
            for span in self.red_flags[:limit]:
                lines.append(f"    {span.pool}:{span.example_id} {span.field}: {span.text[:80]!r}")
        return "\n".join(lines)


@dataclass(frozen=True)
class ScanRules:
    """Thresholds of the leak scan (see the module docstring)."""

    min_question_words: int = 8
    question_fraction: float = 0.5
    standalone_answer_words: int = 3
    window: int = 40


class _Index:
    """Word n-gram positions of one normalised text, built per n on first use."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self._by_n: dict[int, dict[tuple[str, ...], list[int]]] = {}

    def positions(self, gram: Sequence[str]) -> list[int]:
        n = len(gram)
        if n not in self._by_n:
            table: dict[tuple[str, ...], list[int]] = {}
            for p in range(len(self.tokens) - n + 1):
                table.setdefault(tuple(self.tokens[p:p + n]), []).append(p)
            self._by_n[n] = table
        return self._by_n[n].get(tuple(gram), [])

    def maximal_runs(self, query: list[str], min_len: int) -> list[tuple[int, int]]:
        """Candidate spans (start, end) where a run of >= ``min_len`` consecutive query words
        appears, extended to maximal length."""
        runs: set[tuple[int, int]] = set()
        for i in range(len(query) - min_len + 1):
            for p in self.positions(query[i:i + min_len]):
                if i > 0 and p > 0 and query[i - 1] == self.tokens[p - 1]:
                    continue  # not the start of a maximal run
                length = min_len
                while i + length < len(query) and p + length < len(self.tokens) \
                        and query[i + length] == self.tokens[p + length]:
                    length += 1
                runs.add((p, p + length))
        return sorted(runs)


def candidate_text(candidate: Mapping[str, str]) -> str:
    return "\n".join(text for _, text in sorted(check_candidate(dict(candidate)).items()))


def scan_examples(candidate: Mapping[str, str], pools: Mapping[str, Sequence[Example]], *,
                  task: str = "", profile: str = "", rules: ScanRules = ScanRules()) -> LeakScan:
    """Scan ``candidate`` for the questions and answers of ``pools`` (``train`` is the key pool;
    every other pool gives red flags, except val questions, which the optimizer may see)."""
    tokens = words(candidate_text(candidate))
    index = _Index(tokens)
    key_cover: set[int] = set()
    flag_cover: set[int] = set()
    spans: list[MatchedSpan] = []
    flags: list[MatchedSpan] = []
    encoded: dict[str, None] = {}
    families: dict[str, None] = {}
    for pool, examples in pools.items():
        for ex in examples:
            found = _find(index, ex, pool, rules)
            if not found:
                continue
            if pool == "train":
                spans += found
                encoded[ex.id] = None
                if ex.group is not None:
                    families[ex.group] = None
                for s in found:
                    key_cover.update(range(s.start, s.end))
            else:
                shown = [s for s in found if not (pool == "val" and s.field == "question")]
                flags += shown
                for s in shown:
                    flag_cover.update(range(s.start, s.end))
    n = len(tokens)
    return LeakScan(task=task, profile=profile, candidate_id=candidate_id(dict(candidate)), words=n,
                    key_words=len(key_cover), share=len(key_cover) / n if n else 0.0,
                    flagged_share=len(flag_cover) / n if n else 0.0, encoded=list(encoded),
                    memorised_families=sorted(families), spans=spans, red_flags=flags)


def _find(index: _Index, ex: Example, pool: str, rules: ScanRules) -> list[MatchedSpan]:
    question = words(question_text(ex))
    answer = words(answer_text(ex))
    found: list[MatchedSpan] = []
    q_spans: list[tuple[int, int]] = []
    if len(question) >= 3:
        need = min(len(question), max(rules.min_question_words, math.ceil(rules.question_fraction * len(question))))
        q_spans = index.maximal_runs(question, need)
        found += [MatchedSpan(ex.id, pool, "question", ex.group, a, b, " ".join(index.tokens[a:b]))
                  for a, b in q_spans]
    if answer:
        for p in index.positions(answer):
            near = any(a - rules.window <= p <= b + rules.window for a, b in q_spans)
            if near or len(answer) >= rules.standalone_answer_words:
                found.append(MatchedSpan(ex.id, pool, "answer", ex.group, p, p + len(answer), " ".join(answer)))
    return found


def scan_candidate(candidate: Mapping[str, str], task: Task, rules: ScanRules = ScanRules()) -> LeakScan:
    """:func:`scan_examples` over a loaded task's train, val, test and probe pools."""
    pools = {p: task.splits[p] for p in ("train", "val", "test", PROBE) if p in task.splits}
    return scan_examples(candidate, pools, task=task.name, profile=task.profile, rules=rules)


# -- the report hook -----------------------------------------------------------------------------
def answer_key_rows(records: Iterable[RunRecord], *, data_dir: str | None = None) -> list[dict[str, Any]]:
    """One row per final candidate (task, profile, method, seed, share, encoded, families,
    red_flags), for a report's answer-key table. A task whose data cannot be loaded gives a row
    with ``share`` None and the reason, never an exception."""
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
        scan = scan_candidate(rec.final_candidate, loaded)
        rows.append({**row, "share": scan.share, "words": scan.words, "encoded": len(scan.encoded),
                     "families": len(scan.memorised_families), "red_flags": len(scan.red_flags)})
    return rows


# -- statistics for one subset -------------------------------------------------------------------
@dataclass
class SubsetGain:
    """Paired gain ``final - baseline`` on one subset, over seeds x examples.

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

    @property
    def separable(self) -> bool:
        """The interval excludes 0 and the exact sign test is below 0.05."""
        return (self.ci_low is not None and self.ci_high is not None and self.sign_test_p is not None
                and (self.ci_low > 0 or self.ci_high < 0) and self.sign_test_p < 0.05)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "separable": self.separable}


def subset_gain(subset: str, cells: Sequence[Mapping[str, tuple[float, float]]], *, n_boot: int = 4000,
                ci: float = 0.95, seed: int = 0) -> SubsetGain:
    """``cells[s]`` maps example id -> (baseline score, final score) for seed s."""
    cells = [c for c in cells if c]
    ids = sorted({i for c in cells for i in c})
    out = SubsetGain(subset=subset, n_examples=len(ids), n_seeds=len(cells))
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

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "baseline": self.baseline, "metric_calls": self.metric_calls,
                "notes": self.notes, "methods": [m.to_dict() for m in self.methods]}

    def describe(self) -> str:
        lines = [f"topic-shared leakage ablation of {self.run_dir} (baseline: {self.baseline}; "
                 f"{self.metric_calls} metric calls scored and ledgered in {ABLATION_DIR}/)"]
        lines += [f"note: {n}" for n in self.notes]
        for m in self.methods:
            lines.append(f"\n{m.task} [{m.profile}] {m.method}, seeds {m.seeds}: answer-key share "
                         + ", ".join(f"{s:.1%}" for s in m.key_share))
            lines.append(f"  {'subset':<16} {'n':>5} {'seeds':>5} {'gain':>8} {'CI':>19} {'sign p':>8} "
                         f"{'wilcoxon':>8} {'seed p':>7}")
            for r in m.rows:
                if r.gain is None:
                    lines.append(f"  {r.subset:<16} {r.n_examples:>5} {r.n_seeds:>5}  (no examples)")
                    continue
                ci_text = f"[{r.ci_low:+.3f}, {r.ci_high:+.3f}]"
                flip = "-" if r.seed_flip_p is None else f"{r.seed_flip_p:.3f}"
                lines.append(f"  {r.subset:<16} {r.n_examples:>5} {r.n_seeds:>5} {r.gain:>+8.3f} {ci_text:>19} "
                             f"{r.sign_test_p:>8.3g} {r.wilcoxon_p:>8.3g} {flip:>7}")
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
        verdicts = self.scorer_for[task.name].score(candidate, todo, DEPLOYMENT, self.usage) if todo else []
        self.usage.metric_calls += len(todo)
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
    try:
        for (task_name, profile), task in tasks.items():
            if PROBE not in task.splits:
                notes.append(f"{task_name} [{profile}] has no {PROBE} pool: the probe rows are empty "
                             "(build one with `heldout split build --probe K`)")
            group_records = [r for r in records if (r.task, r.profile) == (task_name, profile)]
            names = sorted({r.method for r in group_records if r.method != baseline})
            for method in names:
                runs = sorted((r for r in group_records if r.method == method), key=lambda r: r.seed)
                methods.append(_ablate_method(task, method, runs, group_records, baseline, scoring, n_boot))
    finally:
        ledger.append("ablation_end", {"metric_calls": scoring.usage.metric_calls})
        ledger.close()
    result = Ablation(run_dir=str(run_dir), baseline=baseline, methods=methods,
                      metric_calls=scoring.usage.metric_calls, notes=notes)
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
    val_gains, shares, families, flags = [], [], [], []
    probe_groups = {ex.id: ex.group for ex in task.splits.get(PROBE, [])}
    for rec in runs:
        base_cand, base_rec = _baseline_for(task, rec, group_records, baseline)
        final = dict(rec.final_candidate)
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
        final_val = rec.verdict_scores("val")
        base_val = base_rec.verdict_scores("val") if base_rec is not None else (
            scoring.scores(task, base_cand, "val") if task.splits.get("val") else {})
        common = [i for i in final_val if i in base_val]
        if common:
            val_gains.append(float(np.mean([final_val[i] - base_val[i] for i in common])))
    rows = [subset_gain(s, by_subset[s], n_boot=n_boot) for s in SUBSETS]
    result = MethodAblation(task=task.name, profile=task.profile, method=method, seeds=[r.seed for r in runs],
                            rows=rows, val_gain=float(np.mean(val_gains)) if val_gains else None,
                            key_share=shares, families_memorised=families, red_flags=flags)
    result.reading = reading(result)
    return result


def _fmt(row: SubsetGain) -> str:
    return "n/a (no examples)" if row.gain is None else f"{row.gain:+.3f} (n={row.n_examples})"


def reading(m: MethodAblation) -> str:
    """The study's reading in words: does the gain on the exact training questions (those the
    key encodes, when there is a key) approach the validation gain, or stay near the held-out
    gain; and does anything transfer to fresh questions of the memorised families?"""
    test, train = m.row("test"), m.row("train")
    encoded = m.row("train_encoded")
    has_key = any(s > 0 for s in m.key_share) and encoded.gain is not None
    exact = encoded if has_key else train
    mem, other = m.row("probe_memorised"), m.row("probe_other")
    parts = []
    if has_key:
        parts.append(f"answer key in the final candidate ({np.mean(m.key_share):.0%} of its words on average, "
                     f"{max(m.families_memorised)} famil(ies) memorised at most).")
    else:
        parts.append("no answer key found in the final candidate(s).")
    if exact.separable and exact.gain > 0 and not (test.separable and test.gain > 0):
        probe = (f"; fresh questions of memorised families {_fmt(mem)}" if mem.gain is not None else "")
        parts.append(f"Memorisation pays on the exact training questions only: {_fmt(exact)} there, "
                     f"held-out topics {_fmt(test)}{probe}, other trained families {_fmt(other)}.")
    elif test.separable and test.gain > 0:
        parts.append(f"The gain transfers: held-out topics {_fmt(test)}, exact training questions {_fmt(exact)}, "
                     f"fresh questions of trained families {_fmt(mem if mem.gain is not None else other)}"
                     f"{'' if mem.gain is None else f' (memorised) / {_fmt(other)} (others)'}: "
                     "a rule, not a key.")
    else:
        extra = (" The key earns nothing measurable even on the questions it encodes." if has_key else "")
        parts.append(f"No subset separates from the baseline: exact training questions {_fmt(exact)}, "
                     f"held-out {_fmt(test)}.{extra}")
    if m.val_gain is not None and test.gain is not None and exact.gain is not None:
        if m.val_gain > test.gain + 1e-9:
            ratio = f", {m.val_gain / test.gain:.1f}x" if test.gain > 0 else ""
            closer = abs(exact.gain - m.val_gain) < abs(exact.gain - test.gain)
            parts.append(f"Validation gain {m.val_gain:+.3f} overstates the held-out gain {test.gain:+.3f}{ratio}; "
                         f"the exact-leak gain {exact.gain:+.3f} "
                         + ("approaches the validation gain: memorisation pays." if closer else
                            "stays near the held-out gain: memorisation does not explain the gap "
                            "(selection on a small, noisy validation set does)."))
        else:
            parts.append(f"Validation gain {m.val_gain:+.3f} does not overstate the held-out gain {test.gain:+.3f}.")
    return " ".join(parts)


__all__ = ["ABLATION_DIR", "SUBSETS", "MatchedSpan", "LeakScan", "ScanRules", "SubsetGain", "MethodAblation",
           "Ablation", "scan_examples", "scan_candidate", "answer_key_rows", "subset_gain", "ablate",
           "find_records", "reading", "candidate_text"]
