"""Topic-disjoint split profiles that are built to hold, and checked to prove it.

* :func:`group_split` draws a profile from whole groups (topics): **test first**, then val, then
  train, so the held-out split gets the groups it needs before anything else. Each train group
  may give up to ``probe`` further items to a ``shared_topic_probe`` pool: fresh questions from
  families the optimizer trained on, never shown to it (the leakage ablation scores them).
* :func:`build_split` freezes such a profile into a *user* manifest (same format and hashes as the
  shipped ones) under a manifest root on the search path, so ``heldout run --profile P`` loads it.
* :func:`check_split` proves, from the frozen id lists and the loaded examples, that no group
  spans two of train/val/test and no id sits in two pools, and runs a near-duplicate scan across
  pools (paraphrase leaks survive a topic-disjoint split).

Group keys of the shipped tasks (:data:`GROUP_KEYS`): HotpotQA = the sorted pair of gold
titles, MMLU-Pro = the row's ``src`` family. BBH and GSM-Hard have no natural topic; heldout says
so rather than inventing one.

The order of groups is a hash order salted with the profile name and seed (as every shipped
profile), so a split can be redrawn and compared by anyone; it is frozen as id lists and loading
never redraws it."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import sparse

from heldout.benchmarks.extraction import normalize_answer
from heldout.benchmarks.loading import Task, load_task, resolve_data_dir
from heldout.benchmarks.registry import get_benchmark
from heldout.contracts import DataError, Example, canonical_json
from heldout.files import check_name
from heldout.data_manifests import MANIFEST_DIR, MANIFEST_PATH_ENV, Manifest, file_sha256, freeze, manifest_roots
from heldout.data_manifests.profiles import PROBE_POOL, hash_order

PROBE = PROBE_POOL
HELD_SPLITS = ("train", "val", "test")
FILL_ORDER = ("test", "val", "train")

GROUP_KEYS: dict[str, str | None] = {
    "hotpotqa": "the sorted pair of gold (supporting-fact) article titles",
    "mmlu_pro": "the row's src: the original source subject the question came from",
    "bbh": None,
    "gsm_hard": None,
}
NO_GROUP_REASONS = {
    "bbh": "BBH tasks are one reasoning skill each, generated from templates: no topic key to split on",
    "gsm_hard": "GSM-Hard word problems carry no topic or source field: no topic key to split on",
}


def group_key_of(task: str) -> str | None:
    """What a task's ``Example.group`` means, or None when it has no natural topic."""
    return GROUP_KEYS.get(task.split("/", 1)[0])


# -- drawing -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitSizes:
    """Target example counts. Whole groups make them approximate: a split takes a group only when
    doing so brings it closer to its target, so it overshoots by less than half a group."""

    train: int
    val: int
    test: int

    @classmethod
    def parse(cls, text: str) -> "SplitSizes":
        try:
            train, val, test = (int(x) for x in text.split("/"))
        except ValueError:
            raise DataError(f"--sizes must look like TRAIN/VAL/TEST, e.g. 100/50/200, got {text!r}") from None
        if min(train, val, test) < 0:
            raise DataError(f"--sizes must not be negative, got {text!r}")
        return cls(train, val, test)

    def target(self, split: str) -> int:
        return getattr(self, split)


def groups_of(examples: Iterable[Example]) -> dict[str, list[str]]:
    """group key -> example ids in source order; an example without a group is its own group."""
    groups: dict[str, list[str]] = {}
    for ex in examples:
        groups.setdefault(ex.group if ex.group is not None else f"__id__{ex.id}", []).append(ex.id)
    return groups


