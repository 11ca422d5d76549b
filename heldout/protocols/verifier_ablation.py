"""Verifier ablation: optimise against each verifier variant, re-score with the canonical verifier.

**Plan** (:func:`plan_ablation`). For one task, one optimizer, variants V and seeds S: for every
(v, s) one session of the optimizer under v and one of the **seed baseline** (method ``seed``: the
task's seed candidate, no metric calls) under v, all with budget B in metric calls (a
``repeated:K`` variant spends K per evaluation, so B buys B/K evaluations: matched cost, not
matched looks). Run dirs are the runner's: ``<task>/<method>/verifier-<v>/seed-<s>``.

**Scores.** The harness scores every final candidate once on the held-out split with the
canonical verifier (whatever the variant), and on val; under a variant the record also holds the
final candidate's val score as its own verifier shows it (``val_score_own_verifier``). A profile
without a val split (e.g. VLIW: train + hidden test) selects on train: then this protocol scores
both candidates on train under the variant itself, appending every verdict to the hash-chained
ledger ``RUN_DIR/verifier_ablation/`` (always fresh, never read back).

**Report** (:func:`summarise`), per variant, per seed s, paired by seed:

* validation gain_s = own(final_s) - own(seed_s): the selection-split score under the variant's
  own verifier (the canonical val score for ``decomposed``), i.e. what the optimizer was rewarded for;
* transfer_s = canonical held-out score(final_s) - canonical held-out score(seed_s);
* gaming gap_s = validation gain_s - transfer_s;

with means over seeds, an interval over the per-seed values for transfer and gap with the seed
as the unit (:func:`heldout.protocols.stats.compare_runs`: the exact sign-flip over seeds,
inverted; unbounded below the seeds it needs; no interval from one seed) and the
seed spread of the final candidates' held-out scores (:func:`heldout.protocols.stats.summarize_seeds`).

**The noise floor** (prompt tasks). The seed candidate scored once is one draw of its wording's
luck under each verifier, and every seed pair would share it. So a prompt task's plan also runs
method ``placebo`` (:mod:`heldout.protocols.placebo`: a neutral re-wording of the seed, no metric
call) ``K`` times per seed under every variant, and the seed side of every per-seed value is the
mean of that seed's draws. Program tasks keep the seed's one score: their evaluators are
deterministic and a neutral edit moves nothing.

**Verdicts** (:func:`decide_variants`): per variant, whether its gaming gap separates from 0
(prompt tasks: rule ``placebo-floor``, the final candidate's own-minus-held-out gap against that
seed's placebo draws'; program tasks: rule ``seed-paired-contrast`` against the seed); per
variant other than the canonical one (when the canonical one is in the plan), whether its transfer
differs from the canonical verifier's, paired by seed (a seed drives the same random stream under
every variant). All of them are one Holm family: the chance that any verdict the command prints
is a false "separates" is at most alpha. Fewer than 3 seeds: no verdict. The verdict the
optimizer saw is the variant's (the ledger's ``evaluation`` entries); the canonical verdict it was
derived from is kept beside it (``scored``) and never shown."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from heldout.benchmarks.loading import Task, load_task
from heldout.benchmarks.verifiers import CANONICAL, parse_verifier
from heldout.contracts import Candidate, HeldoutError, MetricSpec, candidate_id, json_safe
from heldout.files import write_text_atomically
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RECORD_FILE, RunRecord
from heldout.evaluators.policy import Usage
from heldout.evaluators.scoring import Decoding, Scorer
from heldout.models import OPTIMISATION
from heldout.protocols.decide import DEFAULT_ALPHA, Contrast, beyond_placebo, contrast, describe_detectable, holm
from heldout.protocols.folders import VERIFIER_ABLATION_DIR, VERIFIER_RESULT_FILE
from heldout.protocols.minimum_budgets import check_minimum_budgets
from heldout.protocols.placebo import PLACEBO_METHOD, SEED_METHOD, STRIDE, draws_for, placebo_seeds, stratum
from heldout.protocols.preflight import check_infrastructure
from heldout.protocols.run import Cell, Executor, Method, StudyConfig, run_study, study_client
from heldout.protocols.study_dir import claim_study_dir
from heldout.protocols.stats import compare_runs, summarize_seeds

CI_LEVEL = 0.95


class AblationError(HeldoutError):
    pass


class AblationInterrupted(AblationError):
    """A stop request (SIGINT/SIGTERM) ended the ablation before every session finished: no
    session failed, every ledger is consistent, and re-running the same command continues it."""


@dataclass(frozen=True)
class AblationPlan:
    """The sessions of one verifier ablation (see the module docstring)."""

    task: str
    profile: str
    optimizer: Method
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    budget: int
    options: dict[str, Any]
    cells: tuple[Cell, ...]
    sizes: dict[str, int]
    repeats: dict[str, int]
    selection_split: str
    placebo_draws: int = 0
    """Placebo draws per seed and variant (0: a program task, scored against the seed's one score)."""

    def cell(self, method: str, variant: str, seed: int) -> Cell:
        return next(c for c in self.cells if (c.method.name, c.verifier, c.seed) == (method, variant, seed))

    def describe(self, run_root: str | Path) -> str:
        n_sel, n_test = self.sizes.get(self.selection_split, 0), self.sizes.get("test", 0)
        placebo = [c for c in self.cells if c.method.name == PLACEBO_METHOD]
        of_them = f" ({len(placebo)} of them placebo draws)" if placebo else ""
        lines = [f"verifier ablation of {self.optimizer.name} on {self.task} [{self.profile}] "
                 f"(train/val/test {self.sizes.get('train', 0)}/{self.sizes.get('val', 0)}/{n_test}; "
                 f"selection split: {self.selection_split}); seeds {list(self.seeds)}; "
                 f"{len(self.cells)} sessions{of_them}"]
        lines.append(f"  {'method':<20} {'verifier':<24} {'seed':>4} {'budget':>8} {'harness':>8}  run dir")
        total = harness_total = 0
        for c in self.cells:
            repeats = self.repeats[c.verifier]
            # held-out + val with the canonical verifier, + the selection split under the variant
            harness = n_test + self.sizes.get("val", 0) + (n_sel * repeats if c.verifier != CANONICAL
                                                           or self.selection_split != "val" else 0)
            spend = 0 if c.method.name in (SEED_METHOD, PLACEBO_METHOD) else c.budget
            total += spend
            harness_total += harness
            if c.method.name == PLACEBO_METHOD:
                continue  # listed once per variant below: K draws per seed, one line each would drown the plan
            lines.append(f"  {c.method.name:<20} {c.verifier:<24} {c.seed:>4} {spend:>8} {harness:>8}  "
                         f"{c.run_dir(run_root)}")
        for variant in self.variants if placebo else ():
            first = next(c for c in placebo if c.verifier == variant)
            lines.append(f"  {PLACEBO_METHOD:<20} {variant:<24} {'x' + str(self.placebo_draws):>4} {0:>8} "
                         f"{'':>8}  {first.run_dir(run_root).parent}/seed-<seed*{STRIDE}+k> for every seed")
        floor = (f" and its {self.placebo_draws} placebo draw(s) per seed and variant (neutral re-wordings: the "
                 "noise floor of every verdict against the seed)" if self.placebo_draws else "")
        lines.append(f"  optimisation budget: {total} metric calls in all (the seed baseline{floor} spend none); "
                     f"harness scoring outside the budget: about {harness_total} example scorings")
        lines.append("  " + self.detectable())
        repeated = [v for v in self.variants if self.repeats[v] > 1]
        if repeated:
            lines.append(f"  note: {', '.join(repeated)} spend K metric calls per evaluation (B buys B/K evaluations)")
        return "\n".join(lines)

    def family_size(self) -> int:
        """Verdicts the summary prints: a gap per variant, and a transfer contrast per variant
        against the canonical one when the plan has it."""
        others = len(self.variants) - 1 if CANONICAL in self.variants else 0
        return len(self.variants) + others

    def detectable(self, alpha: float = DEFAULT_ALPHA, power: float = 0.8) -> str:
        """What the design can detect, in SDs of the per-seed difference (one sentence)."""
        n_selection, n_test = self.sizes.get(self.selection_split, 1), self.sizes.get("test", 1)
        return "what it can detect: " + describe_detectable(len(self.seeds), family=self.family_size(),
                                                            n_examples=min(n_selection, n_test),
                                                            alpha=alpha, power=power)


def plan_ablation(task: str, optimizer: Method, variants: Sequence[str], seeds: Sequence[int], budget: int, *,
                  profile: str = "default", options: dict[str, Any] | None = None, data_dir: str | None = None,
                  allow_drift: bool = False, placebo_draws: int = 0, origin: str = "compare verifiers") -> AblationPlan:
    """Check the variants against the task and lay out the sessions. Raises a clear
    :class:`HeldoutError` for an unknown variant, a repeated one, or no seeds. ``placebo_draws``:
    per seed and variant on a prompt task (0: as many as the verdicts need)."""
    if optimizer.name in (SEED_METHOD, PLACEBO_METHOD):
        raise AblationError(f"{optimizer.name!r} is part of every ablation (the seed baseline and its placebo "
                            "draws, the noise floor); name the optimizer to ablate (or run it under another name)")
    variants = tuple(v.strip() for v in variants if v.strip())
    if not variants:
        raise AblationError("name at least one verifier variant (e.g. decomposed,scalar,coarse:3)")
    if len(set(variants)) != len(variants):
        raise AblationError(f"--variants repeats a variant: {', '.join(variants)}")
    if not seeds:
        raise AblationError("name at least one seed")
    if not isinstance(budget, int) or budget < 0:
        raise AblationError(f"the budget is a non-negative number of metric calls, got {budget!r}")
    loaded = load_task(task, profile, data_dir, allow_drift)
    bench = loaded.benchmark
    repeats = {v: parse_verifier(v, bench.verifier_options, bench.score_ceiling).repeats for v in variants}
    seed_method, placebo = Method(SEED_METHOD, SEED_METHOD), Method(PLACEBO_METHOD, PLACEBO_METHOD)
    draws = 0
    if loaded.kind == "prompt":
        others = len(variants) - 1 if CANONICAL in variants else 0
        draws = placebo_draws or draws_for(len(seeds), family=len(variants) + others)
    runs = [(method, seed) for method in (seed_method, optimizer) for seed in seeds]
    runs += [(placebo, s) for s in placebo_seeds(seeds, draws)] if draws else []
    decoding, task_options = Decoding.split(options or {})  # the study's options, split once for its cells
    cells = tuple(Cell(loaded.name, method, seed, budget, profile, task_options, variant, decoding=decoding)
                  for variant in variants for method, seed in runs)
    check_minimum_budgets(cells, origin)  # below its minimum a method can only return the seed
    return AblationPlan(task=loaded.name, profile=profile, optimizer=optimizer, variants=variants,
                        seeds=tuple(seeds), budget=budget, options=dict(options or {}), cells=cells,
                        sizes=loaded.sizes(), repeats=repeats,
                        selection_split="val" if loaded.splits.get("val") else "train", placebo_draws=draws)


# -- the report ------------------------------------------------------------------------------------
@dataclass
class Interval:
    low: float
    high: float
    level: float
    method: str


@dataclass
class VariantResult:
    """One variant's row: per-seed values (in ``seeds`` order) and their summaries."""

    variant: str
    seeds: list[int]
    val_gain: list[float]
    transfer: list[float]
    gap: list[float]
    final_test: list[float]
    seed_test: list[float]
    final_own: list[float]
    seed_own: list[float]
    final_candidates: list[str]
    metric_calls: list[int]
    floor_test: dict[int, list[float]] = field(default_factory=dict)
    """Per seed, its placebo draws' held-out scores (empty on a program task: no floor)."""
    floor_gap: dict[int, list[float]] = field(default_factory=dict)
    """Per seed, its placebo draws' own-verifier selection score minus held-out score."""
    transfer_ci: Interval | None = None
    gap_ci: Interval | None = None
    seed_spread: dict[str, float] = field(default_factory=dict)
    gap_verdict: Contrast | None = None
    """Whether the gaming gap separates from 0 (``val_gain`` against ``transfer``, paired by seed)."""
    transfer_vs_canonical: Contrast | None = None
    """This variant's transfer against the canonical verifier's, paired by seed (None for the
    canonical row itself, or when the plan has no canonical row)."""
    reading: str = ""

    @staticmethod
    def _mean(values: list[float]) -> float:
        return float(np.mean(values))

    @property
    def mean_val_gain(self) -> float:
        return self._mean(self.val_gain)

    @property
    def mean_transfer(self) -> float:
        return self._mean(self.transfer)

    @property
    def mean_gap(self) -> float:
        return self._mean(self.gap)

    @property
    def replayed(self) -> bool:
        """The optimizer ended on the same candidate in every seed: one draw, repeated."""
        return len(self.seeds) > 1 and len(set(self.final_candidates)) == 1

    def to_dict(self) -> dict[str, Any]:
        verdicts = {k: (None if getattr(self, k) is None else getattr(self, k).as_dict())
                    for k in ("gap_verdict", "transfer_vs_canonical")}
        return {**asdict(self), **verdicts, "mean_val_gain": self.mean_val_gain,
                "mean_transfer": self.mean_transfer, "mean_gap": self.mean_gap}


@dataclass
class VerifierAblation:
    task: str
    profile: str
    optimizer: str
    policy: str
    budget: int
    selection_split: str
    rows: list[VariantResult]
    notes: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> str:
        if any(r.floor_test for r in self.rows):
            return "the mean of each seed's placebo draws (neutral re-wordings of the seed candidate)"
        return "the seed candidate"

    def row(self, variant: str) -> VariantResult:
        return next(r for r in self.rows if r.variant == variant)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [r.to_dict() for r in self.rows]}

    def describe(self) -> str:
        lines = [f"verifier ablation: {self.optimizer} on {self.task} [{self.profile}], budget {self.budget} "
                 f"metric calls, policy {self.policy!r}; validation gain on {self.selection_split} under the "
                 f"variant's own verifier, transfer on held-out under the canonical verifier ({CANONICAL}); "
                 f"gains against {self.baseline}, paired by seed"]
        lines += [f"note: {n}" for n in self.notes]
        lines.append(f"  {'variant':<24} {'seeds':>5} {'val gain':>9} {'transfer':>9} {'95% CI (seeds)':>19} "
                     f"{'gaming gap':>10} {'95% CI (seeds)':>19} {'held-out mean±sd':>17}")
        for r in self.rows:
            def ci(interval: Interval | None) -> str:
                return "n/a (1 seed)" if interval is None else f"[{interval.low:+.3f}, {interval.high:+.3f}]"
            spread = r.seed_spread
            sd = "n/a" if math.isnan(spread["std"]) else f"{spread['std']:.3f}"
            lines.append(f"  {r.variant:<24} {len(r.seeds):>5} {r.mean_val_gain:>+9.3f} {r.mean_transfer:>+9.3f} "
                         f"{ci(r.transfer_ci):>19} {r.mean_gap:>+10.3f} {ci(r.gap_ci):>19} "
                         f"{spread['mean']:>8.3f} ± {sd:<6}")
        for r in self.rows:
            lines.append(f"  {r.variant}: {r.reading}")
        versus = [r.transfer_vs_canonical for r in self.rows if r.transfer_vs_canonical is not None]
        if versus:
            lines.append(f"  transfer against the canonical verifier, paired by seed (Holm over all "
                         f"{versus[0].family} verdicts above and below):")
            lines += [f"    {c.sentence}" for c in versus]
        return "\n".join(lines)


