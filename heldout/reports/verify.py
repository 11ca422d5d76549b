"""``heldout verify STUDY``: every number a study states, re-derived from its ledgers.

A study states numbers in two places: each run record (``run_record.json``) and each report's
``results.json``. :func:`verify_study` re-derives both and names every number that differs (the
file, the field, the stated value and the re-derived one). It reads only, and needs no secret: a
copy or bundle of the study on another machine verifies the same way. Who signed each run is
judged by :func:`heldout.evaluators.authenticity.verify_run` against the trusted signers given.

Rules:

* **run record <- its ledger** (:func:`rederive_record`): ``status`` and ``usage.metric_calls``
  from ``session_end``; ``final_candidate_id`` from the last ``final_candidate``; every held-out
  and val verdict's score from the ``test_scoring``/``val_scoring`` entries of that candidate
  (canonical verifier); ``test_score``/``val_score`` as the task's own aggregate of those
  verdicts; ``extra.test_metrics`` and ``extra.val_score_own_verifier`` from their entries. The
  ledger's own ``session_end.test_score`` must agree too. The entries are re-derived as read,
  even from a ledger whose chain is broken, so an edited entry's number is named, not only its
  broken hash.
* **examples <- manifest**: when the task's manifest here has the digest the run recorded, the
  examples scored are exactly its profile's test (and val) examples; a manifest here that differs
  is a note (the run used another manifest version), never a silent pass.
* **results.json <- run records**: the report is rebuilt by the code ``heldout report`` runs,
  with the settings and run dirs it records (``derived_from``, run dirs relative to the report,
  all inside the study), and compared value by value: settings, excluded and failed runs, every
  table's cells and the numbers behind them (prose, :data:`PROSE`, is wording, not compared);
  paths in the rebuild are written as the report was given them, so a copy at another path
  re-derives.

Verdict (:attr:`StudyVerification.verdict`), the first rule that holds, and its exit code:

====  ==========  =========================================================================
1     DIFFERS     a number differs from what its ledgers re-derive (named)
5     TAMPERED    every number re-derives, but a ledger, head, record or signature does not
                  verify (e.g. an edited text, a broken chain); a report that counts such a run
                  DIFFERS, since its rebuild leaves the run out as ``heldout report`` does
4     UNTRUSTED   a run is signed by a key that is not among the trusted signers
3     UNSIGNED    a run's authenticity could not be checked (no signature, no anchor here)
0     VERIFIED    every number re-derives and every run is authentic
2     (error)     unusable input: no run under the dir, a results.json that is not a report,
                  a task this heldout cannot aggregate
====  ==========  =========================================================================
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from heldout.benchmarks.registry import get_benchmark
from heldout.benchmarks.verifiers import CANONICAL
from heldout.contracts import HeldoutError, Verdict, is_infrastructure_failure, json_safe
from heldout.files import read_user_json
from heldout.data_manifests import Manifest, manifest_holding
from heldout.evaluators.authenticity import RunAuthenticity, verify_run
from heldout.evaluators.ledger import LEDGER_FILE, MAX_RECORD_BYTES, LedgerError, read_entries
from heldout.evaluators.records import RECORD_FILE, RunRecord, heldout_code, heldout_version, manifest_digest
from heldout.evaluators.signing import Authenticity, TrustedSigners
from heldout.reports.collect import find_run_dirs, protocol_folder
from heldout.reports.render import DERIVED_FROM, build_report, results

RESULTS_FILE = "results.json"
BUNDLE_INDEX = "bundle.json"
EXIT_CODES = {"DIFFERS": 1, "TAMPERED": 5, "UNTRUSTED": 4, "UNSIGNED": 3, "VERIFIED": 0}
_BY_AUTHENTICITY = {Authenticity.TAMPERED: "TAMPERED", Authenticity.UNTRUSTED: "UNTRUSTED",
                    Authenticity.UNSIGNED: "UNSIGNED", Authenticity.AUTHENTIC: "VERIFIED"}
MAX_LISTED = 20  # differences listed per file; the count says how many more


class VerifyInputError(HeldoutError):
    """The input cannot be verified at all (exit 2)."""


@dataclass(frozen=True)
class Difference:
    """One number a file states that its ledgers do not re-derive."""

    where: Path
    field: str
    stated: Any
    derived: Any

    def line(self) -> str:
        return f"{self.where}: {self.field}: states {_show(self.stated)}, re-derived {_show(self.derived)}"


def _show(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass
class RunVerification:
    """One run dir: its authenticity, the numbers that differ and the notes (never failures)."""

    run_dir: Path
    authenticity: RunAuthenticity
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ReportVerification:
    path: Path
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class StudyVerification:
    root: Path
    runs: list[RunVerification] = field(default_factory=list)
    reports: list[ReportVerification] = field(default_factory=list)

    @property
    def differences(self) -> list[Difference]:
        return [d for r in [*self.runs, *self.reports] for d in r.differences]

    @property
    def verdict(self) -> str:
        """The first rule of the module docstring's table that holds."""
        if self.differences:
            return "DIFFERS"
        worst = [_BY_AUTHENTICITY[r.authenticity.status] for r in self.runs]
        return next((v for v in ("TAMPERED", "UNTRUSTED", "UNSIGNED") if v in worst), "VERIFIED")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def lines(self) -> list[str]:
        """What ``heldout verify`` prints: a line per run and report, the differences under it, and
        the verdict with the rule it comes from."""
        out = []
        for run in self.runs:
            out.append(run.authenticity.line())
            out += _listed(run.differences) + [f"  note: {n}" for n in run.notes]
        for report in self.reports:
            state = "re-derived exactly" if not report.differences and not report.notes else \
                "DIFFERS" if report.differences else "see notes"
            out.append(f"{'report' if not report.differences else 'DIFFERS':<9} {report.path}: {state}")
            out += _listed(report.differences) + [f"  note: {n}" for n in report.notes]
        numbers = len(self.differences)
        out.append({
            "DIFFERS": f"DIFFERS: {numbers} value(s) differ from what the ledgers re-derive (listed above)",
            "TAMPERED": "TAMPERED: every number re-derives, but evidence does not verify (see INVALID above)",
            "UNTRUSTED": "UNTRUSTED: every number re-derives, but a run is signed by a key not among the trusted "
                         "signers (pass --trusted-signers FILE or --trust-key KEY if you trust it)",
            "UNSIGNED": "UNSIGNED: every number re-derives, but a run's authenticity could not be checked",
            "VERIFIED": f"VERIFIED: every number of {len(self.runs)} run(s) and {len(self.reports)} report(s) "
                        "re-derives from the ledgers, and every run is authentic",
        }[self.verdict])
        return out

    def as_dict(self) -> dict[str, Any]:
        def diffs(ds: Sequence[Difference]) -> list[dict[str, Any]]:
            return [{"field": d.field, "stated": d.stated, "derived": d.derived} for d in ds]
        return {"verdict": self.verdict, "exit_code": self.exit_code,
                "runs": [{"run_dir": str(r.run_dir), "authenticity": r.authenticity.status.value,
                          "reason": r.authenticity.check.reason, "signer": r.authenticity.check.signer,
                          "fingerprint": r.authenticity.check.fingerprint, "differences": diffs(r.differences),
                          "notes": r.notes} for r in self.runs],
                "reports": [{"path": str(r.path), "differences": diffs(r.differences), "notes": r.notes}
                            for r in self.reports]}