def group_split(task: str, examples: Sequence[Example], sizes: SplitSizes, probe: int = 0,
                salt: str = "") -> dict[str, list[str]]:
    """Assign whole groups to test, then val, then train (see :class:`SplitSizes` for the fill
    rule); a train group of n items keeps ``n - min(probe, n - 1)`` in train and gives the rest
    (its first items in hash order) to ``shared_topic_probe``. Groups no split needs stay out."""
    if probe < 0:
        raise DataError(f"--probe must not be negative, got {probe}")
    groups = groups_of(examples)
    order = hash_order(task, groups, salt)
    free = list(order)
    out: dict[str, list[str]] = {s: [] for s in HELD_SPLITS}
    probe_ids: list[str] = []
    for split in FILL_ORDER:
        goal, filled, left = sizes.target(split), 0, []
        for key in free:
            ids = groups[key]
            gives = min(probe, len(ids) - 1) if split == "train" else 0
            kept = len(ids) - gives
            if abs(filled + kept - goal) < abs(filled - goal):
                if gives:
                    item_order = hash_order(task, ids, f"{salt}|probe")
                    probe_ids += [i for i in ids if i in set(item_order[:gives])]
                    ids = [i for i in ids if i not in set(item_order[:gives])]
                out[split] += ids
                filled += kept
            else:
                left.append(key)
        free = left
    if probe:
        out[PROBE] = probe_ids
    return out


# -- building (frozen into a user manifest) ------------------------------------------------------
def user_manifest_root(out: str | os.PathLike | None) -> Path:
    """``--out`` when given, else the first directory of ``$HELDOUT_MANIFEST_PATH``."""
    if out:
        return Path(out)
    first = next((p for p in os.environ.get(MANIFEST_PATH_ENV, "").split(os.pathsep) if p), None)
    if first is None:
        raise DataError(f"say where the user manifest goes: --out DIR or ${MANIFEST_PATH_ENV}")
    return Path(first)


def reference_manifest(task: str, user_root: Path) -> Manifest | None:
    """The task's manifest elsewhere on the search path than ``user_root`` (the shipped one, or a
    plugin's), whose hashes the new profile must agree with; None for a task without one."""
    for root in manifest_roots():
        if root.resolve() != user_root.resolve() and Manifest.path_for(task, root).exists():
            return Manifest.load(task, root)
    return None


@dataclass
class BuiltSplit:
    path: str
    task: str
    profile: str
    sizes: dict[str, int]
    groups: dict[str, int]
    note: str


def build_split(task: str, name: str, sizes: SplitSizes, *, probe: int = 0, seed: int = 0,
                out: str | os.PathLike | None = None, data_dir: str | None = None) -> BuiltSplit:
    """Draw a group split of ``task`` and freeze it as profile ``name`` in a user manifest.

    Refuses: a task without topic groups, a name that a shipped profile already has (it would
    shadow it), a data set that drifted from the shipped manifest, and rewriting an existing user
    profile with a different assignment (splits are data: a new draw gets a new name). Pools the
    shipped profiles reserve (MMLU-Pro's ``fewshot`` demonstrations) stay out of the draw and are
    carried over unchanged."""
    check_name(name, "profile name", error=DataError)
    root = user_manifest_root(out)
    if group_key_of(task) is None and task.split("/", 1)[0] in NO_GROUP_REASONS:
        raise DataError(f"{task}: no topic groups ({NO_GROUP_REASONS[task.split('/', 1)[0]]})")
    bench = get_benchmark(task)
    resolved = None if bench.source.embedded else resolve_data_dir(data_dir)
    examples = bench.load_raw(resolved)
    shipped = reference_manifest(task, root)
    reserved: dict[str, list[str]] = {}
    if shipped is not None:
        report = shipped.verify(examples, ids=list(shipped.hashes))
        if not report.clean:
            raise DataError("refusing to split data that drifted from the shipped manifest:\n" + report.describe())
        if name in shipped.profiles:
            raise DataError(f"{task} already ships a profile {name!r}; choose another --name")
        first = next(iter(shipped.profiles.values()), {})
        reserved = {pool: list(ids) for pool, ids in first.items() if pool not in (*HELD_SPLITS, PROBE)}
    if not any(ex.group is not None for ex in examples):
        raise DataError(f"{task}: no example carries a group; a group split needs topic keys")
    taken = {i for ids in reserved.values() for i in ids}
    pool = [ex for ex in examples if ex.id not in taken]
    profile = group_split(task, pool, sizes, probe, salt=f"{name}|{seed}")
    profile.update(reserved)
    note = (f"group split (groups = {group_key_of(task) or 'Example.group'}): whole groups, test first, "
            f"then val, then train; target sizes {sizes.train}/{sizes.val}/{sizes.test}; probe {probe} "
            f"per train group; hash order salted with {name}|{seed}")
    path = Manifest.path_for(task, root)
    if path.exists():
        manifest = Manifest.load(task, root)
        report = manifest.verify(examples, ids=list(manifest.hashes))
        if not report.clean:
            raise DataError(f"refusing to add a profile to {path}: its data drifted:\n" + report.describe())
        old = manifest.profiles.get(name)
        if old is not None and old != profile:
            raise DataError(f"{path} already holds a different profile {name!r}; splits are frozen: "
                            "choose another --name")
        manifest.profiles[name] = profile
        manifest.notes[name] = note
    else:
        shas = {p: file_sha256(Path(resolved) / p) for p in bench.source.mirror_files
                if resolved and (Path(resolved) / p).is_file()}
        manifest = freeze(task, bench.version, bench.source, examples, {name: profile}, {name: note}, shas)
    saved = manifest.save(root)
    by_id = {ex.id: ex for ex in examples}
    return BuiltSplit(path=str(saved), task=task, profile=name,
                      sizes={k: len(v) for k, v in profile.items()},
                      groups={k: len({by_id[i].group for i in v}) for k, v in profile.items()}, note=note)