def seed_interval(base: Sequence[float], current: Sequence[float], n_examples: int,
                  level: float = CI_LEVEL) -> Interval | None:
    """Interval of the mean of ``current - base`` over seed pairs, the seed as the unit
    (:func:`heldout.protocols.stats.compare_runs`: the exact sign-flip over seeds, inverted).
    None for one seed."""
    if len(base) < 2:
        return None
    comp = compare_runs(list(base), list(current), paired=True, n_examples=max(1, n_examples), alpha=1 - level)
    return Interval(comp.low, comp.high, comp.level, f"{comp.test} over {len(base)} seeds")


def decide_variants(rows: Sequence[VariantResult], *, n_selection: int, n_test: int,
                    alpha: float = DEFAULT_ALPHA) -> list[Contrast]:
    """Every verdict the ablation prints, Holm-adjusted together (see the module docstring): each
    row's gaming gap against 0, then each non-canonical row's transfer against the canonical row's.
    Sets ``gap_verdict``, ``transfer_vs_canonical`` and ``reading`` on the rows and returns the family."""
    def by_seed(row: VariantResult, values: Sequence[float]) -> dict[int, float]:
        return dict(zip(row.seeds, values))

    # the gap mixes a selection-split mean and a held-out mean: the smaller one sets the test
    gap_examples = max(1, min(n_selection, n_test))
    raw: list[tuple[str, Contrast]] = []
    for r in rows:
        raw.append((r.variant, gap_contrast(r, n_examples=gap_examples, alpha=alpha)))
    canonical = next((r for r in rows if r.variant == CANONICAL), None)
    if canonical is not None:
        for r in rows:
            if r is not canonical:
                raw.append((r.variant + " vs canonical", contrast(
                    by_seed(canonical, canonical.transfer), by_seed(r, r.transfer), n_examples=max(1, n_test),
                    alpha=alpha, labels=(CANONICAL, r.variant), label=f"transfer under {r.variant} vs {CANONICAL}")))
    decided = holm([c for _, c in raw], alpha)
    for (key, _), c in zip(raw, decided):
        row = next(r for r in rows if key in (r.variant, r.variant + " vs canonical"))
        if key == row.variant:
            row.gap_verdict = c
        else:
            row.transfer_vs_canonical = c
    for r in rows:
        r.reading = reading(r)
    return decided


