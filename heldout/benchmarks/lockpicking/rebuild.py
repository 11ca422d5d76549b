"""Redraw the pool and refreeze ``data_manifests/lockpicking/six.json`` (only with a new task
version: the manifest is what makes the 50 strings fixed).

    python -m heldout.benchmarks.lockpicking.rebuild
"""

from heldout.benchmarks.lockpicking.pool import draw_pool, freeze_manifest, write_pool

if __name__ == "__main__":
    write_pool(draw_pool())
    print(freeze_manifest().save())
