"""``load_task``: benchmark definition + frozen manifest + verified data = a :class:`Task`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from heldout.contracts import DataError, Example
from heldout.benchmarks.base import Benchmark
from heldout.benchmarks.registry import get_benchmark
from heldout.data_manifests import DriftError, DriftReport, Manifest, manifest_holding

DATA_DIR_ENV = "HELDOUT_DATA_DIR"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> str | None:
    """The mirror directory to read from: the argument, else ``$HELDOUT_DATA_DIR``, else None
    (load from the hub at the pinned revision)."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    if chosen is None:
        return None
    path = Path(chosen)
    if not path.is_dir():
        raise DataError(f"data dir {str(path)!r} does not exist (from "
                        f"{'--data-dir' if data_dir is not None else '$' + DATA_DIR_ENV})")
    return str(path.resolve())


@dataclass
class Task:
    """A benchmark bound to one split profile, with every example of the profile verified
    against the manifest. ``drift`` is non-empty only when drift was explicitly allowed.
    ``held_back`` names splits whose examples this copy does not hold (:meth:`without`), with
    their sizes: a session's task holds no test example while its optimizer runs."""

    benchmark: Benchmark
    profile: str
    splits: dict[str, list[Example]]
    manifest: Manifest
    data_dir: str | None = None
    drift: DriftReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    held_back: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.benchmark.name

    @property
    def kind(self) -> str:
        return self.benchmark.kind

    def without(self, *names: str) -> "Task":
        """This task without the examples of the splits ``names`` (their sizes kept): nothing
        reachable from the copy holds them."""
        held = {name: len(self.splits[name]) for name in names if name in self.splits}
        return replace(self, splits={k: v for k, v in self.splits.items() if k not in held},
                       held_back={**self.held_back, **held})

    def restored(self, source: "Task | tuple[str, str, str | None, bool]") -> "Task":
        """This task with the splits :meth:`without` held back: ``source`` itself when it is a
        loaded task, else reloaded (and verified against the manifest) from ``source``'s
        ``(name, profile, data_dir, allow_drift)``. :class:`DataError` when it no longer loads with
        the sizes this copy kept."""
        if not self.held_back:
            return self
        full = source if isinstance(source, Task) else load_task(*source)
        if full.sizes() != self.sizes():
            raise DataError(f"{full.name} loads with split sizes {full.sizes()}, not {self.sizes()} as before")
        return full

    def split(self, name: str) -> list[Example]:
        if name in self.held_back:
            raise DataError(f"the {name} split of {self.name!r} is held back until the session scores its final "
                            "candidate")
        try:
            return self.splits[name]
        except KeyError:
            raise DataError(f"task {self.name!r} profile {self.profile!r} has no split {name!r}; "
                            f"it has: {', '.join(self.splits)}") from None

    @property
    def examples(self) -> list[Example]:
        seen: dict[str, Example] = {}
        for exs in self.splits.values():
            for ex in exs:
                seen.setdefault(ex.id, ex)
        return list(seen.values())

    def sizes(self) -> dict[str, int]:
        return {**{k: len(v) for k, v in self.splits.items()}, **self.held_back}

    def describe(self) -> dict[str, Any]:
        return {**self.benchmark.describe(), "profile": self.profile, "sizes": self.sizes(),
                "manifest_version": self.manifest.version,
                "drift": None if self.drift is None else self.drift.to_dict()}


def load_task(name: str, profile: str = "default", data_dir: str | os.PathLike | None = None,
              allow_drift: bool = False) -> Task:
    """Load task ``name`` with split profile ``profile``.

    Every example the profile names is checked against its frozen hash; a mismatch raises
    :class:`DriftError` naming the task, the ids and the changed fields, unless ``allow_drift``
    is set, in which case the task loads with ``task.drift`` describing what changed."""
    benchmark = get_benchmark(name)
    resolved = resolve_data_dir(data_dir) if not benchmark.source.embedded else None
    manifest = manifest_holding(name, profile)
    splits_ids = manifest.profile(profile)
    examples = benchmark.load_raw(resolved)
    report = manifest.verify(examples, manifest.profile_ids(profile))
    drift = None
    if not report.clean:
        if not allow_drift:
            raise DriftError(report)
        drift = report
    by_id = {ex.id: ex for ex in examples}
    splits = {split: [by_id[i] for i in ids if i in by_id] for split, ids in splits_ids.items()}
    return Task(benchmark=benchmark, profile=profile, splits=splits, manifest=manifest,
                data_dir=resolved, drift=drift)
