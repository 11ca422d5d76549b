"""A generalisation protocol file: a TOML file whose keys are the flags of ``heldout protocol
generalisation`` (:data:`FILE_KEYS`), read into the spec, the folder and the session settings
(:func:`load_generalisation_file`). Unknown keys and wrong types are refused in one line naming
the key, and a file never grants its own optimizer trust."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heldout.files import read_user_toml
from heldout.protocols.generalisation import GeneralisationError, GeneralisationSpec
from heldout.protocols.study import parse_methods, refused_trust


@dataclass(frozen=True)
class GeneralisationFile:
    """A protocol study file: the spec, the folder and the session settings, as the flags of
    ``heldout protocol generalisation`` give them (:func:`load_generalisation_file`)."""

    spec: GeneralisationSpec
    run_dir: str
    settings: dict[str, Any]  # policy, worker_model, architect_model, base_url, cache_dir, data_dir, ...


FILE_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "protocol": ((str,), '"generalisation"'),
    "run_dir": ((str,), "the protocol's folder"),
    "task": ((str,), "one prompt task"),
    "profile": ((str,), 'split profile (default "topic-disjoint")'),
    "optimizer": ((str,), "a reference name or NAME=module:function"),
    "seeds": ((list,), "seeds (default [0, 1, 2])"),
    "budget": ((int,), "metric calls per session"),
    "variants": ((list,), "verifier variants to ablate (default none)"),
    "allow_topic_shared": ((bool,), "run on a profile not proven topic-disjoint"),
    "placebo_draws": ((int,), "neutral re-wordings of the seed scored per seed (default: as the test needs)"),
    "options": ((dict,), "task options (tolerance, max_tokens)"),
    "policy": ((str,), "visibility policy"),
    "models": ((dict,), "worker, architect, base_url, cache_dir"),
    "data_dir": ((str,), "dataset mirror"),
    "allow_drift": ((bool,), "run on data that drifted from the manifest"),
    "trusted_optimizer": ((bool,), "refused when true: only --trusted-optimizer (or HELDOUT_TRUSTED_OPTIMIZER=1) "
                                   "grants trust"),
}


MODEL_KEYS = {"worker": "worker_model", "architect": "architect_model", "base_url": "base_url", "cache_dir": "cache_dir"}


def load_generalisation_file(path: str | Path) -> GeneralisationFile:
    """Read a TOML protocol file whose keys are the command's flags (:data:`FILE_KEYS`; unknown
    keys and wrong types are refused in one line naming the key); the optimizer string is read
    as the ``--optimizer`` flag is (:func:`heldout.protocols.study.parse_methods`)."""
    origin = str(path)
    data = read_user_toml(path, "protocol file", max_bytes=1024 * 1024, error=GeneralisationError)
    for key, value in data.items():
        if key not in FILE_KEYS:
            raise GeneralisationError(f"{origin}: unknown key {key!r} (allowed: {', '.join(FILE_KEYS)})")
        types, what = FILE_KEYS[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise GeneralisationError(f"{origin}: {key} must be {what}, got {value!r}")
    if data.get("trusted_optimizer"):  # a shared file never decides that its own optimizer is trusted
        raise GeneralisationError(refused_trust(origin))
    if data.get("protocol", "generalisation") != "generalisation":
        raise GeneralisationError(f"{origin}: protocol must be \"generalisation\", got {data['protocol']!r}")
    for key in ("run_dir", "task", "optimizer", "budget"):
        if key not in data:
            raise GeneralisationError(f"{origin}: missing key {key!r} ({FILE_KEYS[key][1]})")
    seeds, variants = data.get("seeds", [0, 1, 2]), data.get("variants", [])
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise GeneralisationError(f"{origin}: seeds must be distinct non-negative integers, got {seeds!r}")
    if not all(isinstance(v, str) for v in variants):
        raise GeneralisationError(f"{origin}: variants must be strings, got {variants!r}")
    unknown = sorted(set(data.get("models", {})) - set(MODEL_KEYS))
    if unknown:
        raise GeneralisationError(f"{origin}: unknown key 'models.{unknown[0]}' (allowed: {', '.join(MODEL_KEYS)})")
    if data["budget"] < 1:
        raise GeneralisationError(f"{origin}: budget must be >= 1, got {data['budget']}")
    if not 0 <= data.get("placebo_draws", 0) <= 99:
        raise GeneralisationError(f"{origin}: placebo_draws must be 1..99, got {data['placebo_draws']}")
    (method,) = parse_methods([data["optimizer"]], [])
    spec = GeneralisationSpec(task=data["task"], profile=data.get("profile", "topic-disjoint"), optimizer=method,
                              seeds=tuple(seeds), budget=data["budget"], variants=tuple(variants),
                              allow_topic_shared=data.get("allow_topic_shared", False),
                              placebo_draws=data.get("placebo_draws", 0), options=dict(data.get("options", {})))
    settings = {MODEL_KEYS[k]: v for k, v in data.get("models", {}).items()}
    settings.update({k: data[k] for k in ("policy", "data_dir", "allow_drift") if k in data})
    return GeneralisationFile(spec=spec, run_dir=data["run_dir"], settings=settings)


__all__ = ["FILE_KEYS", "MODEL_KEYS", "GeneralisationFile", "load_generalisation_file"]
