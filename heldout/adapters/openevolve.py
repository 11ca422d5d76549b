"""OpenEvolve (0.4.0) driven through a heldout view, on heldout's program tasks.

OpenEvolve runs its iterations in a process pool: each worker asks its LLM for a change, applies
it and calls the *evaluator module*'s ``evaluate(program_path)``. The view lives in the process
that called :func:`optimize`, so :class:`ViewBridge` serves it to those workers over a Unix socket
(``multiprocessing.connection`` with a random key, passed in the environment OpenEvolve copies to
its workers). The evaluator functions of this module forward every evaluation to the view, so
candidates run in heldout's sandbox, are charged to heldout's budget and land in its ledger;
OpenEvolve never executes a candidate itself. Its LLM is the session's metered architect
(``LLMModelConfig.init_client`` builds :class:`ArchitectLLM`), in-process and isolated alike.

The evaluator module (OpenEvolve loads a file; :func:`write_evaluator_file` writes a two-line one
importing these functions):

* ``evaluate(program_path)``: the program on every train and val example of the view;
* cascade: ``evaluate_stage1`` on the first train examples (a quarter, at least one),
  ``evaluate_stage2`` on the rest of train and on val, its metrics covering both stages.

Metrics: ``combined_score`` (the mean score over what was evaluated), ``train_score``,
``val_score`` (when val was evaluated), each *oriented* (``view.metric.sign`` times the mean,
because OpenEvolve only maximises: a lower-is-better metric's cost arrives negated, and the
``openevolve_run`` event says so in ``scores_fed_to_openevolve``), ``valid`` (the share of valid
verdicts) and the mean of each shown dimension. Artifacts (what OpenEvolve feeds back to its LLM):
feedback built only from the fields the visibility policy showed (train: feedback, errors,
dimensions; val: nothing but the score, which is already a metric). An evaluation the budget
cannot pay for is refused by the view (nothing runs) and scores the metric's failure score
(oriented) with ``budget_refused`` = 1. :func:`optimize` sizes OpenEvolve's iterations to the
remaining budget, so that only happens if the budget is shared.

Run isolated: ``--optimizer-cmd "openevolve=python -m heldout.adapters.openevolve"``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import secrets
import shutil
import socket
import threading
from dataclasses import asdict
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from pathlib import Path
from typing import Any, Sequence

from heldout.adapters.client import run_from_env
from heldout.adapters.settings import OpenEvolveSettings, refuse_below_minimum, verifier_repeats
from heldout.adapters.shown import feedback_text
from heldout.contracts import BudgetExceeded, Candidate, HeldoutError, TaskView
from heldout.files import make_temp_dir

try:
    from openevolve import run_evolution
    from openevolve.config import Config, LLMModelConfig
    from openevolve.evaluation_result import EvaluationResult
    from openevolve.llm.base import LLMInterface
except ImportError as exc:  # an optional extra
    raise HeldoutError(f"the OpenEvolve adapter needs openevolve==0.4.0 (pip install 'heldout[openevolve]'): {exc}") from exc

ADDRESS_ENV = "HELDOUT_OPENEVOLVE_BRIDGE"
KEY_ENV = "HELDOUT_OPENEVOLVE_KEY"
EVENT = "openevolve_run"


# -- the bridge (in the process holding the view) ---------------------------------------------------
class ViewBridge:
    """Serves ``evaluate``, ``architect`` and the task's shape to OpenEvolve's worker processes.
    Counts what it forwarded: ``evaluations`` (requests), ``metric_calls`` (examples charged),
    ``refusals`` (requests the budget refused)."""

    def __init__(self, view: TaskView) -> None:
        self.view = view
        self.component = "program.py" if "program.py" in view.seed_candidate else sorted(view.seed_candidate)[0]
        self.evaluations = self.metric_calls = self.refusals = 0
        self._lock = threading.Lock()
        self._dir = str(make_temp_dir("openevolve-bridge-"))  # 0700: only this user reaches the socket
        self.address = os.path.join(self._dir, "bridge.sock")
        self.key = secrets.token_bytes(32)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.key)
        self._thread = threading.Thread(target=self._accept, name="heldout-openevolve-bridge", daemon=True)
        self._closed = False

    def start(self) -> "ViewBridge":
        self._thread.start()
        return self

    def env(self) -> dict[str, str]:
        return {ADDRESS_ENV: self.address, KEY_ENV: self.key.hex()}

    def close(self) -> None:
        self._closed = True
        try:  # wake the accept loop: a bare connection that fails the handshake at once
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(self.address)
        except OSError:
            pass
        self._thread.join(timeout=10)
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, AuthenticationError):
                if self._closed:
                    return
                continue  # a client without the key: refused by the handshake
            if self._closed:
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        with conn:
            while True:
                try:
                    op, args = conn.recv()
                except (EOFError, OSError):
                    return
                conn.send(self._handle(op, args))

    def _handle(self, op: str, args: dict[str, Any]) -> tuple[str, Any]:
        try:
            if op == "shape":
                metric = self.view.metric
                return "ok", {"component": self.component, "seed": dict(self.view.seed_candidate),
                              "train": [ex["id"] for ex in self.view.train], "val": [ex["id"] for ex in self.view.val],
                              "sign": metric.sign, "failure_score": float(metric.failure_score or 0.0)}
            if op == "evaluate":
                with self._lock:  # one evaluation at a time: the counts stay exact
                    before = self.view.remaining
                    try:
                        results = self.view.evaluate(args["candidate"], args["split"], args["ids"])
                    except BudgetExceeded as exc:
                        self.refusals += 1
                        return "budget", str(exc)
                    self.evaluations += 1
                    self.metric_calls += before - self.view.remaining
                return "ok", results
            if op == "architect":
                return "ok", self.view.architect(args["messages"], temperature=args["temperature"],
                                                 max_tokens=args["max_tokens"])
            return "error", f"unknown bridge operation {op!r}"
        except BudgetExceeded as exc:
            return "budget", str(exc)
        except HeldoutError as exc:
            return "error", str(exc)


# -- the worker side ------------------------------------------------------------------------------
_local = threading.local()


def _call(op: str, **args: Any) -> Any:
    """One request to the bridge (a connection per thread, opened on first use)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        address, key = os.environ.get(ADDRESS_ENV), os.environ.get(KEY_ENV)
        if not address or not key:
            raise HeldoutError(f"the heldout evaluator runs only under heldout.adapters.openevolve.optimize "
                               f"({ADDRESS_ENV} is not set)")
        conn = _local.conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    conn.send((op, args))
    status, value = conn.recv()
    if status == "budget":
        raise BudgetExceeded(value)
    if status != "ok":
        raise HeldoutError(value)
    return value


