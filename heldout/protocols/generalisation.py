"""The generalisation-first protocol: one study that asks whether the validation-minus-held-out
gap of an optimizer is memorisation, selection noise or transfer.

It chains the parts heldout already has, in this order, and re-implements none of them:

1. **Split proof** (:func:`heldout.protocols.splits.check_profile`, read by
   :func:`heldout.protocols.leakage.split_verdict`). A profile not proven topic-disjoint is
   refused (:class:`GeneralisationError`, one line) unless ``allow_topic_shared``; that choice is
   recorded in ``RUN_DIR/generalisation.json``, the protocol ledger ``RUN_DIR/protocol/`` and
   the report, and every reading then starts NOT PROVEN.
2. **The multi-seed study** (:func:`heldout.protocols.study_dir.open_study` /
   :func:`heldout.protocols.run.run_study`):
   methods ``seed`` (the task's seed candidate) and the optimizer, every seed, budget B, under
   ``RUN_DIR/runs``. Re-running the command continues it: finished cells are skipped,
   interrupted ones resume from their ledgers (``open_study(resume=None)``).
3. **Held-out comparison** (:func:`compare_heldout`): per seed, validation gain = val score of
   the optimizer's final candidate minus the seed candidate's (both scored by the harness after
   the optimizer returned), held-out gain = the same on test. Three verdicts of rule
   ``seed-paired-contrast`` (:mod:`heldout.protocols.decide`), Holm-adjusted together: held-out
   gain, validation gain, and the gap (validation gain against held-out gain, paired by seed).
4. **Topic-shared ablation** (:func:`heldout.protocols.leakage.ablate` on ``RUN_DIR/runs``):
   exact training questions, fresh questions of memorised / other trained families, held-out
   topics; its verdicts and its reading (:data:`heldout.protocols.leak_readings.READINGS`) are used
   as they are.
5. **Verifier ablation** for the named variants
   (:func:`heldout.protocols.verifier_ablation.run_ablation` under ``RUN_DIR/verifiers``);
   skipped when none are named.
6. **Prompt autopsy** (:mod:`heldout.protocols.prompt_autopsy`): for every accepted candidate of
   each seed's run, its answer-key share beside its validation reward and, for the final
   candidate only, its held-out score; their Spearman correlation is description, not a verdict.

A protocol file (``--study``) is read by :mod:`heldout.protocols.generalisation_file`.

The **reading** (:func:`read_protocol`) is a list of sentences, each with the number or verdict
it comes from; the one sentence that answers the study's question comes from
:data:`GAP_READINGS`, a first-match table over decided signs, and never says "memorisation"
unless the final candidates hold an answer key and the ablation's exact-training-question contrast
separated upward on the questions it encodes, nor "transfer"
unless the held-out contrast separated upward on a proven topic-disjoint profile."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from heldout.benchmarks.loading import Task, load_task
from heldout.contracts import HeldoutError, MetricSpec
from heldout.files import write_text_atomically
from heldout.evaluators.ledger import Ledger
from heldout.evaluators.records import RunRecord
from heldout.protocols.decide import DEFAULT_ALPHA, Contrast, beyond_placebo, describe_detectable, holm
from heldout.protocols.folders import GENERALISATION_DIR
from heldout.protocols.minimum_budgets import check_minimum_budgets
from heldout.protocols.leak_readings import HELD_OUT_ROW, reading_signs
from heldout.protocols.leak_statistics import MethodAblation
from heldout.protocols.leakage import SUBSETS, Ablation, ablate, find_records, split_verdict
from heldout.protocols.preflight import check_infrastructure
from heldout.protocols.run import (Cell, Executor, LocalExecutor, Method, StudyConfig, build_cells, run_study,
                                  study_client)
from heldout.protocols.study_dir import open_study
from heldout.protocols.placebo import PLACEBO_METHOD, SEED_METHOD, draws_for, floor_values, placebo_seeds
from heldout.protocols.prompt_autopsy import CAVEAT, Autopsy, accepted_candidates, autopsy, ledger_components
from heldout.protocols.splits import PROBE, check_profile
from heldout.protocols.verifier_ablation import (AblationInterrupted, AblationPlan, VerifierAblation, plan_ablation,
                                                 run_ablation)
from heldout.protocols.reviewer_evidence import ReviewerEvidence, gather, pair_by_seed

RUNS_DIR = "runs"
VERIFIERS_DIR = "verifiers"
SPEC_FILE = "generalisation.json"


class GeneralisationError(HeldoutError):
    """The protocol cannot run as asked (the message says why, in one line)."""


class GeneralisationInterrupted(GeneralisationError):
    """A stop request (SIGINT/SIGTERM) ended the study before every session finished: nothing is
    lost, and re-running the same command continues it (the CLI exits 130, as ``heldout run``)."""


# -- the design ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GeneralisationSpec:
    """What one generalisation study is: one task and profile, one optimizer against the seed
    candidate, these seeds, B metric calls per session, and the verifier variants to ablate."""

    task: str
    profile: str
    optimizer: Method
    seeds: tuple[int, ...]
    budget: int
    variants: tuple[str, ...] = ()
    allow_topic_shared: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    placebo_draws: int = 0
    """Neutral re-wordings of the seed scored per seed (the noise floor), and per seed and variant
    in the verifier ablation; 0: as many as each one's verdicts need
    (:func:`heldout.protocols.placebo.draws_for`)."""

    def draws(self) -> int:
        return self.placebo_draws or draws_for(len(self.seeds), family=3)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "optimizer": self.optimizer.describe(), "seeds": list(self.seeds),
                "variants": list(self.variants), "placebo_draws": self.draws()}


@dataclass(frozen=True)
class SplitProof:
    """The split check's outcome: proven topic-disjoint or not, its verdict line, the pools'
    sizes and group counts, and whether a not-proven profile was allowed (``--allow-topic-shared``)."""

    task: str
    profile: str
    proven: bool
    verdict: str
    allowed_topic_shared: bool
    pools: dict[str, dict[str, int]]
    near_duplicates: int
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prove_split(task: Task, allow_topic_shared: bool) -> SplitProof:
    """Run ``split check`` on the loaded profile. Refuses (one line) a profile that is not proven
    topic-disjoint unless ``allow_topic_shared``."""
    check = check_profile(task)
    proven, verdict = split_verdict(check)
    if not proven and not allow_topic_shared:
        raise GeneralisationError(f"{task.name} profile {task.profile!r} is not proven topic-disjoint ({verdict}); "
                                  "choose a topic-disjoint profile (heldout split build) or pass "
                                  "--allow-topic-shared, which the report then states")
    return SplitProof(task=task.name, profile=task.profile, proven=proven, verdict=verdict,
                      allowed_topic_shared=not proven and allow_topic_shared, pools=check.pools,
                      near_duplicates=len(check.near_duplicates), text=check.describe())


@dataclass(frozen=True)
class GeneralisationPlan:
    """Every session the protocol runs, before anything is spent."""

    spec: GeneralisationSpec
    split: SplitProof
    sizes: dict[str, int]
    cells: tuple[Cell, ...]
    verifier_plan: AblationPlan | None

    def ablation_scorings(self) -> int:
        """Example scorings of the topic-shared ablation (outside any optimiser budget): test,
        train and probe for the seed candidate and one final candidate per seed, plus the seed's val."""
        pools = sum(self.sizes.get(p, 0) for p in ("test", "train", PROBE))
        return pools * (1 + len(self.spec.seeds)) + self.sizes.get("val", 0)

    def optimisation_budget(self) -> int:
        """Metric calls the optimizer may spend in the study (the seed method spends none)."""
        return sum(c.budget for c in self.cells if c.method.name not in (SEED_METHOD, PLACEBO_METHOD))

    def detectable(self, alpha: float = DEFAULT_ALPHA) -> list[str]:
        """What the design can detect (:func:`heldout.protocols.decide.describe_detectable`), per
        verdict family the protocol prints."""
        n = len(self.spec.seeds)
        n_val, n_test = self.sizes.get("val", 0), self.sizes.get("test", 0)
        selection = n_val or self.sizes.get("train", 0)
        lines = ["held-out comparison (3 verdicts against the placebo floor, Holm): "
                 + describe_detectable(n, family=3, n_examples=max(1, min(selection, n_test)), alpha=alpha,
                                       placebo_draws=self.spec.draws()),
                 f"topic-shared ablation (up to {len(SUBSETS)} rows, Holm): "
                 + describe_detectable(n, family=len(SUBSETS), n_examples=max(1, n_test), alpha=alpha)]
        if self.verifier_plan is not None:
            lines.append("verifier ablation: " + self.verifier_plan.detectable(alpha).removeprefix("what it can detect: "))
        return lines

    def describe(self, run_dir: str | Path) -> str:
        root = Path(run_dir)
        split = self.split
        lines = [f"generalisation-first protocol: {self.spec.optimizer.name} against the seed candidate on "
                 f"{self.spec.task} [{self.spec.profile}], seeds {list(self.spec.seeds)}, budget "
                 f"{self.spec.budget} metric calls per session",
                 f"split check: {split.verdict}" + (" (allowed by --allow-topic-shared; every reading says NOT PROVEN)"
                                                     if split.allowed_topic_shared else ""),
                 f"study sessions ({len(self.cells)}, of which {self.spec.draws() * len(self.spec.seeds)} placebo "
                 f"draws: {self.spec.draws()} neutral re-wording(s) of the seed per seed, the noise floor of every "
                 f"verdict against the seed) under {root / RUNS_DIR}:",
                 f"  {'task':<28} {'method':<20} {'seed':>4} {'budget':>7}  run dir"]
        for c in self.cells:
            spend = 0 if c.method.name in (SEED_METHOD, PLACEBO_METHOD) else c.budget
            lines.append(f"  {c.task:<28} {c.method.name:<20} {c.seed:>4} {spend:>7}  {c.run_dir(root / RUNS_DIR)}")
        harness = len(self.cells) * (self.sizes.get("test", 0) + self.sizes.get("val", 0))
        verifier_calls = 0
        if self.verifier_plan is None:
            lines.append("verifier ablation: skipped (no --variants)")
        else:
            lines.append("verifier ablation sessions:")
            lines += ["  " + line for line in self.verifier_plan.describe(root / VERIFIERS_DIR).splitlines()]
            verifier_calls = sum(c.budget for c in self.verifier_plan.cells
                                 if c.method.name not in (SEED_METHOD, PLACEBO_METHOD))
        total = self.optimisation_budget() + verifier_calls
        lines.append(f"total: {total} optimisation metric calls (study {self.optimisation_budget()}, verifier "
                     f"ablation {verifier_calls}); harness scoring outside the budgets: about {harness} held-out/val "
                     f"scorings in the study and {self.ablation_scorings()} in the topic-shared ablation; the prompt "
                     "autopsy scores nothing")
        lines += ["what it can detect: " + line for line in self.detectable()]
        return "\n".join(lines)


