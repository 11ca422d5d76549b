"""Export sessions as Inspect eval logs, so ``inspect view --log-dir LOGDIR`` shows every example.

``heldout export inspect RUN_DIR --out LOGDIR [--with-optimisation]`` writes, per session found
under ``RUN_DIR``, one log of its held-out scoring (``...__heldout.eval``) and, optionally, one of
every evaluation the optimizer paid for (``...__optimisation.eval``), with
``inspect_ai.log.write_eval_log`` (the optional extra ``heldout[inspect]``).

Rules:

* **the ledger is the source of truth**: a session's ledger must verify (:func:`verify_ledger`)
  or the session is not exported (it is listed as skipped, with the reason); scores, dimensions,
  outputs and candidates are read from its entries, never from the run record or a re-run;
* each sample holds the messages (the rendered prompt for a prompt task, the candidate's
  components for a program task), the model output, the extracted answer, the target, the score
  (``Score.value``) and its dimensions (``Score.metadata``); a prompt can only be rendered when
  the task's examples load (embedded tasks always, dataset tasks with a data dir) - otherwise
  the sample says so instead of guessing;
* the log's ``mean`` metric is the mean of the samples' scores, ``task_metric`` the task's own
  aggregate (the run record's ``test_score`` for held-out logs), one metric per dimension too;
* the log names what produced it, from the session's ``session_start`` entry: the worker model
  (``eval.model``; ``none`` for a program task without one), the task id (task, profile and the
  digest of its examples), heldout's version and commit (``eval.packages``, ``eval.revision``);
  token usage is each sample's (``EvalSample.model_usage``, from the verdict the ledger holds)
  and their sum (``stats.model_usage``); ids are derived from the ledger, so an export repeats.
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Mapping

from heldout.benchmarks.loading import load_task
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import HeldoutError, RunContext, Verdict
from heldout.evaluators.ledger import LEDGER_FILE, read_entries, verify_ledger
from heldout.evaluators.same_experiment import split_experiment

_API: SimpleNamespace | None = None


def inspect_api() -> SimpleNamespace:
    """The inspect-ai classes the export builds, imported on first use: inspect-ai is an optional
    extra and takes seconds to import, which no other ``heldout`` command should pay."""
    global _API
    if _API is None:
        try:
            log = importlib.import_module("inspect_ai.log")
            model = importlib.import_module("inspect_ai.model")
            scorer = importlib.import_module("inspect_ai.scorer")
        except ImportError:
            raise ExportError("the Inspect export needs inspect-ai: pip install 'heldout[inspect]'") from None
        _API = SimpleNamespace(**{name: getattr(log, name) for name in (
            "EvalConfig", "EvalDataset", "EvalError", "EvalLog", "EvalMetric", "EvalResults", "EvalSample",
            "EvalRevision", "EvalScore", "EvalSpec", "EvalStats", "write_eval_log")},
            **{name: getattr(model, name) for name in (
                "ChatMessageAssistant", "ChatMessageSystem", "ChatMessageUser", "ModelOutput", "ModelUsage")},
            Score=scorer.Score)
    return _API

SCORER = "heldout"


class ExportError(HeldoutError):
    pass


@dataclass
class ExportResult:
    """Logs written and sessions left out (with why)."""

    written: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Session:
    path: Path
    header: dict[str, Any]
    entries: list[dict[str, Any]]
    components: dict[str, dict[str, str]]  # candidate id -> components
    final_id: str | None
    status: str | None
    error: str | None


def export_inspect(run_dir: str | Path, out: str | Path, *, with_optimisation: bool = False,
                   data_dir: str | None = None) -> ExportResult:
    """Write Inspect logs for every session under ``run_dir`` into ``out``."""
    inspect_api()
    root = Path(run_dir)
    if not root.is_dir():
        raise ExportError(f"no such run dir: {root}")
    ledgers = sorted(root.rglob(LEDGER_FILE))
    if not ledgers:
        raise ExportError(f"no session (no {LEDGER_FILE}) under {root}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = ExportResult()
    model = _study_model(root)
    tasks: dict[tuple[str, str], Any] = {}
    for ledger in ledgers:
        session_dir = ledger.parent
        check = verify_ledger(session_dir)
        if not check.ok:
            result.skipped.append((session_dir, "ledger does not verify: " + "; ".join(check.problems)))
            continue
        session = _read_session(session_dir)
        if session is None:
            result.skipped.append((session_dir, "no session_start entry"))
            continue
        key = (session.header["task"], session.header["profile"])
        if key not in tasks:
            tasks[key] = _load_examples(session.header, data_dir, result)
        stem = "__".join(session_dir.relative_to(root).parts) or session_dir.name
        heldout = _log(session, "heldout", [e for e in session.entries if e["kind"] == "test_scoring"],
                       tasks[key], model)
        result.written.append(_write(heldout, out / f"{stem}__heldout.eval"))
        if with_optimisation:
            evaluations = [e for e in session.entries if e["kind"] == "evaluation"]
            if evaluations:  # e.g. the seed method pays for none
                optimisation = _log(session, "optimisation", evaluations, tasks[key], model)
                result.written.append(_write(optimisation, out / f"{stem}__optimisation.eval"))
    return result


def _write(log: "EvalLog", path: Path) -> Path:
    inspect_api().write_eval_log(log, str(path))
    return path


def _read_session(session_dir: Path) -> _Session | None:
    entries, _ = read_entries(session_dir / LEDGER_FILE)
    header = next((e["data"] for e in entries if e["kind"] == "session_start"), None)
    if header is None:
        return None
    header = split_experiment(header)  # task options and decoding apart, whichever heldout wrote it
    components = {e["data"]["candidate_id"]: e["data"]["components"] for e in entries
                  if e["kind"] in ("candidate", "final_candidate")}
    final = next((e["data"]["candidate_id"] for e in reversed(entries) if e["kind"] == "final_candidate"), None)
    end = next((e["data"] for e in reversed(entries) if e["kind"] == "session_end"), None)
    failed = next((e["data"] for e in reversed(entries) if e["kind"] == "optimizer_failed"), None)
    return _Session(session_dir, header, entries, components, final,
                    status=None if end is None else end.get("status"),
                    error=None if failed is None else failed.get("error"))


def _load_examples(header: Mapping[str, Any], data_dir: str | None, result: ExportResult):
    """The task with its examples (for prompts and targets), or None when they do not load here."""
    try:
        return load_task(header["task"], profile=header["profile"], data_dir=data_dir,
                         allow_drift=header.get("drift") is not None)
    except (HeldoutError, OSError, ValueError) as exc:
        result.notes.append(f"{header['task']} [{header['profile']}]: examples not loaded ({exc}); samples carry "
                            "the ledger's outputs and scores but no rendered prompt or target")
        return None


NO_MODEL = "none"


def _study_model(root: Path) -> str:
    """The worker model named in the study (``study.json``'s flat ``config.worker_model``), for a
    session whose ``session_start`` predates naming its worker."""
    for path in [root / "study.json", *(p / "study.json" for p in root.parents)]:
        if path.is_file():
            try:
                study = json.loads(path.read_text())
                model = study.get("config.worker_model") if isinstance(study, dict) else None
            except (OSError, ValueError):
                model = None
            if model:
                return str(model)
            break
    return NO_MODEL


def _worker_model(header: Mapping[str, Any], study_model: str) -> str:
    """The model that answered the held-out examples (``deployment_worker``), else the worker; a
    session that had none (a program task in a study whose prompt tasks had one) says ``none``.
    Only a ``session_start`` that does not name its worker at all falls back to the study's."""
    for key in ("deployment_worker", "worker"):
        described = header.get(key)
        if isinstance(described, dict) and described.get("model"):
            return str(described["model"])
    return NO_MODEL if "worker" in header else study_model


def _task_id(header: Mapping[str, Any]) -> str:
    """Task, profile and the digest of the profile's examples: two logs with one task id scored
    exactly the same examples."""
    digest = (header.get("manifest") or {}).get("profile_sha256") or "unknown"
    return f"{header['task']}@{header['profile']}:{str(digest)[:12]}"


def _tokens(verdict: Verdict) -> tuple[int, int] | None:
    """The prompt and completion tokens the ledger recorded for a verdict's worker call."""
    usage = verdict.usage or {}
    if "prompt_tokens" not in usage and "completion_tokens" not in usage:
        return None  # a program task's verdict: no worker call of its own
    return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))