def _listed(differences: Sequence[Difference]) -> list[str]:
    lines = [f"  DIFFERS {d.line()}" for d in differences[:MAX_LISTED]]
    if len(differences) > MAX_LISTED:
        lines.append(f"  ... and {len(differences) - MAX_LISTED} more")
    return lines


# -- the study ----------------------------------------------------------------------------------------
def verify_study(root: str | Path, trusted: TrustedSigners, *, reports: Iterable[str | Path] = (),
                 data_dir: str | None = None) -> StudyVerification:
    """Re-derive every run record under ``root`` from its ledger and every report (the
    ``results.json`` files under ``root``, or ``reports``) from the run records."""
    root = Path(root)
    if not root.is_dir():
        raise VerifyInputError(f"{root} is not a directory (a study dir, or a copy of one)")
    found = StudyVerification(root)
    bundled = root / "manifests" if is_bundle(root) else None
    for run_dir in find_run_dirs([root]):
        if protocol_folder(run_dir) is not None:
            continue  # a protocol command's scoring, not a run: `heldout ledger verify` checks it
        found.runs.append(verify_run_dir(run_dir, trusted, bundled))
    if not found.runs:
        raise VerifyInputError(f"no run under {root} (looked for {RECORD_FILE} and {LEDGER_FILE})")
    given = [Path(p) for p in reports]
    for path in given or find_reports(root):
        found.reports.append(verify_report(path / RESULTS_FILE if path.is_dir() else path, root, data_dir))
    return found


def is_bundle(root: Path) -> bool:
    """An unpacked ``heldout bundle`` (heldout/reports/bundle.py): run dirs under ``runs/<name>``,
    manifests under ``manifests/``, the report under ``report/``."""
    return (root / BUNDLE_INDEX).is_file() and (root / "runs").is_dir()