def plan_generalisation(spec: GeneralisationSpec, *, data_dir: str | None = None,
                        allow_drift: bool = False) -> GeneralisationPlan:
    """Check the design (a real optimizer, >= 1 seed, budget >= 1), prove the split, and lay out
    the sessions. Writes nothing."""
    if spec.optimizer.name in (SEED_METHOD, PLACEBO_METHOD):
        # the placebo's cells are the floor: an optimizer of that name would be read as its own draws
        raise GeneralisationError(f"{spec.optimizer.name!r} is the protocol's baseline (the seed candidate and its "
                                  "placebo draws); name the optimizer to study (or run it under another name)")
    if not spec.seeds:
        raise GeneralisationError("name at least one seed (>= 3 for a verdict)")
    if spec.budget < 1:
        raise GeneralisationError(f"--budget must be >= 1 metric call, got {spec.budget}")
    task = load_task(spec.task, spec.profile, data_dir, allow_drift)
    if task.kind != "prompt" or not task.splits.get("train"):
        raise GeneralisationError(f"{task.name} is not a prompt task with training data: the protocol reads "
                                  "answer keys in prompts")
    split = prove_split(task, spec.allow_topic_shared)
    methods = [Method(SEED_METHOD, SEED_METHOD), spec.optimizer]
    cells = tuple(build_cells([task.name], methods, list(spec.seeds), {task.name: spec.budget}, spec.profile,
                              dict(spec.options))
                  + build_cells([task.name], [Method(PLACEBO_METHOD, PLACEBO_METHOD)],
                                placebo_seeds(spec.seeds, spec.draws()), {task.name: spec.budget}, spec.profile,
                                dict(spec.options)))
    check_minimum_budgets(cells, "protocol generalisation")
    verifier_plan = (plan_ablation(task.name, spec.optimizer, spec.variants, spec.seeds, spec.budget,
                                   profile=spec.profile, options=dict(spec.options), data_dir=data_dir,
                                   allow_drift=allow_drift, placebo_draws=spec.placebo_draws,
                                   origin="protocol generalisation") if spec.variants
                     else None)
    return GeneralisationPlan(spec=spec, split=split, sizes=task.sizes(), cells=cells, verifier_plan=verifier_plan)