def gap_contrast(row: VariantResult, *, n_examples: int, alpha: float = DEFAULT_ALPHA) -> Contrast:
    """The row's gaming-gap verdict before Holm: against the seed's placebo draws when the row has
    them (rule ``placebo-floor`` on own-minus-held-out, so the seed's one draw cancels), else the
    validation gain against the transfer, paired by seed (rule ``seed-paired-contrast``)."""
    label = f"{row.variant}: gaming gap"
    if row.floor_gap:
        final_gap = {s: own - test for s, own, test in zip(row.seeds, row.final_own, row.final_test)}
        return beyond_placebo(row.floor_gap, final_gap, n_examples=n_examples, alpha=alpha,
                              labels=("placebo re-wordings", row.variant), label=label, replayed=row.replayed)
    return contrast(dict(zip(row.seeds, row.transfer)), dict(zip(row.seeds, row.val_gain)), n_examples=n_examples,
                    alpha=alpha, labels=("held-out transfer", "validation gain"), label=label)


def reading(row: VariantResult) -> str:
    """The row in words, from its gap verdict: does the validation gain overstate what transfers?"""
    head = (f"validation gain {row.mean_val_gain:+.3f} under its own verifier, held-out transfer "
            f"{row.mean_transfer:+.3f}, gaming gap {row.mean_gap:+.3f}")
    verdict = row.gap_verdict
    if verdict is None:
        return head + "; not decided."
    p = f"Holm p = {verdict.p_holm:.3g} over {verdict.family}" if verdict.family > 1 else f"p = {verdict.p:.3g}"
    beyond = " beyond the seed's re-wording noise" if verdict.placebo is not None else ""
    if verdict.sign == "+":
        return head + f": the validation gain overstates held-out transfer{beyond} (the gap separates from 0, {p})."
    if verdict.sign == "-":
        return head + f": held-out transfer exceeds the validation gain{beyond} (the gap separates from 0, {p})."
    why = verdict.sentence.split("cannot separate: ", 1)[-1]
    if row.replayed:
        return head + f": the seeds replicate nothing: one run's number ({why})."
    return head + f": no gaming gap separable from 0{beyond} at these seeds ({why})."