class ArchitectLLM(LLMInterface):
    """OpenEvolve's LLM: the session's metered architect, reached through the bridge."""

    def __init__(self, model_cfg: Any = None) -> None:
        self.model = getattr(model_cfg, "name", None) or "heldout-architect"
        self.temperature = getattr(model_cfg, "temperature", None)
        self.max_tokens = getattr(model_cfg, "max_tokens", None)

    async def generate(self, prompt: str, **kwargs: Any) -> str:
        return await self.generate_with_context("", [{"role": "user", "content": prompt}], **kwargs)

    async def generate_with_context(self, system_message: str, messages: list[dict[str, str]], **kwargs: Any) -> str:
        full = ([{"role": "system", "content": system_message}] if system_message else []) + \
            [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        temperature = kwargs.get("temperature", self.temperature)
        return await asyncio.to_thread(_call, "architect", messages=full,
                                       temperature=1.0 if temperature is None else float(temperature),
                                       max_tokens=kwargs.get("max_tokens", self.max_tokens))


def architect_client(model_cfg: Any) -> ArchitectLLM:
    """``LLMModelConfig.init_client``."""
    return ArchitectLLM(model_cfg)


def _shape() -> dict[str, Any]:
    shape = getattr(_local, "shape", None)
    if shape is None:
        shape = _local.shape = _call("shape")
    return shape


def _stage1_ids(train: Sequence[str]) -> list[str]:
    return list(train[:max(1, math.ceil(len(train) / 4))]) if train else []


def _oriented_mean(rows: Sequence[dict[str, Any]], sign: int) -> float:
    """The rows' mean score times the metric's sign: OpenEvolve maximises its metrics."""
    return sign * sum(r["score"] for r in rows) / len(rows) if rows else 0.0


def _failed(**metrics: float) -> dict[str, float]:
    """A failed evaluation's metrics: the metric's failure score, oriented, never a 0 that would be
    the best cost there is."""
    shape = _shape()
    return {"combined_score": shape["sign"] * shape["failure_score"], **metrics}


def _metrics(results: dict[str, list[dict[str, Any]]], sign: int) -> EvaluationResult:
    """OpenEvolve's metrics of what the view showed; ``sign`` is the metric's (+1 or -1)."""
    rows = [r for split in ("train", "val") for r in results.get(split, [])]
    metrics: dict[str, float] = {"combined_score": _oriented_mean(rows, sign)}
    for split in ("train", "val"):
        if results.get(split):
            metrics[f"{split}_score"] = _oriented_mean(results[split], sign)
    shown_valid = [r["valid"] for r in rows if "valid" in r]
    if shown_valid:
        metrics["valid"] = sum(map(float, shown_valid)) / len(shown_valid)
    dims: dict[str, list[float]] = {}
    for r in rows:
        for name, value in (r.get("dimensions") or {}).items():
            dims.setdefault(name, []).append(float(value))
    metrics.update({f"dim_{k}": sum(v) / len(v) for k, v in dims.items()})
    shown = [f"[{split} {r['id']}]\n{feedback_text({k: v for k, v in r.items() if k != 'score'})}"
             for split in ("train", "val") for r in results.get(split, []) if len(r) > 2]
    artifacts = {"feedback": "\n\n".join(s for s in shown if not s.endswith("]\n"))[:20000]} if shown else {}
    return EvaluationResult(metrics=metrics, artifacts=artifacts)


Results = dict[str, list[dict[str, Any]]]


def _fetch(program_path: str, parts: dict[str, list[str]]) -> Results | EvaluationResult:
    """What the view shows for the program on ``parts`` (split -> ids), or the failed evaluation's
    result (a refusal of the budget, or of the request)."""
    shape = _shape()
    code = Path(program_path).read_text(encoding="utf-8")
    candidate = {**shape["seed"], shape["component"]: code}
    results: Results = {}
    try:
        for split, ids in parts.items():
            if ids:
                results[split] = _call("evaluate", candidate=candidate, split=split, ids=ids)
    except BudgetExceeded as exc:
        return EvaluationResult(metrics=_failed(budget_refused=1.0),
                                artifacts={"error": f"heldout refused the evaluation: {exc}"})
    except HeldoutError as exc:
        return EvaluationResult(metrics=_failed(), artifacts={"error": str(exc)})
    return results


def _stage1_memo() -> dict[str, Results]:
    memo = getattr(_local, "stage1", None)
    if memo is None:
        memo = _local.stage1 = {}
    return memo


def _key(program_path: str) -> str:
    return hashlib.sha256(Path(program_path).read_bytes()).hexdigest()


def evaluate(program_path: str) -> EvaluationResult:
    """The program on every train and val example of the view."""
    shape = _shape()
    results = _fetch(program_path, {"train": shape["train"], "val": shape["val"]})
    return results if isinstance(results, EvaluationResult) else _metrics(results, _shape()["sign"])


def evaluate_stage1(program_path: str) -> EvaluationResult:
    """Cascade stage 1: the first quarter of train (at least one example)."""
    results = _fetch(program_path, {"train": _stage1_ids(_shape()["train"])})
    if isinstance(results, EvaluationResult):
        return results
    _stage1_memo()[_key(program_path)] = results
    return _metrics(results, _shape()["sign"])


def evaluate_stage2(program_path: str) -> EvaluationResult:
    """Cascade stage 2: the rest of train and val; its metrics cover both stages."""
    shape = _shape()
    first = _stage1_memo().pop(_key(program_path), None)
    if first is None:  # stage 1 ran in another process: score everything here
        first, rest = {}, {"train": shape["train"], "val": shape["val"]}
    else:
        rest = {"train": shape["train"][len(_stage1_ids(shape["train"])):], "val": shape["val"]}
    later = _fetch(program_path, rest) if any(rest.values()) else {}
    if isinstance(later, EvaluationResult):
        return later
    return _metrics({split: first.get(split, []) + later.get(split, []) for split in ("train", "val")},
                    shape["sign"])


EVALUATOR_SOURCE = ("# written by heldout.adapters.openevolve: OpenEvolve's evaluator file\n"
                    "from heldout.adapters.openevolve import evaluate, evaluate_stage1, evaluate_stage2  # noqa: F401\n")


def write_evaluator_file(directory: str) -> str:
    path = os.path.join(directory, "heldout_evaluator.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(EVALUATOR_SOURCE)
    return path


# -- the named method -------------------------------------------------------------------------------
# What a fixed seed does and does not fix in OpenEvolve 0.4.0 (stated in every run's event): its
# program ids are uuid4 values and its sampling depends on them and on timings, so two runs with
# one seed may try different children at the same spend.
SEEDED = ("config.random_seed", "config.database.random_seed")
NOT_REPRODUCIBLE = "OpenEvolve 0.4.0 draws program ids from uuid4 and its sampling depends on them and on timings"
def _orientation(view: TaskView) -> str:
    metric = view.metric
    return f"{metric.name} as it is ({metric.direction})" if metric.higher_is_better else \
        f"-1 * {metric.name} ({metric.direction}; OpenEvolve maximises)"


def _oriented_threshold(view: TaskView, threshold: float | None) -> float:
    """The cascade's threshold on OpenEvolve's (oriented) combined_score."""
    return float("-inf") if threshold is None else view.metric.sign * threshold


def evaluation_cost(view: TaskView) -> int:
    """Metric calls of one full evaluation (both cascade stages)."""
    return len(view.train) + len(view.val)


def optimize(view: TaskView, seed: int, settings: OpenEvolveSettings = OpenEvolveSettings()) -> Candidate:
    seed_candidate = dict(view.seed_candidate)
    repeats = verifier_repeats(getattr(view, "verifier", None))
    refuse_below_minimum("openevolve", view.remaining,
                         settings.minimum_metric_calls(len(view.train), len(view.val)), repeats)
    cost = max(1, evaluation_cost(view)) * repeats
    iterations = min(settings.max_iterations, view.remaining // cost - 1)
    view.record_event("final_selection", split="train+val" if view.val else "train",
                      how="OpenEvolve's best program by combined_score, the mean over train and val")
    view.record_event("not_reproducible", what=NOT_REPRODUCIBLE + ": two runs with one seed may try different "
                      "children at the same spend", seeded=SEEDED)
    bridge = ViewBridge(view).start()
    work = str(make_temp_dir("openevolve-run-"))
    saved = {k: os.environ.get(k) for k in (ADDRESS_ENV, KEY_ENV)}
    os.environ.update(bridge.env())
    try:
        config = Config()
        config.random_seed = seed
        config.max_iterations = iterations
        config.checkpoint_interval = 10 ** 6
        config.diff_based_evolution = settings.diff_based_evolution
        config.log_level = "INFO"  # its log's "Evaluated program" lines are its own count of evaluations
        config.llm.models = [LLMModelConfig(name="heldout-architect", init_client=architect_client, weight=1.0)]
        config.llm.evaluator_models = list(config.llm.models)
        config.database.num_islands = settings.num_islands
        config.database.population_size = 50
        config.database.random_seed = seed
        config.evaluator.cascade_evaluation = True
        config.evaluator.cascade_thresholds = [_oriented_threshold(view, settings.cascade_threshold)]
        config.evaluator.parallel_evaluations = 1
        config.evaluator.timeout = settings.timeout_seconds
        config.evaluator.max_retries = 0
        seed_code = seed_candidate[bridge.component]
        result = run_evolution(seed_code, write_evaluator_file(work), config=config, iterations=iterations,
                               output_dir=os.path.join(work, "out"), cleanup=False)
        best_code = result.best_code or seed_code
        logs = sorted(Path(work, "out", "logs").glob("*.log"))
        believed = sum(log.read_text(encoding="utf-8", errors="replace").count("Evaluated program") for log in logs)
        view.record_event(EVENT, outcome="done", iterations=iterations, evaluations=bridge.evaluations,
                          settings=asdict(settings), seeded=SEEDED, not_reproducible=NOT_REPRODUCIBLE,
                          openevolve_evaluations=believed,
                          bridge_metric_calls=bridge.metric_calls, refusals=bridge.refusals,
                          best_score=float(result.best_score), scores_fed_to_openevolve=_orientation(view))
        return {**seed_candidate, bridge.component: best_code}
    finally:
        bridge.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    """Isolated entry point: ``python -m heldout.adapters.openevolve`` under ``--optimizer-cmd``."""
    return run_from_env(optimize)


if __name__ == "__main__":
    raise SystemExit(main())