# -- step 3: the held-out comparison ---------------------------------------------------------------
@dataclass(frozen=True)
class SeedGain:
    """One seed: the seed candidate's scores (its one draw), the mean scores of that seed's placebo
    draws (the noise floor; None without draws) and the final candidate's. Gains are over the
    floor when it exists, else over the seed. Scores are in the metric's direction: a
    lower-is-better metric's are negated (:func:`compare_heldout`), so a gain is an improvement."""

    seed: int
    seed_val: float
    final_val: float
    seed_test: float
    final_test: float
    floor_val: float | None = None
    floor_test: float | None = None

    @property
    def val_gain(self) -> float:
        return self.final_val - (self.seed_val if self.floor_val is None else self.floor_val)

    @property
    def heldout_gain(self) -> float:
        return self.final_test - (self.seed_test if self.floor_test is None else self.floor_test)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "val_gain": self.val_gain, "heldout_gain": self.heldout_gain,
                "gap": self.val_gain - self.heldout_gain}


@dataclass
class HeldoutComparison:
    """Validation gain against held-out gain, per seed and pooled, with the three verdicts (rule
    ``placebo-floor``: each against that seed's neutral re-wordings of the seed)."""

    per_seed: list[SeedGain]
    heldout: Contrast
    validation: Contrast
    gap: Contrast
    placebo_draws: dict[int, int] = field(default_factory=dict)

    def pooled(self, key: str) -> float:
        values = [getattr(g, key) for g in self.per_seed]
        return float(sum(values) / len(values))

    def as_dict(self) -> dict[str, Any]:
        return {"per_seed": [g.as_dict() for g in self.per_seed],
                "pooled": {"val_gain": self.pooled("val_gain"), "heldout_gain": self.pooled("heldout_gain")},
                "heldout": self.heldout.as_dict(), "validation": self.validation.as_dict(),
                "gap": self.gap.as_dict(), "placebo_draws": {str(k): v for k, v in self.placebo_draws.items()}}