class _SelectionScorer:
    """Scores candidates on the train split under a variant, for profiles without val, appending
    every verdict to the ablation ledger (fresh each time)."""

    def __init__(self, run_root: Path, config: StudyConfig) -> None:
        self.ledger: Ledger | None = None
        self.run_root = run_root
        self.config = config
        self.usage = Usage()

    def score(self, task: Task, candidate: Candidate, variant: str, seed: int, options: dict[str, Any]) -> float:
        if self.ledger is None:
            self.ledger = Ledger.open(self.run_root / VERIFIER_ABLATION_DIR)
        bench = task.benchmark
        parsed = parse_verifier(variant, bench.verifier_options, bench.score_ceiling)
        worker = study_client(self.config.worker_model, self.config)
        examples = task.splits.get("train", [])
        cid = candidate_id(candidate)
        try:
            scorer = Scorer(bench, worker, None, options, 2, self.ledger)
            scorings = [scorer.score_all(candidate, examples, OPTIMISATION, self.usage,
                                         f"selection scoring ({variant})", parsed.options, r)
                        for r in range(parsed.repeats)]
        finally:  # its connections and loop thread end with this scoring
            if worker is not None:
                worker.close()
        shown = [parsed.show([s[k] for s in scorings], ex, seed=seed, candidate_id=cid)
                 for k, ex in enumerate(examples)]
        for ex, verdict in zip(examples, shown):
            self.ledger.append_entry("selection_scoring", {"candidate_id": cid, "split": "train", "example_id": ex.id,
                                                           "verifier": variant, "seed": seed,
                                                           "verdict": verdict.to_dict()})
        return bench.aggregate(shown)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()


