"""Run records: the outcome of one session, derived from (and anchored to) its ledger."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heldout.contracts import Candidate, HeldoutError, Verdict, candidate_id

RECORD_FILE = "run_record.json"


@dataclass
class RunRecord:
    """Final candidate, its held-out verdicts (scored once by the harness after the optimizer
    returned), val verdicts, usage by channel, best-so-far trajectory by metric calls, lineage."""

    task: str
    profile: str
    seed: int
    method: str
    status: str  # "ok" | "failed"
    budget: dict[str, Any]
    policy: dict[str, Any]
    limits: dict[str, Any]
    options: dict[str, Any]
    drift: dict[str, Any] | None
    final_candidate: Candidate | None
    final_candidate_id: str | None
    test_verdicts: list[dict[str, Any]]
    val_verdicts: list[dict[str, Any]]
    test_score: float | None
    val_score: float | None
    usage: dict[str, Any]
    trajectory: list[dict[str, Any]]
    lineage: list[dict[str, Any]]
    error: str | None = None
    ledger_head: str = ""
    ledger_entries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, session, final: Candidate | None, status: str, error: str | None,
              test_verdicts: list[Verdict], val_verdicts: list[Verdict]) -> "RunRecord":
        service = session.service
        usage = service.usage
        header = session.header()

        aggregate = session.task.benchmark.aggregate

        def metric(vs: list[Verdict]) -> float | None:  # the task's stated metric (None: no examples)
            return aggregate(vs) if vs else None

        lineage = [{"candidate_id": cid, "parent": info["parent"],
                    "first_metric_call": info["first_metric_call"],
                    "means": {s: t[0] / t[1] for s, t in info["sums"].items() if t[1]}}
                   for cid, info in service.candidates.items()]
        return cls(
            task=header["task"], profile=header["profile"], seed=session.seed, method=session.method,
            status=status, budget=header["budget"], policy=header["policy"], limits=header["limits"],
            options=header["options"], drift=header["drift"], final_candidate=final,
            final_candidate_id=candidate_id(final) if final else None,
            test_verdicts=[v.to_dict() for v in test_verdicts],
            val_verdicts=[v.to_dict() for v in val_verdicts],
            test_score=metric(test_verdicts), val_score=metric(val_verdicts),
            usage={"metric_calls": usage.metric_calls, "metric_call_budget": session.budget.metric_calls,
                   "endpoint_calls": dict(usage.endpoint_calls), "cache_hits": usage.cache_hits,
                   "replayed": usage.replayed, "tokens": {k: dict(v) for k, v in usage.tokens.items()}},
            trajectory=list(service.trajectory), lineage=lineage, error=error)

    def save(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / RECORD_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only, like the ledger
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(asdict(self), indent=1, default=str))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunRecord":
        path = Path(run_dir) / RECORD_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise HeldoutError(f"cannot read run record {path}: {exc}") from exc
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def verdict_scores(self, split: str = "test") -> dict[str, float]:
        verdicts = self.test_verdicts if split == "test" else self.val_verdicts
        return {v["example_id"]: float(v["score"]) for v in verdicts}