def _mean(values: Sequence[float] | None) -> float | None:
    return float(sum(values) / len(values)) if values else None


def compare_heldout(records: Sequence[RunRecord], optimizer: str, sizes: dict[str, int],
                    alpha: float = DEFAULT_ALPHA) -> HeldoutComparison:
    """Per seed, the optimizer's final candidate against that seed's placebo draws (neutral
    re-wordings of the seed candidate, :mod:`heldout.protocols.placebo`): held-out score,
    validation score, and the validation-minus-held-out gap, each by rule ``placebo-floor``; the
    verdicts are one Holm family of three. The seed candidate's own scores are kept as description."""
    by = {(r.method, r.seed): r for r in records}
    seeds = sorted(s for m, s in by if m == optimizer and (SEED_METHOD, s) in by)
    if not seeds:
        raise GeneralisationError(f"no seed with finished runs of both {optimizer!r} and {SEED_METHOD!r}")
    # every gain and verdict below reads "higher is better": a lower-is-better metric enters negated, here only
    sign = MetricSpec.from_record(by[(optimizer, seeds[0])].experiment).sign
    floor_test = floor_values(records, lambda r: None if r.test_score is None else sign * r.test_score, seeds)
    floor_val = floor_values(records, lambda r: None if r.val_score is None else sign * r.val_score, seeds)
    floor_gap = floor_values(records, lambda r: None if r.val_score is None or r.test_score is None
                             else sign * (r.val_score - r.test_score), seeds)
    missing = [s for s in seeds if not floor_test.get(s)]
    if missing:
        raise GeneralisationError(f"seed(s) {missing} have no finished placebo draw: the verdicts against the seed "
                                  "need its noise floor (re-run the same command to continue)")
    gains = []
    for s in seeds:
        final, base = by[(optimizer, s)], by[(SEED_METHOD, s)]
        values = (base.val_score, final.val_score, base.test_score, final.test_score)
        if any(v is None for v in values):
            raise GeneralisationError(f"seed {s}: a run record lacks its val or held-out score (the profile needs "
                                      "val and test examples)")
        gains.append(SeedGain(s, *(sign * float(v) for v in values), floor_val=_mean(floor_val.get(s)),  # type: ignore[arg-type]
                              floor_test=_mean(floor_test.get(s))))
    n_val, n_test = max(1, sizes.get("val", 1)), max(1, sizes.get("test", 1))
    # A seed-blind optimizer returns one candidate in every seed: its seeds re-score one run.
    replayed = len({by[(optimizer, s)].final_candidate_id for s in seeds}) == 1 and len(seeds) > 1
    labels = ("placebo", optimizer)
    held = beyond_placebo(floor_test, {g.seed: g.final_test for g in gains}, n_examples=n_test, alpha=alpha,
                          labels=labels, label="held-out gain", replayed=replayed)
    val = beyond_placebo(floor_val, {g.seed: g.final_val for g in gains}, n_examples=n_val, alpha=alpha,
                         labels=labels, label="validation gain", replayed=replayed)
    gap = beyond_placebo(floor_gap, {g.seed: g.final_val - g.final_test for g in gains},
                         n_examples=min(n_val, n_test), alpha=alpha, labels=labels,
                         label="validation-minus-held-out gap", replayed=replayed)
    held, val, gap = holm([held, val, gap], alpha)
    return HeldoutComparison(per_seed=gains, heldout=held, validation=val, gap=gap,
                             placebo_draws={s: len(floor_test.get(s, [])) for s in seeds})