def find_reports(root: Path) -> list[Path]:
    """Every ``results.json`` under ``root``: only ``heldout report`` writes that name, so each is a
    report, and one that does not read as a report is an error, never skipped (a forger could
    otherwise hide a report's numbers from the check by corrupting it)."""
    return sorted(root.rglob(RESULTS_FILE))


# -- run records --------------------------------------------------------------------------------------
def verify_run_dir(run_dir: Path, trusted: TrustedSigners, bundled: Path | None = None) -> RunVerification:
    checked = RunVerification(run_dir, verify_run(run_dir, trusted))
    # the entries as verified are the ones re-derived (one read); the run's verdict keeps none of
    # them, so a study's verification holds one ledger at a time, not every ledger it read
    entries, checked.authenticity.ledger.checked = checked.authenticity.ledger.checked, []
    if not (run_dir / RECORD_FILE).exists():
        checked.notes.append("no run record (an unfinished session): it states no number")
        return checked
    try:
        entries = entries or read_entries(run_dir / LEDGER_FILE)[0]  # none verified: say why it cannot be read
        record = RunRecord.load(run_dir)
    except (HeldoutError, LedgerError, TypeError) as exc:
        checked.notes.append(f"cannot re-derive: {exc}")  # the authenticity line says why (INVALID)
        return checked
    checked.differences += rederive_record(record, entries, run_dir / RECORD_FILE)
    checked.differences += _example_set(record, entries, run_dir / RECORD_FILE, checked.notes, bundled)
    return checked


def _final_id(entries: Sequence[Mapping[str, Any]]) -> str | None:
    return next((e["data"].get("candidate_id") for e in reversed(entries)
                 if e.get("kind") == "final_candidate" and isinstance(e.get("data"), dict)), None)


def _scored(entries: Sequence[Mapping[str, Any]], kind: str, final: str | None) -> dict[str, Verdict]:
    """Example id -> verdict of the final candidate's ``kind`` entries (canonical verifier; an
    infrastructure failure is no score, as the session kept none)."""
    out: dict[str, Verdict] = {}
    for entry in entries:
        data = entry.get("data")
        if entry.get("kind") != kind or not isinstance(data, dict) or data.get("candidate_id") != final:
            continue
        if kind != "val_scoring_own_verifier" and data.get("verifier", CANONICAL) != CANONICAL:
            continue
        verdict = Verdict.from_dict(data["verdict"])
        if not is_infrastructure_failure(verdict):
            out[str(data.get("example_id", verdict.example_id))] = verdict
    return out


def _in_order(scored: Mapping[str, Verdict], stated: Sequence[Mapping[str, Any]]) -> list[Verdict]:
    """The ledger's verdicts in the record's example order (the order the session aggregated in:
    a float mean depends on it in its last bit), then any the record lacks."""
    order = [str(v.get("example_id")) for v in stated if str(v.get("example_id")) in scored]
    placed = set(order)
    return [scored[i] for i in order] + [v for i, v in scored.items() if i not in placed]


def rederive_record(record: RunRecord, entries: Sequence[Mapping[str, Any]], where: Path) -> list[Difference]:
    """The numbers of ``record`` its ``entries`` do not re-derive (see the module docstring)."""
    try:
        aggregate = get_benchmark(record.task).aggregate
    except (HeldoutError, KeyError) as exc:
        raise VerifyInputError(f"{where}: cannot re-derive its scores: task {record.task!r} is not known to this "
                               f"heldout ({exc}); install the package that registers it") from None
    end = next((e["data"] for e in reversed(entries) if e.get("kind") == "session_end"
                and isinstance(e.get("data"), dict)), {})
    final = _final_id(entries)
    out: list[Difference] = []

    def compare(name: str, stated: Any, derived: Any) -> None:
        if not _same(stated, derived):
            out.append(Difference(where, name, stated, derived))

    compare("status", record.status, end.get("status"))
    compare("final_candidate_id", record.final_candidate_id, final)
    compare("usage.metric_calls", record.usage.get("metric_calls"), end.get("metric_calls"))
    for split, stated_verdicts in (("test", record.test_verdicts), ("val", record.val_verdicts)):
        scored = _scored(entries, f"{split}_scoring", final) if final is not None else {}
        stated = {str(v.get("example_id")): v.get("score") for v in stated_verdicts}
        for example in sorted(set(stated) | set(scored)):
            compare(f"{split}_verdicts[{example}].score", stated.get(example, "absent"),
                    scored[example].score if example in scored else "absent")
        verdicts = _in_order(scored, stated_verdicts)
        derived = aggregate(verdicts) if verdicts else None
        compare(f"{split}_score", getattr(record, f"{split}_score"), derived)
        if split == "test":
            compare("ledger session_end.test_score", end.get("test_score"), derived)
    metrics = next((e["data"].get("metrics") for e in reversed(entries) if e.get("kind") == "test_metrics"
                    and isinstance(e.get("data"), dict) and e["data"].get("candidate_id") == final), None)
    compare("extra.test_metrics", record.extra.get("test_metrics") or {}, metrics or {})
    own = _scored(entries, "val_scoring_own_verifier", final)
    if own or "val_score_own_verifier" in record.extra:
        compare("extra.val_score_own_verifier", record.extra.get("val_score_own_verifier"),
                aggregate(_in_order(own, record.val_verdicts)) if own else None)
    return out


