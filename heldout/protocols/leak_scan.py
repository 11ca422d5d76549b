"""Answer keys in candidates: which of a task's questions and answers a candidate's text holds.

**Matching** (:func:`scan_examples`), after normalisation (SQuAD rules: case, ASCII punctuation,
articles), for every example of every pool (train, val, test, probe):

* a **question** counts when a run of at least ``max(8, half its words)`` of its words (all of
  them if it is shorter) appears verbatim;
* an **answer** counts when it appears within ``window`` words of its own question's run, or
  anywhere when it has at least ``standalone_answer_words`` words (short answers such as "yes"
  or "1912" occur in any prose, so they count only in context);
* a **family-level key**: an answer specific to one family (no other family's item has it) also
  counts within ``window`` words of one of that family's **context words**, the words that tie
  a text to the family whatever they are: words of at least two of the family's items
  (questions and answers) whose share of the family's items is at least ``family_ratio`` times
  their add-one share of every other item (the answer's own words excepted). So "zorbin: nakor"
  encodes every item of the family answered "nakor" when "zorbin" (its keeper, named in two of
  its six questions and in no other family's) ties the line to it.

Training matches are the **answer key**: its share of the candidate's words, the training
examples it encodes and the families memorised. A match of val/test/probe data (a val question
excepted: the optimizer may see those) is **held-out overlap** unless every word of it lies inside
the training key's spans (then training text explains it: a test question identical to a training
one, a topic-shared family's answer).

**The red flag** (rule :data:`FLAG_RULE`): held-out overlap is flagged only beyond the task's own
chance overlap. Each held-out item matched gets a strength (its longest unexplained question run
as a share of its question, plus 1 when its answer matched); the statistic sums, over pieces of
evidence (a span of the text), minus the log of the chance rate of the rarest item matched there,
at its strength (its own rate, or the rate pooled over its stratum when higher: items of its
question's length whose answers are, or are not, words of the training text). Chance is measured
on ``null_texts`` texts of the candidate's length drawn from the order-2 word chain of the training
lines ("q question answer"): fresh text of the task's own kind, in its vocabulary and local word
order, holding no held-out data but what chance puts there. The flag fires when the candidate's
statistic is beyond all but an ``alpha`` share of the chance texts' own (each scored leaving
itself out), i.e. such a text is flagged at most ``alpha`` of the time. A small vocabulary (BBH
boolean expressions, where every text of the task's kind reproduces some test expressions)
does not raise it; a key to the held-out families' answers, or verbatim held-out items beyond
what chance reproduces, does. ``leak scan`` exits 1 on a flag."""

from __future__ import annotations

import bisect
import math
import random
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from heldout.benchmarks.loading import Task, load_task
from heldout.contracts import Example, HeldoutError, candidate_id, check_candidate
from heldout.evaluators.records import RunRecord
from heldout.protocols.splits import PROBE, answer_text, question_text, words

FLAG_RULE = "held-out-overlap-beyond-chance"
TRAIN = "train"


@dataclass(frozen=True)
class MatchedSpan:
    example_id: str
    pool: str
    field: str  # "question" | "answer" | "family_answer" | "family_context"
    group: str | None
    start: int  # word positions in the normalised candidate text
    end: int
    text: str


@dataclass(frozen=True)
class ScanRules:
    """Thresholds of the leak scan (see the module docstring)."""

    min_question_words: int = 8
    question_fraction: float = 0.5
    standalone_answer_words: int = 3
    window: int = 40
    family_ratio: float = 10.0
    """A family's context words: in two of its items at least, and their share of the family's
    items at least this many times their add-one share of all other items."""
    null_texts: int = 199
    alpha: float = 0.01
    seed: int = 0