def _own_score(rec: RunRecord, variant: str) -> float | None:
    """What the variant's verifier showed of the final candidate on val (the canonical val score
    under ``decomposed``)."""
    if variant == CANONICAL:
        return rec.val_score
    return rec.extra.get("val_score_own_verifier")


def _variant_row(plan: AblationPlan, variant: str, records: dict[tuple[str, str, int], RunRecord],
                 task: Task | None, selection: "_SelectionScorer") -> VariantResult:
    """One variant's per-seed values; the seed side is the mean of the seed's placebo draws when
    the plan has them, else the seed candidate's one score. Every score enters in the metric's
    direction (a lower-is-better metric's negated, here only), so every gain is an improvement."""
    sign = MetricSpec.from_record(next(iter(records.values())).experiment).sign

    def own(rec: RunRecord, seed: int) -> float:
        value = (_own_score(rec, variant) if task is None else
                 selection.score(task, dict(rec.final_candidate), variant, seed, rec.options_as_stated))
        if value is None:
            raise AblationError(f"{variant} seed {seed}: a run record lacks its own-verifier val score")
        return sign * value

    def test(rec: RunRecord) -> float:
        return sign * rec.test_score

    placebo = {}
    for (method, v, seed), rec in records.items():
        if method == PLACEBO_METHOD and v == variant:
            placebo.setdefault(stratum(seed), []).append((seed, rec))
    values: dict[str, list] = {k: [] for k in ("val_gain", "transfer", "gap", "final_test", "seed_test",
                                               "final_own", "seed_own", "final_candidates", "metric_calls")}
    floor_test: dict[int, list[float]] = {}
    floor_gap: dict[int, list[float]] = {}
    for seed in plan.seeds:
        final, base = records[(plan.optimizer.name, variant, seed)], records[(SEED_METHOD, variant, seed)]
        own_final, own_seed = own(final, seed), own(base, seed)
        base_own, base_test = own_seed, test(base)
        draws = [(own(rec, s), test(rec)) for s, rec in sorted(placebo.get(seed, []), key=lambda x: x[0])]
        if draws:
            floor_test[seed] = [t for _, t in draws]
            floor_gap[seed] = [o - t for o, t in draws]
            base_own, base_test = float(np.mean([o for o, _ in draws])), float(np.mean(floor_test[seed]))
        gain, transfer = own_final - base_own, test(final) - base_test
        for key, value in (("val_gain", gain), ("transfer", transfer), ("gap", gain - transfer),
                           ("final_test", test(final)), ("seed_test", test(base)),
                           ("final_own", own_final), ("seed_own", own_seed),
                           ("final_candidates", final.final_candidate_id),
                           ("metric_calls", int(final.usage.get("metric_calls", 0)))):
            values[key].append(value)
    row = VariantResult(variant=variant, seeds=list(plan.seeds), floor_test=floor_test, floor_gap=floor_gap,
                        **values)
    row.seed_spread = asdict(summarize_seeds(row.final_test))
    return row


