"""heldout: benchmarks and evaluation protocols for optimizers of prompts and programs."""

from heldout.contracts import Candidate, DataError, Example, HeldoutError, MalformedCandidate, RunLimits, Verdict, candidate_id
from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.loading import Task, load_task
from heldout.benchmarks.registry import all_tasks, get_benchmark
from heldout.data_manifests import DriftError
from heldout.evaluators.records import RunRecord
from heldout.contracts import BudgetExceeded, VisibilityError
from heldout.evaluators.session import Budget, Session, TaskView, VisibilityPolicy

__version__ = "0.1.0"

__all__ = [
    "Benchmark", "Budget", "BudgetExceeded", "Candidate", "DataError", "DriftError", "Example",
    "HeldoutError", "MalformedCandidate", "RunLimits", "RunRecord", "Session", "Task", "TaskView",
    "Verdict", "VisibilityError", "VisibilityPolicy", "all_tasks", "candidate_id", "get_benchmark",
    "load_task",
]