# -- the reading -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sentence:
    """One sentence of the reading and the number or verdict it comes from."""

    text: str
    source: str


@dataclass(frozen=True)
class GapReading:
    """One answer to the study's question, for the decided signs it applies to. ``key_pays``:
    the final candidates hold an answer key and the ablation's exact-training-question contrast
    (on the questions the key encodes) separated upward; ``heldout`` is the held-out gain's sign,
    ``gap`` the validation-minus-held-out gap's; None matches either value."""

    name: str
    key_pays: bool | None
    heldout: str
    gap: str
    proven: bool | None
    text: str

    def matches(self, key_pays: bool, heldout: str, gap: str, proven: bool) -> bool:
        return ((self.key_pays is None or self.key_pays == key_pays) and heldout in self.heldout
                and gap in self.gap and (self.proven is None or self.proven == proven))


GAP_READINGS: tuple[GapReading, ...] = (
    GapReading("memorisation", True, "0-", "+-0", None,
               "Memorisation: the answer key pays on the training questions it encodes (decided) while held-out "
               "topics do not gain."),
    GapReading("transfer", None, "+", "+-0", True,
               "Transfer: the held-out gain beyond the seed's re-wording noise is decided on a proven "
               "topic-disjoint split."),
    GapReading("heldout-gain-not-proven", None, "+", "+-0", False,
               "The held-out gain beyond the seed's re-wording noise is decided, but the split is not proven "
               "topic-disjoint: it cannot be told from "
               "a topic-level key, so it is not called transfer."),
    GapReading("selection", False, "0-", "+", None,
               "The validation score overstates the held-out score by more than re-wording the seed does (the gap "
               "is decided) and no answer key earns a decided gain: selection on validation, not a key this "
               "protocol measures."),
    GapReading("undecided", False, "0", "0", None,
               "Undecided: no answer key earns a decided gain and neither the held-out gain nor the gap separates "
               "from the seed's re-wording noise, so at these seeds memorisation, selection noise and transfer "
               "cannot be told apart."),
    GapReading("no-answer", None, "+-0", "+-0", None,
               "No single answer: the verdicts that separate (listed above) fit neither memorisation, selection on "
               "validation nor transfer."),
)
"""First match wins; the last rule admits every pattern (``tests/test_generalisation_protocol.py``
enumerates all of them and checks no sentence claims what its signs do not support)."""


