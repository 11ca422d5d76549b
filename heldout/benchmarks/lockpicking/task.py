"""``lockpicking/six``: recover a hidden system of interacting rules from aggregate feedback.

Candidate forms (dispatch by component name):

* ``scorer.sql``  - the paper's form: a Snowflake scalar expression over ``PROGRAM``
  (:mod:`heldout.benchmarks.lockpicking.sql`). Deterministic bodies run once over the whole pool
  in DuckDB and are cached per candidate, so ``run`` per example is a lookup; bodies calling
  ``AI_COMPLETE`` run per example (one worker call = one metric call) and are not cached.
* ``program.py``  - ``score(program: str) -> int``, run in the sandbox, one process per batch.
* ``instruction`` - a prompt for the worker model, sent through the same worker hook.

Verdict: exact match on the integer label. Feedback variant ``counts`` (default, the paper's)
shows only predicted and expected counts; ``decomposed`` also reveals which positions are valid
under the hidden rules. The exhaustive check (all 10^6 strings plus malformed ones) is reported by
:meth:`LockpickingBenchmark.summarize` and never appears in any verdict's feedback.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from heldout.contracts import (Candidate, Example, MalformedCandidate, Message, RunContext, RunLimits, Source, Verdict,
                               Worker, candidate_id, check_candidate)
from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.lockpicking import sql as sqlmod
from heldout.benchmarks.lockpicking.pool import load_pool
from heldout.benchmarks.lockpicking.rules import MALFORMED, N_POSITIONS, TRUTH
from heldout.benchmarks.candidates import read_candidate
from heldout.models import model_failure_kind
from heldout.sandbox import SandboxError, run_function, PROGRAM_PRELOAD, wall_backstop

HERE = Path(__file__).resolve().parent
CANDIDATES_DIR = HERE / "candidates"
RUNNER_MODULE = "_heldout_lockpicking"
FEEDBACK_VARIANTS = ("counts", "decomposed")
SQL, PYTHON, PROMPT = "scorer.sql", "program.py", "instruction"
_CACHE_SIZE = 64


@dataclass
class _Batch:
    """Outputs of one candidate on a set of programs, or one failure that applies to all of them."""

    outputs: dict[str, tuple[int | None, str | None]] = field(default_factory=dict)  # program -> (value, error)
    error: str | None = None
    error_kind: str | None = None
    seconds: float = 0.0


class LockpickingBenchmark(Benchmark):
    name = "lockpicking/six"
    family = "lockpicking"
    kind = "program"
    metric = "accuracy"
    version = "1"
    description = ("Lockpicking with interference (CoCoEvolve, app. G.1): recover 6 candidate sets and 12 "
                   "interacting trigger rules from per-string counts; SQL (sqlglot+DuckDB), Python or prompt "
                   "candidates; exhaustive check over all 10^6 strings")
    source = Source(embedded=True)
    # CPU time, as for every program task, so a verdict does not depend on the machine's load;
    # the wall limit only stops a candidate that waits (issue 53's rule, DESIGN "Time")
    default_limits = RunLimits(wall_seconds=wall_backstop(60.0), cpu_seconds=60.0, memory_mb=1024)
    default_component = SQL
    family_dir = HERE
    helper_sources = {f"{RUNNER_MODULE}.py": "sandbox_runner.py"}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: OrderedDict[tuple, _Batch] = OrderedDict()
        # one computation of a batch at a time: the examples of one evaluation arrive together, and
        # each running the whole pool's batch at once multiplied the work (and, under wall-clock
        # limits, failed some of them on a loaded machine)
        self._running: dict[tuple, threading.Event] = {}
        self._exhaustive: OrderedDict[tuple, dict[str, Any]] = OrderedDict()

    # -- data -------------------------------------------------------------------------------
    def load_raw(self, data_dir: str | None) -> list[Example]:
        """The stored pool: the 50 strings of the `paper` profile, then the further ones."""
        pool = load_pool()
        out = [Example(id=f"six-p{k:02d}", input={"program": s}, target=TRUTH.label(s), meta={"pool": "paper"})
               for k, s in enumerate(pool["paper"])]
        out += [Example(id=f"six-g{k:03d}", input={"program": s}, target=TRUTH.label(s), meta={"pool": "extra"})
                for k, s in enumerate(pool["extra"])]
        return out

    def _programs(self) -> list[str]:
        pool = load_pool()
        return pool["paper"] + pool["extra"]

    # -- candidates -------------------------------------------------------------------------
    def seed_candidate(self) -> Candidate:
        """The paper's seed as a deterministic SQL body: all six candidate sets, only rule 1."""
        return {SQL: (CANDIDATES_DIR / "seed.sql").read_text(encoding="utf-8")}

    def seed_instruction(self) -> Candidate:
        """The paper's seed in its prompt form (needs a worker model)."""
        return {PROMPT: (CANDIDATES_DIR / "seed_instruction.txt").read_text(encoding="utf-8")}

    def candidate_from_path(self, path: str) -> Candidate:
        suffix = Path(path).suffix.lower()
        component = {".sql": SQL, ".py": PYTHON, ".txt": PROMPT, ".md": PROMPT}.get(suffix)
        if component is None or Path(path).is_dir():
            return super().candidate_from_path(path)

        return read_candidate(path, component)

    @staticmethod
    def form(candidate: Candidate) -> str:
        """Which form a candidate is in: ``sql``, ``python`` or ``prompt``."""
        check_candidate(candidate)
        for component, form in ((SQL, "sql"), (PYTHON, "python"), (PROMPT, "prompt")):
            if component in candidate:
                return form
        raise MalformedCandidate(f"a lockpicking candidate needs a {SQL!r}, {PYTHON!r} or {PROMPT!r} component; "
                                 f"got {sorted(candidate)}")

    # -- the metric -------------------------------------------------------------------------
    verifier_options = {"count-only": {"feedback": "counts"}, "per-position": {"feedback": "decomposed"}}

    def extra_metrics(self, candidate: Candidate, verdicts: list[Verdict],
                      context: RunContext | None = None) -> dict[str, float]:
        """Exhaustive accuracy over all 10^6 strings (+ malformed ones), for deterministic forms."""
        try:
            form = self.form(candidate)
        except MalformedCandidate:
            return {}
        if form not in ("sql", "python") or (verdicts and all(not v.valid for v in verdicts)):
            return {}
        found = self.exhaustive(candidate, (context or self.context()).limits)["exhaustive_accuracy"]
        return {} if found is None else {"exhaustive_accuracy": found}

    # -- running ----------------------------------------------------------------------------
    def run(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> Verdict:
        context = context or self.context()
        limits = context.limits
        feedback = context.option("feedback", "counts")
        hook = _ai_complete(context.worker)
        program = example.input.get("program")
        if feedback not in FEEDBACK_VARIANTS:
            raise ValueError(f"feedback must be one of {FEEDBACK_VARIANTS}, not {feedback!r}")
        try:
            form = self.form(candidate)
            cid = candidate_id(candidate)
        except MalformedCandidate as exc:
            return Verdict.failure(example.id, str(exc), "malformed_candidate")
        if form == "prompt":
            return self._run_prompt(candidate, example, hook, feedback)
        if form == "sql":
            try:
                checked = sqlmod.check_sql(candidate[SQL])
            except sqlmod.SqlRejected as exc:
                return Verdict.failure(example.id, f"SQL candidate rejected: {exc}", exc.kind)
            if checked.uses_ai:  # one worker call per example: never batched over the pool
                batch = self._sql_batch(checked, [program], limits, hook)
                return self._verdict(example, batch, feedback)
        batch = self._cached_batch(cid, form, candidate, program, limits)
        return self._verdict(example, batch, feedback)

    def _cached_batch(self, cid: str, form: str, candidate: Candidate, program: str, limits: RunLimits) -> _Batch:
        key = (cid, limits)
        while True:
            with self._lock:
                batch = self._batches.get(key)
                if batch is not None and (batch.error or program in batch.outputs):
                    self._batches.move_to_end(key)
                    return batch
                running = self._running.get(key)
                if running is None:  # this thread computes the batch; the others wait for it
                    running = self._running[key] = threading.Event()
                    break
            running.wait()  # then look again: its batch may not hold this program, or was not kept
        try:
            return self._computed_batch(key, form, candidate, program, limits)
        finally:
            with self._lock:
                del self._running[key]
            running.set()

    def _computed_batch(self, key: tuple, form: str, candidate: Candidate, program: str, limits: RunLimits) -> _Batch:
        programs = self._programs()
        if program not in programs:
            programs = programs + [program]
        if form == "sql":
            batch = self._sql_batch(sqlmod.check_sql(candidate[SQL]), programs, limits, None)
        else:
            batch = self._python_batch(candidate, programs, limits)
        if batch.error_kind == "sandbox_error":  # not the candidate's fault: do not remember it
            return batch
        self._remember(self._batches, key, batch)
        return batch

    def _remember(self, cache: OrderedDict, key: tuple, value: Any) -> None:
        with self._lock:
            cache[key] = value
            while len(cache) > _CACHE_SIZE:
                cache.popitem(last=False)

    def _sql_batch(self, checked: sqlmod.CheckedSql, programs: list[str], limits: RunLimits,
                   hook: sqlmod.AiComplete | None) -> _Batch:
        try:
            run = sqlmod.execute(checked, programs, limits=limits, ai_complete=hook)
        except sqlmod.SqlExecutionError as exc:
            return _Batch(error=f"SQL execution failed: {exc}", error_kind=exc.kind)
        outputs: dict[str, tuple[int | None, str | None]] = {}
        for program, raw, parsed in zip(programs, run.raw, run.parsed):
            if parsed is not None:
                outputs[program] = (parsed, None)
            elif raw is None and run.ai_errors:
                outputs[program] = (None, f"AI_COMPLETE failed: {run.ai_errors[0]}")
            else:
                outputs[program] = (None, f"output {raw!r} is not an integer" if raw is not None else "output is NULL")
        return _Batch(outputs=outputs, seconds=run.seconds)

    def _python_batch(self, candidate: Candidate, programs: list[str], limits: RunLimits) -> _Batch:

        try:
            result = run_function(candidate, RUNNER_MODULE, "score_batch", [programs], limits=limits,
                                  setup_files=self.helper_files(), preload=PROGRAM_PRELOAD)
        except SandboxError as exc:
            return _Batch(error=f"malformed candidate: {exc}", error_kind="malformed_candidate")
        if not result.ok:
            return _Batch(error=_sandbox_message(result), error_kind=result.error_kind, seconds=result.seconds)
        value = result.value
        if not isinstance(value, list) or len(value) != len(programs):
            return _Batch(error="the runner returned a malformed batch", error_kind="bad_output")
        outputs = {p: (v[0], v[1]) for p, v in zip(programs, value)}
        return _Batch(outputs=outputs, seconds=result.seconds)

    def _run_prompt(self, candidate: Candidate, example: Example, hook: sqlmod.AiComplete | None,
                    feedback: str) -> Verdict:
        if hook is None:
            return Verdict.failure(example.id, "a prompt candidate needs a worker model and none is configured: "
                                   "run it in a session with a worker (--worker-model/--base-url)", "model_error")
        prompt = "\n\n".join(m.content for m in self.render(candidate, example))
        try:
            text = str(hook(prompt))
        except Exception as exc:  # noqa: BLE001 - a worker failure is this example's verdict
            # whose failure: a refused prompt is the candidate's, a failed endpoint never a score
            return Verdict.failure(example.id, f"worker call failed: {type(exc).__name__}: {exc}",
                                   model_failure_kind(exc))
        verdict = self.score_text(text, example)
        if feedback == "decomposed" and verdict.valid:
            verdict.feedback += "; " + _positions_text(example.input["program"])
        return verdict

    def _verdict(self, example: Example, batch: _Batch, feedback: str) -> Verdict:
        program = example.input.get("program")
        usage = {"batch_seconds": batch.seconds}
        if batch.error:
            return Verdict.failure(example.id, batch.error, batch.error_kind or "crash", usage=usage)
        value, error = batch.outputs.get(program, (None, "no output for this example"))
        shown = _show(program)
        if value is None:
            return Verdict.failure(example.id, f"PROGRAM {shown}: {error}", "bad_output", usage=usage,
                                   feedback=f"PROGRAM {shown}: {error}; expected {example.target}")
        text = f"PROGRAM {shown}: predicted {value}, expected {example.target}"
        if feedback == "decomposed":
            text += "; " + _positions_text(program)
        return Verdict(example.id, score=float(value == example.target), feedback=text, output=value, usage=usage)

    # -- prompt form ------------------------------------------------------------------------
    def render(self, candidate: Candidate, example: Example, context: RunContext | None = None) -> list[Message]:
        return [Message("system", candidate.get(PROMPT, "")),
                Message("user", f"PROGRAM: {example.input['program']}\nAnswer with a single integer.")]

    def score_text(self, text: str, example: Example, context: RunContext | None = None) -> Verdict:
        """The last integer in the worker's text is its answer (none: a valid verdict scoring 0)."""
        found = re.findall(r"-?\d+", text or "")
        shown = _show(example.input["program"])
        if not found:
            return Verdict(example.id, score=0.0, output=text,
                           feedback=f"PROGRAM {shown}: no integer in the answer {text[:80]!r}")
        value = int(found[-1])
        return Verdict(example.id, score=float(value == example.target), output=value,
                       feedback=f"PROGRAM {shown}: predicted {value}, expected {example.target}")

    # -- exhaustive check and summary -------------------------------------------------------
    def exhaustive(self, candidate: Candidate, limits: RunLimits | None = None) -> dict[str, Any]:
        """Agreement with the true rule system on all 10^6 six-digit strings plus the malformed
        set: ``{"exhaustive_accuracy", "exhaustive_n", "exhaustive_error"}``; accuracy is None for
        a candidate that is not deterministic (AI_COMPLETE, prompt) or could not run. Cached."""
        limits = limits or self.default_limits
        try:
            form = self.form(candidate)
            key = (candidate_id(candidate), limits)
        except MalformedCandidate as exc:
            return _exhaustive_result(None, 0, str(exc))
        with self._lock:
            if key in self._exhaustive:
                return self._exhaustive[key]
        if form == "prompt":
            return _exhaustive_result(None, 0, "not deterministic: a prompt candidate")
        truth = _exhaustive_truth()
        if form == "python":
            result = self._python_exhaustive(candidate, truth, limits)
            if result["exhaustive_error_kind"] == "sandbox_error":
                return result
        else:
            try:
                checked = sqlmod.check_sql(candidate[SQL])
                if checked.uses_ai:
                    return _exhaustive_result(None, 0, "not deterministic: the SQL body calls AI_COMPLETE")
                got = sqlmod.exhaustive_outputs(checked, MALFORMED, limits=limits)
            except (sqlmod.SqlRejected, sqlmod.SqlExecutionError) as exc:
                return _exhaustive_result(None, 0, str(exc))
            agree = int(((~np.ma.getmaskarray(got)) & (np.ma.getdata(got) == truth)).sum())
            result = _exhaustive_result(agree / truth.size, truth.size, None)
        self._remember(self._exhaustive, key, result)
        return result

    def _python_exhaustive(self, candidate: Candidate, truth: np.ndarray, limits: RunLimits) -> dict[str, Any]:

        try:
            result = run_function(candidate, RUNNER_MODULE, "score_exhaustive", [list(MALFORMED)], limits=limits,
                                  setup_files=self.helper_files(), preload=PROGRAM_PRELOAD)
        except SandboxError as exc:
            return _exhaustive_result(None, 0, str(exc), "malformed_candidate")
        if not result.ok:
            return _exhaustive_result(None, 0, _sandbox_message(result), result.error_kind)
        codes = (result.value or {}).get("codes") if isinstance(result.value, dict) else None
        if not isinstance(codes, str) or len(codes) != truth.size:
            return _exhaustive_result(None, 0, "the runner returned a malformed result", "bad_output")
        got = np.frombuffer(codes.encode("ascii", "replace"), dtype=np.uint8).astype(np.int64) - 48
        agree = int((got == truth).sum())  # 'x' (invalid) maps to 72, never a label
        return _exhaustive_result(agree / truth.size, truth.size, result.value.get("first_error"))

    def summarize(self, candidate: Candidate, verdicts: list[Verdict],
                  context: RunContext | None = None) -> dict[str, Any]:
        context = context or self.context()
        summary = super().summarize(candidate, verdicts, context)
        summary["correct"] = sum(1 for v in verdicts if v.score >= 1.0)
        try:
            summary["form"] = self.form(candidate)
        except MalformedCandidate as exc:
            summary["form"] = None
            summary["error"] = summary["error"] or str(exc)
        summary["feedback"] = context.option("feedback", "counts")
        failed_all = bool(verdicts) and all(not v.valid and v.error_kind != "bad_output" for v in verdicts)
        if summary["form"] in ("sql", "python") and not failed_all:
            ex = self.exhaustive(candidate, context.limits)
            summary["exhaustive_accuracy"] = ex["exhaustive_accuracy"]
            summary["exhaustive_n"] = ex["exhaustive_n"]
            if ex["exhaustive_accuracy"] is None:
                summary["exhaustive_error"] = ex["exhaustive_error"]
        else:
            summary["exhaustive_accuracy"] = None
        return summary


@lru_cache(maxsize=1)
def _exhaustive_truth() -> np.ndarray:
    """True labels of all 10^6 six-digit strings (index = value), then of the malformed set (0)."""
    truth = np.concatenate([TRUTH.labels_all().astype(np.int64), np.zeros(len(MALFORMED), dtype=np.int64)])
    truth.flags.writeable = False
    return truth


def _exhaustive_result(accuracy: float | None, n: int, error: str | None, kind: str | None = None) -> dict[str, Any]:
    return {"exhaustive_accuracy": accuracy, "exhaustive_n": n, "exhaustive_error": error,
            "exhaustive_error_kind": kind}


def _ai_complete(worker: Worker | None) -> sqlmod.AiComplete | None:
    """``AI_COMPLETE`` and prompt candidates call the session's metered worker (None: no worker)."""
    if worker is None:
        return None
    return lambda prompt: worker.complete([Message("user", prompt)]).text


def _sandbox_message(result: Any) -> str:
    tail = result.stdout_tail.strip().splitlines()[-3:] if result.stdout_tail else []
    extra = ("\n" + "\n".join(tail)) if tail and result.error_kind == "crash" else ""
    return f"Python candidate failed ({result.error_kind}): {result.error}{extra}"


def _show(program: Any) -> str:
    return repr(program) if isinstance(program, str) and len(program) <= 40 else repr(str(program)[:40]) + "..."


def _positions_text(program: str) -> str:
    flags = TRUTH.positions(program)
    return "positions valid under the hidden rules: " + " ".join(
        f"P{i + 1}={'valid' if ok else 'invalid'}" for i, ok in enumerate(flags[:N_POSITIONS]))


BENCHMARK = LockpickingBenchmark()
