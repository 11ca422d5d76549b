# PYTHON_ARGCOMPLETE_OK  (global completion of `python -m heldout.cli` reads this file, as it read cli.py)
"""``python -m heldout.cli``: the ``heldout`` command (``python -m heldout`` also takes the working
directory off the import path before anything is imported; see heldout/__main__.py)."""

import sys

from heldout.cli import main

sys.exit(main())
