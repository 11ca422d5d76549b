"""``heldout completion``: the shell's completion script (argcomplete, the optional extra
``heldout[completion]``)."""

from __future__ import annotations

import argparse

from heldout.contracts import HeldoutError


COMPLETION_SHELLS = ("bash", "zsh", "fish")


def completion_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=COMPLETION_SHELLS, help="e.g. `eval \"$(heldout completion bash)\"` in ~/.bashrc")


def cmd_completion(args: argparse.Namespace) -> int:
    try:
        import argcomplete
    except ImportError:  # the optional extra heldout[completion]
        raise HeldoutError("shell completion needs argcomplete: pip install 'heldout[completion]'") from None
    print(argcomplete.shellcode(["heldout"], shell=args.shell))
    return 0