SEED_BLIND_ANSWER = ("Seed-blind: every seed ended on the same candidate, so the seeds replicate nothing and no "
                     "verdict about the optimizer exists at any seed count; the numbers above are one run's. Make "
                     "the seed drive the run (the optimizer's own randomness, its data order).")


def gap_reading(key_pays: bool, heldout: str, gap: str, proven: bool) -> GapReading:
    return next(r for r in GAP_READINGS if r.matches(key_pays, heldout, gap, proven))


@dataclass
class GeneralisationResult:
    spec: GeneralisationSpec
    split: SplitProof
    comparison: HeldoutComparison
    ablation: Ablation
    autopsy: Autopsy
    verifier: VerifierAblation | None
    reading: list[Sentence] = field(default_factory=list)
    answer: str = ""
    study_results: list[dict[str, Any]] = field(default_factory=list)
    evidence: ReviewerEvidence | None = None  # per-item gains, lineage deltas, recipe baseline (reviewer_evidence)

    def method_ablation(self) -> MethodAblation:
        return next(m for m in self.ablation.methods if m.method == self.spec.optimizer.name)

    def as_dict(self) -> dict[str, Any]:
        return {"spec": self.spec.as_dict(), "split": self.split.as_dict(), "comparison": self.comparison.as_dict(),
                "ablation": self.ablation.to_dict(), "autopsy": self.autopsy.as_dict(),
                "verifier": None if self.verifier is None else self.verifier.to_dict(),
                "reading": [asdict(s) for s in self.reading], "answer": self.answer,
                "evidence": None if self.evidence is None else self.evidence.as_dict()}