@dataclass
class ChanceOverlap:
    """How the red flag was decided: the candidate's statistic against the same statistic on
    ``texts`` chance texts of ``words`` words (see the module docstring)."""

    rule: str
    statistic: float
    p: float
    alpha: float
    texts: int
    words: int
    null_mean: float
    null_high: float  # the null's (1 - alpha) quantile
    flagged: bool

    def describe(self) -> str:
        verdict = "<=" if self.flagged else ">"
        return (f"rule {self.rule}: p {self.p:.3g} {verdict} alpha {self.alpha:g} against {self.texts} chance texts "
                f"of {self.words} words drawn from the training text's own word chain (error rate: such a text "
                f"is flagged at most {self.alpha:.0%} of the time); statistic {self.statistic:.1f}, chance mean "
                f"{self.null_mean:.1f}, {1 - self.alpha:.0%} quantile {self.null_high:.1f}")


@dataclass
class LeakScan:
    """What of the task's data a candidate holds. ``share`` = words of the candidate covered by
    matched training questions/answers, over all its words. ``held_out`` = matches of data the
    optimizer never saw that training text does not explain; ``red_flags`` holds them only when
    :attr:`chance` decided they are beyond chance (``flagged_share`` their words' share)."""

    task: str
    profile: str
    candidate_id: str
    words: int
    key_words: int
    share: float
    flagged_share: float
    encoded: list[str]  # training example ids the candidate encodes
    memorised_families: list[str]
    spans: list[MatchedSpan] = field(default_factory=list)
    red_flags: list[MatchedSpan] = field(default_factory=list)
    held_out: list[MatchedSpan] = field(default_factory=list)
    held_out_families: list[str] = field(default_factory=list)  # families of held-out items keyed
    chance: ChanceOverlap | None = None

    @property
    def red_flag(self) -> bool:
        return bool(self.red_flags)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "red_flag": self.red_flag}

    def describe(self, limit: int = 12) -> str:
        lines = [f"{self.task} profile {self.profile!r} candidate {self.candidate_id[:12]}: "
                 f"answer-key share {self.share:.1%} ({self.key_words} of {self.words} words); "
                 f"{len(self.encoded)} training example(s) encoded from {len(self.memorised_families)} "
                 f"famil(ies)"]
        if self.memorised_families:
            lines.append("  families memorised: " + "; ".join(self.memorised_families[:limit])
                         + (" ..." if len(self.memorised_families) > limit else ""))
        for span in self.spans[:limit]:
            lines.append(f"  {span.pool}:{span.example_id} {span.field:<8} words {span.start}-{span.end}: "
                         f"{span.text[:80]!r}")
        if len(self.spans) > limit:
            lines.append(f"  ... and {len(self.spans) - limit} more spans (--json lists all)")
        if self.red_flags:
            lines.append(f"  RED FLAG: {len(self.red_flags)} match(es) of data the optimizer never saw "
                         f"({self.flagged_share:.1%} of the words), beyond chance ({self.chance.describe()})"
                         if self.chance else
                         f"  RED FLAG: {len(self.red_flags)} match(es) of data the optimizer never saw "
                         f"({self.flagged_share:.1%} of the words; no training text to measure chance on)")
            if self.held_out_families:
                lines.append("    held-out families keyed: " + "; ".join(self.held_out_families[:limit])
                             + (" ..." if len(self.held_out_families) > limit else ""))
            for span in self.red_flags[:limit]:
                lines.append(f"    {span.pool}:{span.example_id} {span.field}: {span.text[:80]!r}")
        elif self.held_out:
            lines.append(f"  no red flag: {len(self.held_out)} match(es) of held-out data are within the task's "
                         f"chance overlap ({self.chance.describe() if self.chance else 'no chance measured'})")
        return "\n".join(lines)


def candidate_text(candidate: Mapping[str, str]) -> str:
    return "\n".join(text for _, text in sorted(check_candidate(dict(candidate)).items()))


# -- the index of a task's examples ----------------------------------------------------------------
@dataclass(frozen=True)
class _Item:
    example: Example
    pool: str
    question: tuple[str, ...]
    answer: tuple[str, ...]
    need: int  # words of the question a run must have (0: the question is too short to match)
    family_specific: bool  # no item of another (or no) family has this answer