def _manifest_sources(task: str, profile: str, bundled: Path | None) -> list[Callable[[], Any]]:
    """Where to find the manifest to check a run against: this heldout's, then the bundle's copy
    (safe to use: only one whose digest equals the one the run recorded is used)."""
    return [lambda: manifest_holding(task, profile)] + ([lambda: Manifest.load(task, bundled)] if bundled else [])


def _example_set(record: RunRecord, entries: Sequence[Mapping[str, Any]], where: Path,
                 notes: list[str], bundled: Path | None = None) -> list[Difference]:
    """The examples scored against the profile of the manifest the run recorded (see the rules)."""
    if record.status != "ok":
        return []
    if record.drift:
        notes.append("scored under a data-drift override: its examples are not checked against the manifest")
        return []
    recorded = (record.experiment.get("manifest") or {}).get("profile_sha256")
    seen, manifest = [], None
    for load in _manifest_sources(record.task, record.profile, bundled):
        try:
            candidate = load()
            digest = manifest_digest(candidate, record.profile)["profile_sha256"]
        except (HeldoutError, OSError, ValueError) as exc:
            seen.append(str(exc))
            continue
        if digest == recorded:
            manifest = candidate
            break
        seen.append(f"v{candidate.version}, profile {digest[:12]}")
    if manifest is None:
        notes.append(f"no manifest of {record.task} [{record.profile}] here has the profile digest the run recorded "
                     f"({str(recorded)[:12]}; here: {'; '.join(seen) or 'none'}): its examples are not checked")
        return []
    final = _final_id(entries)
    out = []
    for split in ("test", "val"):
        expected = set(manifest.profile(record.profile).get(split, []))
        scored = set(_scored(entries, f"{split}_scoring", final))
        if scored != expected:
            missing, extra = sorted(expected - scored), sorted(scored - expected)
            out.append(Difference(where, f"{split} examples scored", f"the manifest profile's {len(expected)}",
                                  f"{len(scored)} in the ledger (missing {missing[:3]}, not in the profile "
                                  f"{extra[:3]})"))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON numbers are (1 == 1.0; NaN equals NaN), and dicts/lists element-wise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# -- reports ------------------------------------------------------------------------------------------
def _bundled_run_dir(bundle: Path, name: str) -> Path:
    """Where a bundle keeps the run dir a report names: ``runs/<name>``, else the one folder of that
    name below ``runs/`` (a report made from a folder inside the bundled one)."""
    direct = bundle / "runs" / name
    if direct.is_dir():
        return direct
    found = [p for p in (bundle / "runs").rglob(name) if p.is_dir()] if name else []
    if len(found) != 1:
        raise VerifyInputError(f"the bundle {bundle} holds {len(found)} folder(s) named {name!r}, the run dir its report "
                               "was made from: cannot tell which it re-derives from")
    return found[0]