def read_protocol(result: GeneralisationResult) -> tuple[list[Sentence], str]:
    """The reading: one sentence per part, each naming its source, then the answer from
    :data:`GAP_READINGS`. The ablation's and the verifier ablation's sentences are theirs
    (:func:`heldout.protocols.leak_readings.reading`, :func:`heldout.protocols.verifier_ablation.reading`)."""
    split, comp, auto = result.split, result.comparison, result.autopsy
    out = []
    if split.proven:
        out.append(Sentence(f"The profile is proven topic-disjoint ({split.verdict}).", "split check"))
    else:
        out.append(Sentence(f"NOT PROVEN topic-disjoint ({split.verdict}); run with --allow-topic-shared, so no "
                            "held-out gain below is called a rule or transfer.", "split check"))
    draws = sorted(set(comp.placebo_draws.values()))
    out.append(Sentence(f"Pooled over {len(comp.per_seed)} seed(s), the validation gain over the placebo floor (each "
                        f"seed's {'/'.join(map(str, draws))} neutral re-wording(s) of the seed) is "
                        f"{comp.pooled('val_gain'):+.3f} and the held-out gain {comp.pooled('heldout_gain'):+.3f}.",
                        "table: validation gain vs held-out gain, pooled row"))
    for c in (comp.heldout, comp.validation, comp.gap):
        out.append(Sentence(c.sentence + ".", f"verdict {c.rule}: {c.label}"))
    m = result.method_ablation()
    out.append(Sentence(m.reading, f"topic-shared ablation reading rule {m.reading_rule!r}"))
    finals = auto.final_shares()
    if finals and max(finals) > 0:
        out.append(Sentence(f"The final candidates hold an answer key: share {min(finals):.1%} to {max(finals):.1%} "
                            f"of their words.", "autopsy table, final rows"))
    else:
        out.append(Sentence("No final candidate holds an answer key (share 0).", "autopsy table, final rows"))
    out.append(Sentence(auto.correlation_note + "; " + CAVEAT + ".", "autopsy: Spearman correlation"))
    if result.verifier is not None:
        for row in result.verifier.rows:
            out.append(Sentence(f"Verifier {row.variant}: {row.reading}", f"verdict seed-paired-contrast: "
                                                                           f"{row.variant} gaming gap"))
    recipe = result.evidence.recipe if result.evidence is not None else None
    if recipe is not None:
        share = "undefined" if recipe.share_heldout is None else f"{recipe.share_heldout:.0%}"
        out.append(Sentence(f"{recipe.reading} The recipe (final minus its answer key) holds {share} of the held-out "
                            "gain.", f"recipe baseline rule {recipe.reading_rule!r} over seed-paired-contrast "
                                     "verdicts (Holm over 4)"))
    signs, has_key = reading_signs(m)
    key_pays = has_key and signs[0] == "+"
    rule = gap_reading(key_pays, comp.heldout.sign, comp.gap.sign, split.proven)
    if comp.heldout.replayed and m.reading_rule == "seed-blind":
        # the seeds replayed one run: "undecided" would blame the seed count, not the design
        out.append(Sentence(SEED_BLIND_ANSWER, "answer: every seed of both methods ended on the same candidate "
                                               "(final candidate ids)"))
        return out, "seed-blind"
    text = rule.text if split.proven else rule.text.replace("held-out topics", HELD_OUT_ROW[False])
    out.append(Sentence(text, f"answer rule {rule.name!r} over: key in the final candidates {has_key}, "
                                   f"exact-training-question sign {signs[0]!r}, held-out gain sign "
                                   f"{comp.heldout.sign!r}, gap sign {comp.gap.sign!r}, topic-disjoint {split.proven}"))
    return out, rule.name