class ExampleIndex:
    """Every example of the pools, indexed for scanning texts in time linear in their length:
    question runs are found from seed n-grams, answers by their word tuples, family context words
    by a word -> families table. Built once per task (:func:`task_index`); the chance texts of
    each length are drawn and scanned once, then kept."""

    def __init__(self, pools: Mapping[str, Sequence[Example]], rules: ScanRules) -> None:
        self.rules = rules
        raw = [(pool, ex, tuple(words(question_text(ex))), tuple(words(answer_text(ex))))
               for pool, exs in pools.items() for ex in exs]
        answer_families: dict[tuple[str, ...], set[str | None]] = {}
        for _, ex, _, answer in raw:
            answer_families.setdefault(answer, set()).add(ex.group)
        self.items: list[_Item] = []
        for pool, ex, question, answer in raw:
            need = 0
            if len(question) >= 3:
                need = min(len(question), max(rules.min_question_words,
                                              math.ceil(rules.question_fraction * len(question))))
            specific = bool(answer) and ex.group is not None and answer_families[answer] == {ex.group}
            self.items.append(_Item(ex, pool, question, answer, need, specific))
        self.seeds: dict[int, dict[tuple[str, ...], list[tuple[int, int]]]] = {}
        for i, item in enumerate(self.items):
            if item.need:
                # any run of >= need words holds a seed m-gram at a multiple of the stride
                m = min(item.need, rules.min_question_words)
                table = self.seeds.setdefault(m, {})
                for off in range(0, len(item.question) - m + 1, item.need - m + 1):
                    table.setdefault(item.question[off:off + m], []).append((i, off))
        self.long_answers: dict[tuple[str, ...], list[int]] = {}  # by their first words
        self._lead = rules.standalone_answer_words
        for i, item in enumerate(self.items):
            if len(item.answer) >= self._lead:
                self.long_answers.setdefault(item.answer[:self._lead], []).append(i)
        self.context = _context_words(self.items, rules.family_ratio)
        self._by_family: dict[str | None, list[int]] = {}  # the items a family key can reach
        for i, item in enumerate(self.items):
            if item.family_specific:
                self._by_family.setdefault(item.example.group, []).append(i)
        self.train = [i for i, item in enumerate(self.items) if item.pool == TRAIN]
        self.train_lines = [("q",) + self.items[i].question + self.items[i].answer for i in self.train]  # the chance texts' source
        vocabulary = {w for line in self.train_lines for w in line}
        # chance texts speak the training text's words only: an answer outside them is reached by
        # chance far more rarely than one inside (a test family's secret, against "true")
        self.strata = [(_length_bucket(len(item.question)), all(w in vocabulary for w in item.answer))
                       for item in self.items]
        self._chance: dict[int, list[dict[int, tuple[float, tuple[int, int]]]]] = {}

    # -- matching ---------------------------------------------------------------------------------
    def match(self, tokens: Sequence[str]) -> dict[int, list[MatchedSpan]]:
        """Every example's matches in ``tokens``, by item index."""
        tokens = list(tokens)
        runs = self._question_runs(tokens)
        grams = _Grams(tokens)
        families_at: dict[str, list[int]] = {}
        for p, w in enumerate(tokens):
            for g in self.context.get(w, ()):
                families_at.setdefault(g, []).append(p)
        candidates = set(runs)
        for g in families_at:
            candidates.update(self._family_items(g))
        for p in range(len(tokens) - self._lead + 1):
            for i in self.long_answers.get(tuple(tokens[p:p + self._lead]), ()):
                answer = self.items[i].answer
                if tuple(tokens[p:p + len(answer)]) == answer:
                    candidates.add(i)
        found: dict[int, list[MatchedSpan]] = {}
        window = self.rules.window
        for i in candidates:
            item = self.items[i]
            ex = item.example
            spans = [MatchedSpan(ex.id, item.pool, "question", ex.group, a, b, " ".join(tokens[a:b]))
                     for a, b in sorted(runs.get(i, ()))]
            context = families_at.get(ex.group, []) if item.family_specific else []
            for p in grams.positions(item.answer) if item.answer else ():
                q = item.answer
                near = any(a - window <= p <= b + window for a, b in runs.get(i, ()))
                if near or len(q) >= self.rules.standalone_answer_words:
                    spans.append(MatchedSpan(ex.id, item.pool, "answer", ex.group, p, p + len(q), " ".join(q)))
                    continue
                ctx = [c for c in context if abs(c - p) <= window and tokens[c] not in q]
                if ctx:  # a family-level key: a word tying the text to the family, then its answer
                    spans.append(MatchedSpan(ex.id, item.pool, "family_answer", ex.group, p, p + len(q), " ".join(q)))
                    spans += [MatchedSpan(ex.id, item.pool, "family_context", ex.group, c, c + 1, tokens[c])
                              for c in ctx]
            if spans:
                found[i] = spans
        return found

    def _family_items(self, group: str) -> list[int]:
        return self._by_family.get(group, [])

    def _question_runs(self, tokens: list[str]) -> dict[int, set[tuple[int, int]]]:
        """Maximal runs of at least ``need`` consecutive question words, by item."""
        runs: dict[int, set[tuple[int, int]]] = {}
        for m, table in self.seeds.items():
            for p in range(len(tokens) - m + 1):
                for i, off in table.get(tuple(tokens[p:p + m]), ()):
                    q = self.items[i].question
                    back = 0
                    while off - back > 0 and p - back > 0 and q[off - back - 1] == tokens[p - back - 1]:
                        back += 1
                    length = m
                    while off + length < len(q) and p + length < len(tokens) and q[off + length] == tokens[p + length]:
                        length += 1
                    if back + length >= self.items[i].need:  # several seeds of one run: one maximal run
                        runs.setdefault(i, set()).add((p - back, p + length))
        return runs

    # -- held-out overlap and its chance level ------------------------------------------------------
    def split(self, found: Mapping[int, list[MatchedSpan]], explaining: set[int] | None = None
              ) -> tuple[set[int], dict[int, list[MatchedSpan]]]:
        """(training cover, unexplained held-out matches by item): the cover is the words of the
        ``explaining`` training items' matches (all training items by default); a held-out match
        inside it is explained by training text, and a short answer counts only near a question
        run training text does not explain (near an explained one, any "false" after a training
        question would be a held-out answer). A val question is never held-out overlap."""
        cover: set[int] = set()
        for i, spans in found.items():
            if self.items[i].pool == TRAIN and (explaining is None or i in explaining):
                for s in spans:
                    cover.update(range(s.start, s.end))

        def explained(s: MatchedSpan) -> bool:
            return all(p in cover for p in range(s.start, s.end))

        window = self.rules.window
        held: dict[int, list[MatchedSpan]] = {}
        for i, spans in found.items():
            item = self.items[i]
            if item.pool == TRAIN:
                continue
            free_runs = [s for s in spans if s.field == "question" and not explained(s)]
            kept = []
            for s in spans:
                if s.field == "answer" and len(item.answer) < self.rules.standalone_answer_words:
                    if any(r.start - window <= s.start <= r.end + window for r in free_runs):
                        kept.append(s)
                elif not explained(s) and not (item.pool == "val" and s.field == "question"):
                    kept.append(s)
            if any(s.field != "family_context" for s in kept):
                held[i] = kept
        return cover, held

    def strength(self, i: int, spans: Sequence[MatchedSpan]) -> tuple[float, tuple[int, int]]:
        """How much of item ``i`` a text holds: its longest question run's share of the question,
        plus 1 when its answer matched; and where: the run's span, else the answer's (items
        sharing that span, e.g. every item of a family answered by one key line, or every
        question answered "ii and iv only", are one piece of evidence)."""
        n = len(self.items[i].question) or 1
        runs = [s for s in spans if s.field == "question"]
        run = max(runs, key=lambda s: s.end - s.start, default=None)
        answer = next((s for s in spans if s.field in ("answer", "family_answer")), None)
        where = run or answer
        if where is None:  # held-out matches hold a question run or an answer; a raise, never -O's silence
            raise HeldoutError(f"leak scan: item {i} matched with neither a question run nor an answer (a bug)")
        share = min((run.end - run.start) / n, 1.0) if run is not None else 0.0
        return share + float(answer is not None), (where.start, where.end)

    def chance(self, n_words: int) -> list[dict[int, tuple[float, tuple[int, int]]]]:
        """Held-out strengths in ``null_texts`` chance texts of about ``n_words`` words (rounded
        up to a grid, so candidates of similar length share them): random walks of the order-2
        word chain of the training lines ("q question answer"), i.e. fresh text of the task's own
        kind, in its vocabulary and local word order, that holds no held-out data but what chance
        puts there. Nothing explains them (every match counts), so chance is not understated."""
        length = _bucket(n_words)
        if length not in self._chance:
            chain = _WordChain(self.train_lines)
            texts = []
            for j in range(self.rules.null_texts):
                tokens = chain.walk(length, random.Random(f"{self.rules.seed}|{length}|{j}"))
                _, held = self.split(self.match(tokens), explaining=set())
                texts.append({i: self.strength(i, spans) for i, spans in held.items()})
            self._chance[length] = texts
        return self._chance[length]