def _code(code: Mapping[str, Any]) -> str:
    commit = f"commit {str(code['commit'])[:12]}{' + changes' if code.get('dirty') else ''}, " if code.get("commit") else ""
    return f"heldout {code.get('version')} ({commit}files {str(code.get('files_sha256'))[:12]})"


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def verify_report(path: Path, study: Path, data_dir: str | None) -> ReportVerification:
    """Rebuild the report at ``path`` from the run dirs it records (which must be inside
    ``study``) and compare it value by value."""
    checked = ReportVerification(path)
    stated = read_user_json(path, "report results", max_bytes=MAX_RECORD_BYTES, error=VerifyInputError)
    if "tables" not in stated:
        raise VerifyInputError(f"{path} is not a heldout report's results (it has no tables)")
    derivation = stated.get(DERIVED_FROM)
    if not isinstance(derivation, dict) or not isinstance(derivation.get("run_dirs"), list):
        checked.notes.append(f"{path} does not record what it was derived from (a protocol's report, or one written "
                             "before reports recorded it): not re-derived; heldout report makes one that is")
        return checked
    try:
        given = [str(d["given"]) for d in derivation["run_dirs"]]
        here = [_bundled_run_dir(study, str(d.get("name", Path(d["given"]).name))) if is_bundle(study)
                else Path(os.path.normpath(path.parent / str(d["from_report"]))) for d in derivation["run_dirs"]]
        settings = {"baseline": str(derivation["baseline"]), "alpha": float(derivation["alpha"]),
                    "checkpoints": derivation.get("checkpoints"), "n_boot": int(derivation["n_boot"])}
    except (KeyError, TypeError, ValueError) as exc:
        raise VerifyInputError(f"{path}: its {DERIVED_FROM} block is malformed ({exc!r})") from None
    outside = [str(p) for p in here if not _inside(p, study)]
    if outside:  # a hostile report could send the rebuild anywhere (the whole file system)
        raise VerifyInputError(f"{path} names run dirs outside the study {study}: {', '.join(outside)}")
    missing = [str(p) for p in here if not p.is_dir()]
    if missing:
        raise VerifyInputError(f"{path} was derived from run dirs that are not here: {', '.join(missing)} (copy the "
                               "study with its report, keeping their relative places)")
    rebuilt = json.loads(json.dumps(json_safe(results(build_report([str(p) for p in here], data_dir=data_dir,
                                                                   **settings))), default=str))
    stated = _stated_values(stated)
    rebuilt = _as_given(_stated_values(rebuilt), [str(p) for p in here], given)
    for name, a, b in _tree_differences(stated, rebuilt):
        checked.differences.append(Difference(path, name, a, b))
    made_by, this = derivation.get("heldout"), {"version": heldout_version(), **heldout_code()}
    if checked.differences and isinstance(made_by, dict) and made_by.get("files_sha256") != this["files_sha256"]:
        checked.notes.append(f"made by {_code(made_by)}; this is {_code(this)}: a difference may be the code's, not "
                             "the study's (re-derive with the heldout that made it)")
    if checked.differences and derivation.get("data_dir") and data_dir is None and not os.environ.get("HELDOUT_DATA_DIR"):
        checked.notes.append("the report was made with a local data dir and none is given here (--data-dir): the "
                             "tables that need the examples (answer keys, topics) cannot re-derive without it")
    return checked


#: wording, not values: it changes with heldout's phrasing between versions, and what it says about
#: the runs is in the values compared (``excluded`` and ``failed`` list what the warnings announce)
PROSE = frozenset({DERIVED_FROM, "warnings", "notes", "provenance", "figures"})
TABLE_PROSE = frozenset({"title", "notes", "figure"})


def _stated_values(results_data: Mapping[str, Any]) -> dict[str, Any]:
    """A report's results without its prose: settings, excluded and failed runs, and each table's
    columns, displayed cells (``rows``) and the numbers behind them (``data``)."""
    out = {k: v for k, v in results_data.items() if k not in PROSE}
    if isinstance(out.get("tables"), dict):
        out["tables"] = {key: {k: v for k, v in table.items() if k not in TABLE_PROSE} if isinstance(table, dict)
                         else table for key, table in out["tables"].items()}
    return out


def _as_given(value: Any, here: Sequence[str], given: Sequence[str]) -> Any:
    """``value`` (the rebuilt results) with each run dir path as it is here (a prefix ending at
    ``/``, ``:``, a space or the end of a string) written as the report was given it (``study``,
    or nothing before ``/`` for ``.``), so a copy at another path compares equal."""
    if not here:
        return value
    as_given = dict(zip(here, given))
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(re.escape(h) for h in sorted(here, key=len, reverse=True))
                         + r")(/|(?=:|\s|$))")

    def write(match: re.Match) -> str:
        original = as_given[match.group(1)]
        if not match.group(2):
            return original
        return "" if original == "." else original + "/"

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return pattern.sub(write, v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v
    return walk(value)


def _tree_differences(a: Any, b: Any, at: str = "") -> Iterable[tuple[str, Any, Any]]:
    """``(json path, stated, re-derived)`` of every leaf where ``a`` and ``b`` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            yield from _tree_differences(a.get(key, "absent"), b.get(key, "absent"), f"{at}.{key}" if at else key)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _tree_differences(x, y, f"{at}[{i}]")
    elif not _same(a, b):
        yield at, a, b


__all__ = ["Difference", "EXIT_CODES", "StudyVerification", "VerifyInputError", "rederive_record",
           "verify_study"]