# -- running it ------------------------------------------------------------------------------------
def run_generalisation(plan: GeneralisationPlan, run_dir: str | Path, config: StudyConfig, *,
                       executor: Executor | None = None, jobs: int = 2, progress: bool = True,
                       resume_hint: str | None = None) -> GeneralisationResult:
    """Run (or continue) every step of the plan under ``run_dir`` (layout in the module docstring)
    and return the result; ``config`` gives models, data and policy (its ``run_root`` is set here)."""
    root = Path(run_dir)
    spec = plan.spec
    saved = root / SPEC_FILE
    wanted = {"spec": spec.as_dict(), "split": plan.split.as_dict()}
    if saved.is_file():
        previous = json.loads(saved.read_text())
        if previous.get("spec") != json.loads(json.dumps(wanted["spec"], default=str)):
            raise GeneralisationError(f"{root} holds another generalisation study ({saved}); use a new --run-dir")
    elif root.exists() and any(root.iterdir()):
        raise GeneralisationError(f"{root} is not empty and holds no {SPEC_FILE}; use a new --run-dir")
    study_config = StudyConfig(**{**asdict(config), "run_root": str(root / RUNS_DIR)})
    # a refused protocol writes nothing: models, endpoints and sandbox are checked before our first
    # file (an unchanged spec file is not rewritten)
    check_infrastructure(list(plan.cells), study_config)
    if not saved.is_file():
        root.mkdir(parents=True, exist_ok=True)
        write_text_atomically(saved, json.dumps(wanted, indent=1, default=str))  # first: a crash after it can rerun
    open_study(list(plan.cells), study_config, resume=None)  # same cells and settings: continue, else refuse
    ledger = Ledger.open(root / GENERALISATION_DIR)
    try:
        ledger.append_entry("generalisation_start", {**wanted, "config": config.experiment()})
        results = run_study(list(plan.cells), study_config, executor or LocalExecutor(1), progress=progress,
                            resume_hint=resume_hint)
        stopped = [r for r in results if r["status"] in ("interrupted", "not started")]
        if stopped:
            again = f": {resume_hint}" if resume_hint else ""
            raise GeneralisationInterrupted(f"stopped before {len(stopped)} session(s) finished; every ledger is "
                                            f"consistent, re-run the same command to continue{again}")
        failed = [r for r in results if r["status"] != "ok"]
        if failed:
            first = failed[0]
            raise GeneralisationError(f"{len(failed)} session(s) did not finish; first: {first['method']} seed "
                                      f"{first['seed']} ({first['run_dir']}): {first['status']} {first.get('error') or ''}"
                                      .rstrip())
        records = [r for r in find_records(root / RUNS_DIR) if r.status == "ok"]
        comparison = compare_heldout(records, spec.optimizer.name, plan.sizes)
        worker = study_client(config.worker_model, study_config)
        ablation = ablate(root / RUNS_DIR, baseline=SEED_METHOD, worker=worker,
                          data_dir=config.data_dir, jobs=jobs)
        task = load_task(spec.task, spec.profile, config.data_dir, config.allow_drift)
        mine = {c.seed: c.run_dir(root / RUNS_DIR) for c in plan.cells if c.method.name == spec.optimizer.name}
        post = autopsy([r for r in records if r.method == spec.optimizer.name], mine, task)
        verifier = None
        if plan.verifier_plan is not None:
            verifier_config = StudyConfig(**{**asdict(config), "run_root": str(root / VERIFIERS_DIR)})
            try:
                verifier = run_ablation(plan.verifier_plan, verifier_config, executor, progress=progress,
                                        resume_hint=resume_hint)
            except AblationInterrupted as exc:  # a stop, not a failed session
                raise GeneralisationInterrupted(str(exc)) from None
        pairs = pair_by_seed(records, SEED_METHOD, spec.optimizer.name)
        evidence = gather(pairs, task, accepted={r.seed: accepted_candidates(r) for _, r in pairs},
                          texts={s: ledger_components(d) for s, d in mine.items()},
                          worker=study_client(config.worker_model, study_config), run_dir=root, jobs=jobs)
        result = GeneralisationResult(spec=spec, split=plan.split, comparison=comparison, ablation=ablation,
                                      autopsy=post, verifier=verifier, study_results=results, evidence=evidence)
        result.reading, result.answer = read_protocol(result)
        ledger.append_entry("generalisation_end", {"answer": result.answer,
                                                   "reading": [asdict(s) for s in result.reading]})
    finally:
        ledger.close()
    return result


__all__ = ["GAP_READINGS", "SEED_BLIND_ANSWER", "RUNS_DIR", "SEED_METHOD", "SPEC_FILE", "VERIFIERS_DIR",
           "GapReading", "GeneralisationError", "GeneralisationInterrupted", "GeneralisationPlan",
           "GeneralisationResult", "GeneralisationSpec", "HeldoutComparison", "SeedGain", "Sentence", "SplitProof",
           "compare_heldout", "gap_reading", "plan_generalisation", "prove_split", "read_protocol",
           "run_generalisation"]