def _model_usage(model: str, tokens: Iterable[tuple[int, int] | None]) -> dict[str, Any]:
    counted = [t for t in tokens if t is not None]
    if not counted:
        return {}
    given, got = sum(t[0] for t in counted), sum(t[1] for t in counted)
    return {model: inspect_api().ModelUsage(input_tokens=given, output_tokens=got, total_tokens=given + got)}


def _revision(header: Mapping[str, Any]):
    """heldout's commit as Inspect records a task's revision (None when heldout was no checkout)."""
    code = (header.get("environment") or {}).get("heldout_code") or {}
    if not code.get("commit"):
        return None
    return inspect_api().EvalRevision(type="git", origin="heldout", commit=str(code["commit"]),
                                      dirty=code.get("dirty"))


def _log(session: _Session, kind: str, entries: list[dict[str, Any]], task, study_model: str) -> "EvalLog":
    api = inspect_api()
    header = session.header
    model = _worker_model(header, study_model)
    bench = get_benchmark(header["task"])
    examples = {} if task is None else {ex.id: ex for split in task.splits.values() for ex in split}
    context = RunContext(options=header.get("options") or {})
    occurrences: Counter = Counter()
    samples, verdicts = [], []
    for entry in entries:
        data = entry["data"]
        verdict = Verdict.from_dict(data["verdict"])
        verdicts.append(verdict)
        cid = data["candidate_id"]
        sample_id = verdict.example_id if kind == "heldout" else f"{verdict.example_id}@{cid[:12]}"
        occurrences[sample_id] += 1
        samples.append(_sample(sample_id, occurrences[sample_id], verdict, session.components.get(cid, {}),
                               examples.get(verdict.example_id), bench, context, model,
                               {"candidate_id": cid, "ledger_seq": entry["seq"], "split": data.get("split", "test"),
                                "metric_calls": data.get("metric_calls"), "cached": data.get("cached")}))
    started = _iso(session.entries[0]["time"])
    completed = _iso(session.entries[-1]["time"])
    first = session.entries[0]["hash"]
    spec = api.EvalSpec(
        eval_id=f"{first[:16]}-{kind}", run_id=first[:22], task_id=_task_id(header),
        revision=_revision(header), packages={"heldout": str((header.get("environment") or {}).get("heldout_version"))},
        created=started, task=f"heldout/{header['task']}", task_version=str(header.get("manifest_version", 0)),
        task_args={"profile": header["profile"], "seed": header["seed"], "verifier": header.get("verifier"),
                   "options": header.get("options") or {},
                   "decoding": (header.get("decoding") or {}).get("stated")},
        solver=header.get("method"), model=model, config=api.EvalConfig(),
        dataset=api.EvalDataset(name=f"{header['task']} [{header['profile']}] {'test' if kind == 'heldout' else 'train/val'}",
                            samples=len(samples), sample_ids=[s.id for s in samples]),
        metadata={"heldout": kind, "session_dir": str(session.path), "session": header,
                  "final_candidate_id": session.final_id, "ledger_head": session.entries[-1]["hash"]})
    metrics = {}
    if verdicts:  # a failed session has no held-out scoring: no metric rather than a NaN
        metrics["mean"] = api.EvalMetric(name="mean", value=_mean([v.score for v in verdicts]))
        metrics["task_metric"] = api.EvalMetric(name="task_metric", value=float(bench.aggregate(verdicts)))
    for dim in sorted({d for v in verdicts for d in v.dimensions}):
        metrics[dim] = api.EvalMetric(name=dim, value=_mean([v.dimensions[dim] for v in verdicts if dim in v.dimensions]))
    results = api.EvalResults(total_samples=len(samples), completed_samples=len(samples),
                          scores=[api.EvalScore(name=SCORER, scorer=SCORER, scored_samples=len(samples), metrics=metrics)])
    failed = session.status == "failed"
    stats = api.EvalStats(started_at=started, completed_at=completed,
                          model_usage=_model_usage(model, (_tokens(v) for v in verdicts)))
    return api.EvalLog(status="error" if failed else "success" if session.status else "started", eval=spec,
                   results=results, stats=stats, samples=samples,
                   error=api.EvalError(message=session.error or "session failed", traceback="", traceback_ansi="")
                   if failed else None)