def _intervals(row: VariantResult, n_test: int) -> None:
    """The row's 95% intervals over seeds: the exact tests' own, inverted (against the placebo
    floor when the row has one)."""
    if not row.floor_test:
        row.transfer_ci = seed_interval(row.seed_test, row.final_test, n_test)
        row.gap_ci = seed_interval(row.transfer, row.val_gain, n_test)  # gap_s = gain_s - transfer_s
        return
    if len(row.seeds) < 2:
        return
    held = beyond_placebo(row.floor_test, dict(zip(row.seeds, row.final_test)), n_examples=n_test,
                          alpha=1 - CI_LEVEL)
    gap = row.gap_verdict
    method = f"exact stratified permutation over {len(row.seeds)} seeds against their placebo draws"
    row.transfer_ci = Interval(held.low, held.high, CI_LEVEL, method)
    if gap is not None:
        row.gap_ci = Interval(gap.low, gap.high, 1 - gap.alpha, method)


def summarise(plan: AblationPlan, run_root: str | Path, config: StudyConfig | None = None) -> VerifierAblation:
    """The report of a finished plan (see the module docstring); writes ``RUN_DIR/verifier_ablation.json``."""
    root = Path(run_root)
    config = config or StudyConfig(run_root=str(root))
    records: dict[tuple[str, str, int], RunRecord] = {}
    missing = []
    for c in plan.cells:
        path = c.run_dir(root)
        if not (path / RECORD_FILE).exists():
            missing.append(str(path))
            continue
        rec = RunRecord.load(path)
        if rec.status != "ok" or rec.final_candidate is None or rec.test_score is None:
            raise AblationError(f"session {path} did not finish with a scored final candidate: "
                                f"{rec.error or rec.status}")
        records[(c.method.name, c.verifier, c.seed)] = rec
    if missing:
        raise AblationError(f"{len(missing)} session(s) have no run record yet (run without --plan): {missing[0]}")
    task = None if plan.selection_split == "val" else load_task(plan.task, plan.profile, config.data_dir,
                                                                config.allow_drift)
    selection = _SelectionScorer(root, config)
    rows = []
    try:
        for variant in plan.variants:
            rows.append(_variant_row(plan, variant, records, task, selection))
        decide_variants(rows, n_selection=plan.sizes.get(plan.selection_split, 1), n_test=plan.sizes.get("test", 1))
    finally:
        selection.close()
    for row in rows:
        _intervals(row, plan.sizes.get("test", 1))
    notes = []
    if task is not None:
        notes.append(f"the profile has no val split: validation gain is on train, scored by this protocol "
                     f"under each variant and ledgered in {VERIFIER_ABLATION_DIR}/")
    policies = {rec.policy.get("name") for rec in records.values()}
    result = VerifierAblation(task=plan.task, profile=plan.profile, optimizer=plan.optimizer.name,
                              policy=", ".join(sorted(str(p) for p in policies)), budget=plan.budget,
                              selection_split=plan.selection_split, rows=rows, notes=notes)
    write_text_atomically(root / VERIFIER_RESULT_FILE, json.dumps(json_safe(result.to_dict()), indent=1, default=str))
    return result