# -- near-duplicates -----------------------------------------------------------------------------
QUESTION_SKIP_FIELDS = frozenset({"context"})
"""Input fields left out of question text: HotpotQA's retrieval paragraphs are shared across
questions by design (distractors), so they would make every pair look alike."""


def question_text(example: Example) -> str:
    """The question an example asks: its string (and list-of-string) input fields, in key order,
    minus :data:`QUESTION_SKIP_FIELDS`."""
    parts = []
    for key in sorted(example.input):
        value = example.input[key]
        if key in QUESTION_SKIP_FIELDS:
            continue
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            parts.extend(value)
    return "\n".join(parts) if parts else canonical_json(example.input)


def answer_text(example: Example) -> str:
    """The answer as words: ``target["answer"]`` for dict targets, the option text for a letter
    target of a multiple-choice input, else the target itself."""
    target = example.target
    if isinstance(target, dict):
        target = target.get("answer", canonical_json(target))
    options = example.input.get("options")
    if isinstance(target, str) and len(target) == 1 and target.isalpha() and isinstance(options, list):
        index = ord(target.upper()) - ord("A")
        if 0 <= index < len(options):
            return str(options[index])
    return target if isinstance(target, str) else canonical_json(target)


def words(text: str) -> list[str]:
    """Normalised words (SQuAD normalisation: case, ASCII punctuation and articles dropped)."""
    return normalize_answer(text).split()


