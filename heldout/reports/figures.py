"""The report's figures (matplotlib, Agg backend, PNG bytes so the HTML can embed them).

* :func:`score_bars`        - per task, mean held-out score by method (a point) with its 95% CI, on an
                              axis zoomed to the data, the baseline's value marked by a dashed line;
* :func:`best_so_far_plot`  - best-so-far vs metric calls, mean line and min-max band over seeds;
* :func:`pareto_plot`       - held-out score vs optimisation (or deployment) tokens, Pareto front
                              (None when no run recorded such tokens: an empty axis says nothing);
* :func:`paired_scatter`    - per example (or per group) baseline vs method, seed-averaged;
* :func:`autopsy_plot`      - the generalisation protocol's prompt autopsy: answer-key share vs
                              validation reward of each accepted candidate, one path per seed.

Layout rule: every figure uses matplotlib's constrained layout, so the figure title, panel titles,
tick labels and axis labels never overlap; long task names wrap.
"""

from __future__ import annotations

import io
import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # no display on CI machines; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator, PercentFormatter  # noqa: E402

from heldout.protocols.stats import avg_at_k_interval  # noqa: E402
from heldout.reports.collect import RunSet  # noqa: E402
from heldout.reports.tables import (  # noqa: E402
    DEPLOYMENT_CHANNELS,
    OPTIMISATION_CHANNELS,
    example_means,
    seed_scores,
    task_scale,
    tokens,
)

DPI = 100


@dataclass(frozen=True)
class Figure:
    key: str
    title: str
    caption: str
    png: bytes
    # the matplotlib figure itself (closed in pyplot, still drawable): vector copies on demand
    figure: Any = field(default=None, repr=False, compare=False)


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


MAX_PANELS = 24
"""Per-task figures draw at most this many panels: a figure of 250 panels is unreadable and its
layout cost grows faster than the report (11 of 18 s for 640 cells); the tables hold every task."""


def _first_panels(items: Sequence[Any], what: str) -> tuple[list[Any], str]:
    """The items a figure draws, and the caption's note when some are left out."""
    items = list(items)
    if len(items) <= MAX_PANELS:
        return items, ""
    return items[:MAX_PANELS], f" Showing the first {MAX_PANELS} of {len(items)} {what}; every one is in the tables."


def _grid(n: int, width: float = 4.6, height: float = 3.6):
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.4), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _title(ax, text: str, size: float = 10) -> None:
    """A panel title, wrapped so a long task label stays inside its panel."""
    ax.set_title(textwrap.fill(text, 38), fontsize=size)


def _colors(methods: Sequence[str]) -> dict[str, str]:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(methods)}


