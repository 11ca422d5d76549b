"""Redraw the pool and refreeze ``data_manifests/lockpicking/six.json`` (only with a new task
version: the manifest is what makes the 50 strings fixed).

    python -m heldout.benchmarks.lockpicking.rebuild
"""

from heldout.benchmarks.lockpicking.pool import draw_pool, write_pool
from heldout.benchmarks.lockpicking.task import BENCHMARK
from heldout.data_manifests import Manifest, freeze


def freeze_manifest() -> Manifest:
    """Freeze ``data_manifests/lockpicking/six.json`` from the stored pool (profiles `paper`,
    `default` = `paper`, `generalise`)."""
    examples = BENCHMARK.load_raw(None)
    paper = [ex.id for ex in examples if ex.meta.get("pool") == "paper"]
    extra = [ex.id for ex in examples if ex.meta.get("pool") == "extra"]
    paper_note = ("train = test by design, as in the paper: all 50 strings are visible and scored; the measured "
                  "quantity is reconstruction of the hidden rule system, not generalisation")
    profiles = {"paper": {"train": paper, "test": paper}, "default": {"train": paper, "test": paper},
                "generalise": {"train": paper, "val": extra[:50], "test": extra[50:]}}
    notes = {"paper": paper_note, "default": "alias of `paper`; " + paper_note,
             "generalise": "train = the paper's 50; val 50 and test 300 further strings from the same pool, "
                           "disjoint from train: transfer of the recovered rules, beyond the paper"}
    return freeze(BENCHMARK.name, BENCHMARK.version, BENCHMARK.source, examples, profiles, notes)


if __name__ == "__main__":
    write_pool(draw_pool())
    print(freeze_manifest().save())