def shingles(tokens: Sequence[str], n: int) -> set[str]:
    if not tokens:
        return set()
    if len(tokens) < n:
        return {" ".join(tokens)}
    return {" ".join(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass(frozen=True)
class NearDuplicate:
    field: str  # "question" | "answer"
    similarity: float  # exact Jaccard of the word n-gram sets
    a: str
    a_pool: str
    b: str
    b_pool: str
    a_text: str
    b_text: str


def near_duplicates(pools: Mapping[str, Sequence[Example]], *, threshold: float = 0.5, ngram: int = 2,
                    min_answer_words: int = 3) -> tuple[list[NearDuplicate], dict[str, int]]:
    """Pairs of examples in *different* pools whose question (or answer) word n-gram sets have a
    Jaccard similarity >= ``threshold``. Exact, not sampled: the intersections of every pair come
    from one sparse matrix product, so no pair above the threshold is missed. Answers shorter
    than ``min_answer_words`` words ("yes", a year) coincide by nature and are skipped (counted)."""
    if not 0.0 < threshold <= 1.0:
        raise DataError(f"near-duplicate threshold must be in (0, 1], got {threshold}")
    if ngram < 1:
        raise DataError(f"n-gram size must be >= 1, got {ngram}")
    rows = [(pool, ex) for pool, exs in pools.items() for ex in exs]
    pairs: list[NearDuplicate] = []
    skipped = {"answers_too_short": 0}
    for field_name, text_of in (("question", question_text), ("answer", answer_text)):
        texts = [text_of(ex) for _, ex in rows]
        tokens = [words(t) for t in texts]
        keep = [k for k, t in enumerate(tokens)
                if t and (field_name == "question" or len(t) >= min_answer_words)]
        if field_name == "answer":
            skipped["answers_too_short"] = len(rows) - len(keep)
        pairs += _similar_pairs(field_name, [rows[k] for k in keep], [texts[k] for k in keep],
                                [shingles(tokens[k], ngram) for k in keep], threshold)
    pairs.sort(key=lambda p: (-p.similarity, p.field, p.a, p.b))
    return pairs, skipped


def _similar_pairs(field_name: str, rows: list[tuple[str, Example]], texts: list[str],
                   sets: list[set[str]], threshold: float) -> list[NearDuplicate]:
    if len(rows) < 2:
        return []
    vocab: dict[str, int] = {}
    indptr, indices = [0], []
    for s in sets:
        indices += [vocab.setdefault(g, len(vocab)) for g in sorted(s)]
        indptr.append(len(indices))
    matrix = sparse.csr_matrix((np.ones(len(indices), dtype=np.int32), indices, indptr),
                               shape=(len(sets), len(vocab)))
    inter = sparse.triu(matrix @ matrix.T, k=1).tocoo()
    size = np.asarray(matrix.sum(axis=1)).ravel()
    jaccard = inter.data / (size[inter.row] + size[inter.col] - inter.data)
    pool_codes = {p: k for k, p in enumerate(dict.fromkeys(p for p, _ in rows))}
    pool_of = np.array([pool_codes[p] for p, _ in rows])
    hit = (jaccard >= threshold - 1e-12) & (pool_of[inter.row] != pool_of[inter.col])
    out = []
    for i, j, sim in zip(inter.row[hit], inter.col[hit], jaccard[hit]):
        (pa, ea), (pb, eb) = rows[i], rows[j]
        out.append(NearDuplicate(field_name, round(float(sim), 4), ea.id, pa, eb.id, pb,
                                 texts[i][:200], texts[j][:200]))
    return out


# -- checking ------------------------------------------------------------------------------------
@dataclass
class SplitCheck:
    """The proof (or refutation) that a profile is topic-disjoint, with the near-duplicate scan.

    ``ok`` is False when a group spans two of train/val/test, an id sits in two pools, a probe
    item's family is not a train family, or train or test is empty. Near-duplicates are listed,
    not failed on: the threshold is a judgement the reader makes from the pairs shown."""

    task: str
    profile: str
    group_key: str | None
    pools: dict[str, dict[str, int]]  # pool -> {"examples", "groups", "ungrouped"}
    group_overlaps: list[dict[str, Any]] = field(default_factory=list)
    id_overlaps: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    near_duplicates: list[NearDuplicate] = field(default_factory=list)
    scan: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def describe(self, limit: int = 20) -> str:
        grouped = any(c["groups"] for c in self.pools.values())
        verdict = ("NOT PROVEN" if not self.ok else
                   "topic-disjoint: PROVEN (zero group overlap across train/val/test)" if grouped else
                   "no topic groups: nothing to prove beyond disjoint ids (see note)")
        lines = [f"{self.task} profile {self.profile!r}: {verdict}"]
        lines.append(f"  group key: {self.group_key or 'none'}")
        lines.append(f"  {'pool':<20} {'examples':>8} {'groups':>7} {'ungrouped':>9}")
        for pool, c in self.pools.items():
            lines.append(f"  {pool:<20} {c['examples']:>8} {c['groups']:>7} {c['ungrouped']:>9}")
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        scan = self.scan
        lines.append(f"  near-duplicates across pools (word {scan['ngram']}-gram Jaccard >= {scan['threshold']}, "
                     f"exact): {len(self.near_duplicates)} pair(s)"
                     + (f"; {scan['answers_too_short']} answers under {scan['min_answer_words']} words skipped"
                        if scan.get("answers_too_short") else ""))
        for p in self.near_duplicates[:limit]:
            lines.append(f"    {p.similarity:.2f} {p.field:<8} {p.a_pool}:{p.a} ~ {p.b_pool}:{p.b}  "
                         f"{p.a_text[:60]!r} ~ {p.b_text[:60]!r}")
        if len(self.near_duplicates) > limit:
            lines.append(f"    ... and {len(self.near_duplicates) - limit} more (--json lists all)")
        return "\n".join(lines)


def check_profile(task: Task, *, threshold: float = 0.5, ngram: int = 2,
                  min_answer_words: int = 3) -> SplitCheck:
    """Prove or refute topic-disjointness of a loaded task's profile (see :class:`SplitCheck`)."""
    family = task.name.split("/", 1)[0]
    pools = {name: list(exs) for name, exs in task.splits.items()}
    check = SplitCheck(task=task.name, profile=task.profile, group_key=group_key_of(task.name), pools={})
    for name, exs in pools.items():
        check.pools[name] = {"examples": len(exs), "groups": len({e.group for e in exs if e.group is not None}),
                             "ungrouped": sum(e.group is None for e in exs)}
    if not any(ex.group is not None for exs in pools.values() for ex in exs):
        check.notes.append(NO_GROUP_REASONS.get(family, f"{task.name} examples carry no group")
                           + "; group disjointness holds trivially and proves nothing about topics")
    # ids: each in one pool only (a frozen profile naming one id twice is a different leak)
    seen: dict[str, str] = {}
    for name, exs in pools.items():
        for ex in exs:
            if ex.id in seen:
                check.id_overlaps.append({"id": ex.id, "pools": [seen[ex.id], name]})
            else:
                seen[ex.id] = name
    if check.id_overlaps:
        check.problems.append(f"{len(check.id_overlaps)} example id(s) sit in two pools")
    groups = {name: {ex.group for ex in pools.get(name, []) if ex.group is not None} for name in pools}
    held = [s for s in HELD_SPLITS if s in pools]
    for i, a in enumerate(held):
        for b in held[i + 1:]:
            for g in sorted(groups[a] & groups[b]):
                check.group_overlaps.append({"group": g, "splits": [a, b]})
    if check.group_overlaps:
        shown = ", ".join(f"{o['group']!r} ({'+'.join(o['splits'])})" for o in check.group_overlaps[:5])
        check.problems.append(f"{len(check.group_overlaps)} group(s) span two splits: {shown}")
    if PROBE in pools:
        stray = sorted(groups[PROBE] - groups.get("train", set()))
        if stray:
            check.problems.append(f"{len(stray)} {PROBE} famil(ies) are not train families: {stray[:5]}")
        else:
            check.notes.append(f"{PROBE}: {len(pools[PROBE])} fresh items from {len(groups[PROBE])} train "
                               "families (shared with train by design, disjoint from val/test)")
    for split in ("train", "test"):
        if not pools.get(split):
            check.problems.append(f"the {split} split is empty")
    if "val" in pools and not pools["val"]:
        check.notes.append("the val split is empty")
    for extra in (p for p in pools if p not in (*HELD_SPLITS, PROBE)):
        shared = {s: len(groups[extra] & groups[s]) for s in held if groups[extra] & groups[s]}
        if shared:
            check.notes.append(f"pool {extra!r} shares families with {shared} (a demonstration pool, "
                               "not scored)")
    check.near_duplicates, skipped = near_duplicates(pools, threshold=threshold, ngram=ngram,
                                                     min_answer_words=min_answer_words)
    check.scan = {"threshold": threshold, "ngram": ngram, "min_answer_words": min_answer_words,
                  "method": "exact Jaccard of normalised word n-gram sets (scipy sparse product)", **skipped}
    return check


def check_split(task: str, profile: str, *, data_dir: str | None = None, threshold: float = 0.5, ngram: int = 2, min_answer_words: int = 3) -> SplitCheck:
    """Load ``task`` with ``profile`` (hashes verified) and :func:`check_profile` it."""
    loaded = load_task(task, profile, data_dir)
    return check_profile(loaded, threshold=threshold, ngram=ngram, min_answer_words=min_answer_words)


__all__ = ["PROBE", "GROUP_KEYS", "NO_GROUP_REASONS", "SplitSizes", "BuiltSplit", "NearDuplicate", "SplitCheck",
           "group_key_of", "groups_of", "group_split", "build_split", "near_duplicates", "check_profile",
           "check_split", "question_text", "answer_text", "words", "MANIFEST_DIR"]