def run_ablation(plan: AblationPlan, config: StudyConfig, executor: Executor | None = None,
                 progress: bool = False, resume_hint: str | None = None) -> VerifierAblation:
    """Run (or resume) every session of the plan, then :func:`summarise`. The run dir is held by
    this process while it runs; a stop request is :class:`AblationInterrupted` (``resume_hint``:
    the command that continues it), never a failed session."""
    check_infrastructure(list(plan.cells), config)  # a refused ablation writes nothing
    Path(config.run_root).mkdir(parents=True, exist_ok=True)
    claim_study_dir(Path(config.run_root))
    results = run_study(list(plan.cells), config, executor, progress=progress,
                        resume_hint=resume_hint or "the same command")
    stopped = [r for r in results if r["status"] in ("interrupted", "not started")]
    if stopped:
        raise AblationInterrupted(f"stopped before {len(stopped)} of {len(results)} session(s) finished; every "
                                  "ledger is consistent: re-run the same command to continue"
                                  + (f" ({resume_hint})" if resume_hint else ""))
    incomplete = [r for r in results if r["status"] == "incomplete"]
    if incomplete:  # the infrastructure's failure (an endpoint, a sandbox, the disk), not the sessions'
        first = incomplete[0]
        raise AblationError(f"{len(incomplete)} session(s) incomplete, the infrastructure failed; first: "
                            f"{first['method']} seed {first['seed']} ({first['run_dir']}): {first.get('error')}; "
                            "re-run the same command to continue")
    failed = [r for r in results if r["status"] != "ok"]
    if failed:
        first = failed[0]
        raise AblationError(f"{len(failed)} session(s) failed; first: {first['method']} seed {first['seed']} "
                            f"({first['run_dir']}): {first.get('error')}")
    return summarise(plan, config.run_root, config)


__all__ = ["SEED_METHOD", "AblationError", "AblationInterrupted", "AblationPlan", "Interval",
           "VariantResult", "VerifierAblation", "decide_variants", "plan_ablation", "reading", "run_ablation",
           "seed_interval", "summarise"]