def score_bars(runs: RunSet, baseline: str | None = None) -> Figure:
    """Per task: each method's mean held-out score over seeds as a point, whiskers the 95% t
    interval of that mean over seeds (when a cell has >= 2 seeds that differ; a percentile
    bootstrap over 3 seeds is only their min-max range), the seeds' own scores as small dots, and
    the baseline's mean as a dashed line. The axis is zoomed to the data (it does not start at
    0), so 2.4975 vs 2.541 is visible. A whisker is never drawn outside the score's range
    (:func:`score_range`): a t interval over 3 seeds near the ceiling can reach past it (an
    accuracy to 1.33); such a whisker is cut at the bound and drawn without its cap there, and the
    caption names the cells."""
    cells, methods = runs.cells(), runs.methods()
    tasks, shown_note = _first_panels(runs.tasks(), "tasks")
    colors = _colors(methods)
    fig, axes = _grid(len(tasks))
    clipped: list[str] = []
    for ax, task in zip(axes, tasks):
        present = [m for m in methods if (task, m) in cells]
        values: list[float] = []
        bounds = score_range(runs, task, [s for m in present for s in seed_scores(cells[(task, m)])])
        for x, m in enumerate(present):
            scores = np.array(seed_scores(cells[(task, m)]))
            interval = avg_at_k_interval(scores)
            mean = float(scores.mean())
            ok = bool(np.isfinite(interval.low) and interval.se > 0)
            low, high = interval.low, interval.high
            if ok and bounds is not None and (low < bounds[0] or high > bounds[1]):
                low, high = max(low, bounds[0]), min(high, bounds[1])
                clipped.append(f"{m} on {task}")
                ax.vlines([x], low, high, color=colors[m], zorder=3)  # no cap where the bound cut it
                for end, cut in ((low, interval.low < bounds[0]), (high, interval.high > bounds[1])):
                    if not cut:
                        ax.plot([x - 0.08, x + 0.08], [end, end], color=colors[m], zorder=3)
                ax.plot([x], [mean], "o", color=colors[m], markersize=7, zorder=4)
            else:
                err = [[mean - low], [high - mean]] if ok else None
                ax.errorbar([x], [mean], yerr=err, fmt="o", color=colors[m], capsize=5, markersize=7, zorder=3)
            ax.scatter(np.full(scores.shape, x + 0.12), scores, s=10, color=colors[m], alpha=0.5, zorder=2)
            values += [float(v) for v in scores] + ([low, high] if ok else [])
        if baseline in present:
            base = float(np.mean(seed_scores(cells[(task, baseline)])))
            ax.axhline(base, color="0.35", linestyle="--", linewidth=1, zorder=1)
            ax.annotate(f"{baseline}: {base:.6g}", xy=(0.01, base), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", fontsize=7, color="0.3")
        lo, hi = min(values), max(values)
        pad = 0.15 * (hi - lo) if hi > lo else max(abs(hi) * 0.01, 1e-9)
        if bounds is not None:  # a margin past the bound, never room for a score beyond it
            pad = min(pad, 0.05 * (bounds[1] - bounds[0]))
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlim(-0.5, len(present) - 0.5)
        ax.set_xticks(range(len(present)), present, rotation=20, ha="right")
        _title(ax, task)
        ax.set_ylabel("held-out score")
    fig.suptitle("Held-out score by method (mean over seeds, 95% t interval; axis zoomed)")
    caption = ("Point: mean held-out score over seeds; whiskers: 95% t interval of that mean over seeds (absent when "
               "all seeds agree or only one seed ran); small dots: the seeds. The y axis is zoomed to the data, it "
               "does not start at 0")
    caption += f"; the dashed line marks {baseline}'s mean." if baseline else "."
    if clipped:
        caption += (" Whiskers cut at the score's range (0 to the task's ceiling) and drawn without a cap there: "
                    f"{'; '.join(clipped)} (a t interval over few seeds near a bound reaches past it).")
    caption += shown_note
    return Figure("bars", "Held-out score per task", caption, _png(fig), fig)


def score_range(runs: RunSet, task: str, scores: Sequence[float]) -> tuple[float, float] | None:
    """(0, ceiling) of a task's score when its runs state a ceiling and every seed's score lies
    in it; else None (a score that leaves that range, e.g. a program beating its reference, has
    no bound to cut at)."""
    _, ceiling = task_scale(runs, task)
    if ceiling is None or not scores or min(scores) < 0 or max(scores) > float(ceiling):
        return None
    return 0.0, float(ceiling)


def best_so_far_plot(runs: RunSet) -> Figure:
    cells, methods = runs.cells(), runs.methods()
    tasks, shown_note = _first_panels(runs.tasks(), "tasks")
    colors = _colors(methods)
    fig, axes = _grid(len(tasks))
    for ax, task in zip(axes, tasks):
        for m in methods:
            cell = cells.get((task, m))
            if not cell:
                continue
            budget = max(int(r.record.budget.get("metric_calls") or 0) for r in cell.values())
            grid = np.arange(0, max(budget, 1) + 1)
            curves = []
            for run in cell.values():
                curve = np.full(grid.shape, np.nan)
                for point in run.record.trajectory:
                    curve[grid >= point["metric_calls"]] = point["best_score"]
                curves.append(curve)
            stack = np.array(curves)
            seen = ~np.all(np.isnan(stack), axis=0)
            if not seen.any():
                continue
            with np.errstate(all="ignore"):
                mean = np.nanmean(stack[:, seen], axis=0)
                low, high = np.nanmin(stack[:, seen], axis=0), np.nanmax(stack[:, seen], axis=0)
            ax.step(grid[seen], mean, where="post", color=colors[m], label=f"{m} (n={len(cell)})")
            ax.fill_between(grid[seen], low, high, step="post", color=colors[m], alpha=0.2)
        _title(ax, task)
        ax.set_xlabel("metric calls")
        ax.set_ylabel("best-so-far (optimizer-visible)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no method evaluated a candidate", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Best-so-far vs metric calls (line: mean; band: min-max over seeds)")
    return Figure("best_so_far", "Best-so-far vs metric calls", "Optimizer-visible best score (val, else train) "
                  "after each metric call; the band spans the seeds." + shown_note, _png(fig), fig)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated by another (fewer or equal tokens and higher or equal score, one of
    them strictly), sorted by tokens."""
    front = []
    for i, (t, s) in enumerate(points):
        dominated = any((t2 <= t and s2 >= s) and (t2 < t or s2 > s) for j, (t2, s2) in enumerate(points) if j != i)
        if not dominated:
            front.append((t, s))
    return sorted(set(front))


def pareto_plot(runs: RunSet, kind: str) -> Figure | None:
    """``kind`` is ``"optimisation"`` or ``"deployment"``. None when no run recorded any such
    tokens (program tasks, cached calls): the report says so instead of an empty axis."""
    channels = OPTIMISATION_CHANNELS if kind == "optimisation" else DEPLOYMENT_CHANNELS
    cells, methods = runs.cells(), runs.methods()
    tasks, shown_note = _first_panels(runs.tasks(), "tasks")
    if not any(tokens(r, channels) for cell in cells.values() for r in cell.values()):
        return None
    colors = _colors(methods)
    fig, axes = _grid(len(tasks))
    all_zero = True
    for ax, task in zip(axes, tasks):
        points, names = [], []
        for m in methods:
            cell = cells.get((task, m))
            if not cell:
                continue
            used = float(np.mean([tokens(r, channels) for r in cell.values()]))
            score = float(np.mean(seed_scores(cell)))
            all_zero &= used == 0
            points.append((used, score))
            names.append(m)
            ax.scatter([used], [score], color=colors[m], s=40, label=m, zorder=3)
        front = pareto_front(points)
        if len(front) > 1:
            ax.plot(*zip(*front), color="0.4", linestyle="--", linewidth=1, label="Pareto front", zorder=2)
        if any(t > 0 for t, _ in points):
            ax.set_xscale("symlog", linthresh=1000)
        else:
            ax.text(0.5, 0.5, f"no {kind} tokens for this task", ha="center", va="center", transform=ax.transAxes)
        _title(ax, task)
        ax.set_xlabel(f"{kind} tokens (mean over seeds)")
        ax.set_ylabel("held-out score")
        ax.legend(fontsize=7)
    fig.suptitle(f"Held-out score vs {kind} tokens")
    caption = (f"Each point is a method (mean over seeds); the dashed line joins the methods no other beats on "
               f"both held-out score and {kind} tokens.")
    if all_zero:
        caption += f" No {kind} tokens were recorded in these runs (program tasks or cached calls)."
    caption += shown_note
    return Figure(f"pareto_{kind}", f"Pareto front: score vs {kind} tokens", caption, _png(fig), fig)


def paired_scatter(runs: RunSet, baseline: str,
                   groups: Mapping[str, Mapping[str, str]] | None = None) -> Figure | None:
    """Per task, each method's seed-averaged score per example (or per group when ``groups[task]``
    maps example ids to groups) against the baseline's. Points above the diagonal improved (below
    it, for a lower-is-better metric)."""
    cells, tasks = runs.cells(), runs.tasks()
    pairs = [(t, m) for t in tasks for m in runs.methods()
             if m != baseline and (t, m) in cells and (t, baseline) in cells]
    if not pairs:
        return None
    pairs, shown_note = _first_panels(pairs, "task-method pairs")
    colors = _colors(runs.methods())
    fig, axes = _grid(len(pairs), width=3.6, height=3.4)
    rng = np.random.default_rng(0)
    by_group = False
    for ax, (task, method) in zip(axes, pairs):
        base, mine = example_means(cells[(task, baseline)]), example_means(cells[(task, method)])
        shared = [e for e in base if e in mine]
        mapping = (groups or {}).get(task)
        if mapping and any(mapping.get(e) for e in shared):
            by_group = True
            keys = sorted({mapping.get(e) or "(none)" for e in shared})
            x = np.array([np.mean([base[e] for e in shared if (mapping.get(e) or "(none)") == k]) for k in keys])
            y = np.array([np.mean([mine[e] for e in shared if (mapping.get(e) or "(none)") == k]) for k in keys])
        else:
            x = np.array([base[e] for e in shared])
            y = np.array([mine[e] for e in shared])
        # Scores are often 0/1: a little jitter shows how many points sit on each corner.
        span = max(float(np.ptp(np.concatenate([x, y]))), 1e-9)
        jitter = 0.015 * span
        ax.scatter(x + rng.uniform(-jitter, jitter, x.shape), y + rng.uniform(-jitter, jitter, y.shape),
                   s=14, alpha=0.6, color=colors[method])
        lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
        pad = 0.05 * max(hi - lo, 1e-9)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.5", linewidth=1, linestyle=":")
        ax.set_xlabel(f"{baseline}")
        ax.set_ylabel(method)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # long tick labels (0.0005) must not touch
        _title(ax, task, 9)
    unit = "group (topic)" if by_group else "example"
    costs = sorted({task for task, _ in pairs if not runs.metric(task).higher_is_better})
    below = f" (below it where lower is better: {', '.join(costs)})" if costs else ""
    fig.suptitle(f"Per-{unit} held-out score: {baseline} vs optimised (seed-averaged)")
    return Figure("scatter", f"Per-{unit} scatter vs {baseline}", f"Each point is one held-out {unit}, its score "
                  f"averaged over seeds; above the dotted diagonal the method beats {baseline}{below}. Points are "
                  "jittered slightly so ties stay visible." + shown_note, _png(fig), fig)


def autopsy_plot(rows: Sequence[Any], caveat: str) -> Figure | None:
    """``rows``: the autopsy's accepted candidates (``seed``, ``step``, ``share``, ``val_reward``,
    ``final``; :class:`heldout.protocols.prompt_autopsy.AutopsyRow`). One panel: x the answer-key
    share, y the validation reward, each seed's candidates joined in lineage order, the final one
    drawn as a star. None when no candidate has a validation reward (nothing to draw)."""
    drawn = [r for r in rows if r.val_reward is not None]
    if not drawn:
        return None
    seeds = sorted({r.seed for r in drawn})
    colors = _colors([str(s) for s in seeds])
    fig, (ax,) = _grid(1, width=6.4, height=4.4)
    for seed in seeds:
        path = sorted((r for r in drawn if r.seed == seed), key=lambda r: r.step)
        xs, ys = [r.share for r in path], [r.val_reward for r in path]
        ax.plot(xs, ys, "-o", color=colors[str(seed)], markersize=5, linewidth=1, label=f"seed {seed}")
        for r in path:
            if r.final:
                ax.scatter([r.share], [r.val_reward], marker="*", s=160, color=colors[str(seed)], zorder=3,
                           edgecolors="black", linewidths=0.6)
    ax.xaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xlabel("answer-key share of the candidate's words")
    ax.set_ylabel("validation reward")
    ax.legend(fontsize=8, loc="best")
    _title(ax, "Prompt autopsy: answer-key share vs validation reward", 10)
    caption = (f"Each accepted candidate of each seed's run ({len(drawn)} with a validation reward), joined in "
               "lineage order; the star is the final candidate. Caveat: " + caveat + ".")
    return Figure("autopsy", "Prompt autopsy (figure)", caption, _png(fig), fig)
