"""``heldout serve-model``: an OpenAI-compatible endpoint on 127.0.0.1 for a local GGUF model."""

from __future__ import annotations

import argparse
import sys

from heldout.cli.shared import add_local_model_arguments, local_backend, number
from heldout.contracts import HeldoutError

# Start-up time: the command imports its modules when it runs, so the parser loads none of them
# (heldout/cli/__init__.py).


def serve_model_arguments(p: argparse.ArgumentParser) -> None:
    add_local_model_arguments(p)
    p.add_argument("--port", type=int, default=8000, help="0: let the OS choose (printed)")
    p.add_argument("--max-tokens", type=int, default=512, help="the most tokens one answer may have")
    p.add_argument("--api-key", default=None, help="require this bearer token")
    p.add_argument("--slots", type=number(int, 1, "--slots"), default=1,
                   help="requests answered at once, each by its own model copy (SmolLM2-135M measured: VmRSS 219 MB "
                        "with 1 slot, 356 MB with 2); give each slot a core: slots x threads <= cores")


def cmd_serve_model(args: argparse.Namespace) -> int:
    # Each slot is its own llama.cpp context over the same memory-mapped weights: N slots answer N
    # requests at once, and which slot answers never changes the text (see SlotPool).
    from heldout.models.backends.pool import SlotPool
    from heldout.models.server import ChatServer
    pool = SlotPool([local_backend(args, args.max_tokens) for _ in range(args.slots)])
    first = pool.copies[0]
    server = ChatServer(pool, api_key=args.api_key, port=args.port, name="local-model")
    try:
        stats = server.serve_until_signalled(
            f"heldout serve-model: {pool.model_id} ({first.model_file.path.name}, {args.slots} slot(s) of "
            f"{args.threads} thread(s), context {args.ctx}) listening on {{url}}")
    except OSError as exc:
        raise HeldoutError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}") from None
    per_slot = ", ".join(str(n) for n in pool.answered)
    print(f"served {stats.ok} of {stats.calls} calls (per slot: {per_slot})", file=sys.stderr, flush=True)
    return 0