class _WordChain:
    """An order-2 Markov chain over the words of some lines (read as one cyclic text)."""

    def __init__(self, lines: Sequence[tuple[str, ...]]) -> None:
        self.text = [w for line in lines for w in line]
        self.next: dict[tuple[str, str], list[str]] = {}
        n = len(self.text)
        for k in range(n):
            self.next.setdefault((self.text[k], self.text[(k + 1) % n]), []).append(self.text[(k + 2) % n])

    def walk(self, length: int, rng: random.Random) -> list[str]:
        if not self.text:
            return []
        k = rng.randrange(len(self.text))
        out = [self.text[k], self.text[(k + 1) % len(self.text)]]
        while len(out) < length:
            out.append(rng.choice(self.next[(out[-2], out[-1])]))
        return out[:length]


class _Grams:
    """Where a word sequence occurs in one text (found from its first word's positions)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self._at: dict[str, list[int]] = {}
        for p, w in enumerate(tokens):
            self._at.setdefault(w, []).append(p)

    def positions(self, gram: Sequence[str]) -> list[int]:
        n, gram = len(gram), tuple(gram)
        return [p for p in self._at.get(gram[0], ()) if tuple(self.tokens[p:p + n]) == gram] if n else []


def _context_words(items: Sequence[_Item], ratio: float) -> dict[str, frozenset[str]]:
    """word -> the families it ties a text to (see :class:`ScanRules`), over every item of every
    pool, so a word common outside a family ("of", "yes", "(C)") ties to none."""
    docs = [(item.example.group, set(item.question) | set(item.answer)) for item in items]
    total: dict[str, int] = {}
    per_family: dict[str, dict[str, int]] = {}
    sizes: dict[str, int] = {}
    for group, ws in docs:
        for w in ws:
            total[w] = total.get(w, 0) + 1
        if group is not None:
            sizes[group] = sizes.get(group, 0) + 1
            counts = per_family.setdefault(group, {})
            for w in ws:
                counts[w] = counts.get(w, 0) + 1
    out: dict[str, set[str]] = {}
    for group, counts in per_family.items():
        n_family, n_other = sizes[group], len(docs) - sizes[group]
        for w, n in counts.items():
            # in two of its items at least: a word of one item ties a text to that item's
            # question (answer near its question run), not to a family
            if n >= 2 and n / n_family >= ratio * (total[w] - n + 1) / (n_other + 1):
                out.setdefault(w, set()).add(group)
    return {w: frozenset(gs) for w, gs in out.items()}


def _bucket(n: int) -> int:
    length = 8
    while length < n:
        length = math.ceil(length * 1.25)
    return length


# -- the scan --------------------------------------------------------------------------------------
class ChanceRates:
    """How often the chance texts reach a held-out item at a strength: the item's own rate, or,
    when higher, the add-one rate pooled over its stratum, the items of its question's length
    whose answers are (or are not) words of the training text (a few hundred texts reach each
    item too rarely to estimate its own rate, and its own add-one rate could never go below
    1 / texts: in a small vocabulary the length decides how often text of the task's kind
    reproduces a question, and a long verbatim one is rarer than any text count)."""

    def __init__(self, null: Sequence[Mapping[int, tuple[float, Any]]], strata: Sequence[Any]) -> None:
        self.texts = len(null)
        self.strata = strata
        own: dict[int, list[float]] = {}
        for text in null:
            for i, (s, _) in text.items():
                own.setdefault(i, []).append(s)
        self.own = {i: sorted(v) for i, v in own.items()}
        pooled: dict[Any, list[float]] = {}
        for i, v in own.items():
            pooled.setdefault(strata[i], []).extend(v)
        self.pooled = {b: sorted(v) for b, v in pooled.items()}
        self.stratum_size: dict[Any, int] = {}
        for b in strata:
            self.stratum_size[b] = self.stratum_size.get(b, 0) + 1

    def rate(self, i: int, s: float, own_text: bool = False) -> float:
        """The chance rate of item ``i`` at strength >= ``s``; ``own_text``: ``s`` comes from one
        of the chance texts, which is left out of its own reference."""
        out = self.texts - own_text
        item = self.own.get(i, [])
        reached = len(item) - bisect.bisect_left(item, s - 1e-12) - own_text
        b = self.strata[i]
        pool = self.pooled.get(b, [])
        pooled = len(pool) - bisect.bisect_left(pool, s - 1e-12) - own_text
        return max(reached / max(1, out), (1 + pooled) / (1 + self.stratum_size[b] * out))


def _length_bucket(n: int) -> int:
    return n if n <= 12 else 12 + round(4 * math.log2(n / 12))


def flag_statistic(strengths: Mapping[int, tuple[float, Any]], rates: ChanceRates, own_text: bool = False) -> float:
    """Sum over the pieces of evidence (a span of the text) of -log(the chance rate of the
    rarest item it matches, at that item's strength)."""
    best: dict[Any, float] = {}
    for i, (s, where) in strengths.items():
        surprise = -math.log(rates.rate(i, s, own_text))
        best[where] = max(best.get(where, 0.0), surprise)
    return sum(best.values())


def decide_flag(strengths: Mapping[int, tuple[float, Any]], null: Sequence[Mapping[int, tuple[float, Any]]],
                strata: Sequence[Any],
                rules: ScanRules, n_words: int) -> ChanceOverlap:
    """The red flag's decision (rule :data:`FLAG_RULE`): a permutation p of the candidate's
    statistic among the chance texts' own (each scored leaving itself out)."""
    rates = ChanceRates(null, strata)
    observed = flag_statistic(strengths, rates)
    nulls = sorted(flag_statistic(t, rates, own_text=True) for t in null)
    p = (1 + sum(1 for v in nulls if v >= observed - 1e-9)) / (1 + len(nulls))
    high = nulls[min(len(nulls) - 1, math.ceil((1 - rules.alpha) * len(nulls)) - 1)] if nulls else 0.0
    return ChanceOverlap(rule=FLAG_RULE, statistic=observed, p=p, alpha=rules.alpha, texts=len(nulls),
                         words=_bucket(n_words), null_mean=sum(nulls) / len(nulls) if nulls else 0.0,
                         null_high=high, flagged=p <= rules.alpha)


def scan_examples(candidate: Mapping[str, str], pools: Mapping[str, Sequence[Example]], *,
                  task: str = "", profile: str = "", rules: ScanRules = ScanRules(),
                  index: ExampleIndex | None = None) -> LeakScan:
    """Scan ``candidate`` for the questions and answers of ``pools`` (``train`` is the key pool;
    every other pool's matches are held-out overlap, red flags when beyond chance)."""
    tokens = words(candidate_text(candidate))
    index = index or ExampleIndex(pools, rules)
    found = index.match(tokens)
    cover, held = index.split(found)
    spans = [s for i in sorted(found) if index.items[i].pool == TRAIN for s in found[i]]
    encoded = [index.items[i].example.id for i in sorted(found) if index.items[i].pool == TRAIN]
    families = sorted({index.items[i].example.group for i in found
                       if index.items[i].pool == TRAIN and index.items[i].example.group is not None})
    held_spans = [s for i in sorted(held) for s in held[i]]
    chance = None
    flagged = bool(held)
    if held and index.train:
        strengths = {i: index.strength(i, s) for i, s in held.items()}
        chance = decide_flag(strengths, index.chance(len(tokens)), index.strata, rules, len(tokens))
        flagged = chance.flagged
    red = held_spans if flagged else []
    flag_cover = {p for s in red for p in range(s.start, s.end)}
    held_families = sorted({s.group for s in red if s.field == "family_answer" and s.group is not None})
    n = len(tokens)
    return LeakScan(task=task, profile=profile, candidate_id=candidate_id(dict(candidate)), words=n,
                    key_words=len(cover), share=len(cover) / n if n else 0.0,
                    flagged_share=len(flag_cover) / n if n else 0.0, encoded=encoded,
                    memorised_families=families, spans=spans, red_flags=red, held_out=held_spans,
                    held_out_families=held_families, chance=chance)


# the few tasks scanned last, each index kept only while its task lives: an index holds the
# task's test examples, which must leave the process with the task (an in-process optimizer
# may run next; tests/test_in_process_reach.py)
_INDEXES: list[tuple[weakref.ref[Task], ScanRules, ExampleIndex]] = []


def _forget_dead_tasks(_: object = None) -> None:
    _INDEXES[:] = [entry for entry in _INDEXES if entry[0]() is not None]


def task_index(task: Task, rules: ScanRules = ScanRules()) -> ExampleIndex:
    """The index of a loaded task's train, val, test and probe pools, kept for the few tasks
    scanned last while they are alive (a report or an autopsy scans many candidates of one task)."""
    for known, known_rules, index in _INDEXES:
        if known() is task and known_rules == rules:
            return index
    pools = {p: task.splits[p] for p in (TRAIN, "val", "test", PROBE) if p in task.splits}
    index = ExampleIndex(pools, rules)
    _INDEXES.insert(0, (weakref.ref(task, _forget_dead_tasks), rules, index))
    del _INDEXES[4:]
    return index


def scan_candidate(candidate: Mapping[str, str], task: Task, rules: ScanRules = ScanRules()) -> LeakScan:
    """:func:`scan_examples` over a loaded task's train, val, test and probe pools."""
    index = task_index(task, rules)
    return scan_examples(candidate, {}, task=task.name, profile=task.profile, rules=rules, index=index)


# -- the report hook -----------------------------------------------------------------------------
def answer_key_rows(records: Iterable[RunRecord], *, data_dir: str | None = None,
                    prompt_only: bool = False) -> list[dict[str, Any]]:
    """One row per final candidate (task, profile, method, seed, share, encoded, families,
    red_flags), for a report's answer-key table. A task whose data cannot be loaded gives a row
    with ``share`` None and the reason, never an exception. ``prompt_only`` leaves out tasks that
    are not prompt tasks with training data."""
    tasks: dict[tuple[str, str], Task | str] = {}
    rows = []
    for rec in records:
        if not rec.final_candidate:
            continue
        key = (rec.task, rec.profile)
        if key not in tasks:
            try:
                tasks[key] = load_task(rec.task, rec.profile, data_dir)
            except HeldoutError as exc:
                tasks[key] = str(exc)
        row: dict[str, Any] = {"task": rec.task, "profile": rec.profile, "method": rec.method, "seed": rec.seed,
                               "candidate_id": rec.final_candidate_id}
        loaded = tasks[key]
        if isinstance(loaded, str):
            rows.append({**row, "share": None, "problem": loaded})
            continue
        if prompt_only and (loaded.kind != "prompt" or not loaded.splits.get("train")):
            continue  # a program, or a task with no training data: there is no answer key to hold
        scan = scan_candidate(rec.final_candidate, loaded)
        rows.append({**row, "share": scan.share, "words": scan.words, "encoded": len(scan.encoded),
                     "families": len(scan.memorised_families), "red_flags": len(scan.red_flags)})
    return rows


__all__ = ["FLAG_RULE", "ChanceOverlap", "ExampleIndex", "LeakScan", "MatchedSpan", "ScanRules", "answer_key_rows",
           "candidate_text", "decide_flag", "flag_statistic", "scan_candidate", "scan_examples", "task_index"]