def _sample(sample_id: str, epoch: int, verdict: Verdict, components: Mapping[str, str], example, bench,
            context: RunContext, model: str, where: dict[str, Any]) -> "EvalSample":
    api = inspect_api()
    output = verdict.output if isinstance(verdict.output, dict) else {"value": verdict.output}
    if bench.kind == "prompt":
        if example is not None and components:
            rendered = bench.render(dict(components), example, context)
            prompt = [api.ChatMessageSystem(content=m.content) if m.role == "system" else api.ChatMessageUser(content=m.content)
                      for m in rendered]
        else:
            prompt = [api.ChatMessageUser(content=f"(prompt not rendered: example {verdict.example_id} did not load "
                                              "here; pass --data-dir)")]
        text = str(output.get("text", "")) if verdict.valid else ""
    else:
        prompt = [api.ChatMessageUser(content="\n\n".join(f"## {name}\n{body}" for name, body in sorted(components.items()))
                                  or "(candidate not in the ledger)")]
        text = json.dumps(output, default=str, indent=1)
    answer = output.get("answer") if bench.kind == "prompt" else output.get("value", output.get("objective"))
    target = "" if example is None or example.target is None else (
        example.target if isinstance(example.target, str) else json.dumps(example.target, default=str))
    messages = [*prompt, api.ChatMessageAssistant(content=text or (verdict.error or ""), model=model)]
    score = api.Score(value=verdict.score, answer=None if answer is None else str(answer), explanation=verdict.feedback,
                  metadata={"dimensions": dict(verdict.dimensions), "valid": verdict.valid,
                            "error_kind": verdict.error_kind})
    usage = _model_usage(model, [_tokens(verdict)])
    answered = api.ModelOutput.from_content(model, text, error=verdict.error)
    answered.usage = usage.get(model)
    return api.EvalSample(id=sample_id, epoch=epoch, input=prompt, target=target, messages=messages,
                      output=answered, model_usage=usage, scores={SCORER: score}, error=None,
                      metadata={**where, "example_id": verdict.example_id, "dimensions": dict(verdict.dimensions),
                                "valid": verdict.valid, "error": verdict.error, "usage": dict(verdict.usage)})


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(float(stamp), tz=timezone.utc).isoformat()


__all__ = ["ExportError", "ExportResult", "export_inspect"]
