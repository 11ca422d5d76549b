"""``python -m heldout``: the command line. ``-m`` puts the working directory first on the import
path; a user's folder (an optimizer's repository, where the docs have you type the command) must
not supply the harness's modules, so it is taken off before anything of the command is imported
(``heldout.cli.main`` keeps it off; ``python -P -m heldout`` never puts it on)."""

import os
import sys

sys.path[:] = [entry for entry in sys.path if entry not in ("", os.getcwd())]

from heldout.cli import main  # noqa: E402  (after the path is safe)

sys.exit(main())
