"""The local model's requests per second: `heldout serve-model` against llama-cpp-python called
directly, in the same run (issues 36 and 38).

Every figure answers the same 16 completion prompts (greedy, 24 tokens at most, the server's
repeat penalty) with SmolLM2-135M-Instruct on one thread per slot:

* **direct**: ``llama_cpp.Llama.create_completion`` in this process, one prompt after another:
  the reference for what one slot can do;
* **server, 1 slot**, at concurrency 1, 4 and 8 (httpx threads against `serve-model`): at 1 it
  should keep up with direct (>= 0.95x); above 1 a single slot can only queue;
* **server, 2 slots** (``--slots 2``), at concurrency 4 and 8: > 1x the single-slot server on a
  machine with a second core.

It also prints each server's resident memory (VmRSS) after its requests, the figure the README
quotes. Needs the [local-model] extra and the weights (see the README).

    python perf/local_model_throughput.py [--prompts 16] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]  # this checkout's heldout

from heldout.models.backends.llama import resolve_model  # noqa: E402
from machine import verdict  # noqa: E402

MODEL = "smollm2-135m-instruct"
REPEAT_PENALTY = 1.1  # LlamaBackend's default, so both sides decode alike
SERVER = "import sys; from heldout.cli import main; sys.exit(main(sys.argv[1:]))"


def prompts(n: int) -> list[str]:
    return [f"Question {i}: what is {i} plus {i + 3}? Think step by step.\nAnswer:" for i in range(n)]


class Direct:
    """llama-cpp-python called directly in this process: one ``Llama`` on one thread, each prompt
    after a reset, as the server's backend answers it."""

    def __init__(self) -> None:
        import llama_cpp  # the optional extra, imported only where it is measured

        self.llm = llama_cpp.Llama(str(resolve_model(MODEL).path), n_ctx=1024, n_threads=1, n_threads_batch=1,
                                   seed=0, verbose=False)
        self.llm.create_completion("warm-up", max_tokens=4, temperature=0.0)  # as the server's first request

    def ask(self, text: str, max_tokens: int) -> int:
        self.llm.reset()
        out = self.llm.create_completion(text, max_tokens=max_tokens, temperature=0.0, repeat_penalty=REPEAT_PENALTY)
        return out["usage"]["completion_tokens"]


class Server:
    """`heldout serve-model --slots N` in its own process, on a free loopback port."""

    def __init__(self, slots: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, "serve-model", "--port", "0", "--threads", "1",
                                      "--slots", str(slots), "--ctx", "1024"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        if not found:
            self.proc.kill()
            raise SystemExit(f"serve-model did not start: {line!r} {self.proc.stderr.read()[-500:]}")
        self.base_url = found.group(1)

    def ask(self, client: httpx.Client, text: str, max_tokens: int) -> int:
        body = {"model": MODEL, "prompt": text, "max_tokens": max_tokens, "temperature": 0.0}
        reply = client.post(self.base_url + "/completions", json=body, timeout=300)
        reply.raise_for_status()
        return reply.json()["usage"]["completion_tokens"]

    def seconds(self, texts: list[str], max_tokens: int, concurrency: int) -> tuple[float, int]:
        with httpx.Client() as client:
            self.ask(client, texts[0], 4)  # warm-up
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as threads:
                tokens = sum(threads.map(lambda t: self.ask(client, t, max_tokens), texts))
        return time.perf_counter() - start, tokens

    def resident_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def close(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=60)


ROUNDS = 3  # passes over the prompts at concurrency 1, each prompt asked of direct, then of the server


def paired_seconds(direct: Direct, server: Server, texts: list[str], max_tokens: int) -> tuple[list, list, int, int]:
    """Per-prompt wall seconds of direct and of the 1-slot server at concurrency 1, each prompt
    asked of one right after the other: this machine's speed moves by up to 2x within seconds
    (rounds of 16 prompts alternated whole took 5.8 to 11.4 s for the same work), so only
    neighbours in time share a speed phase. Returns (direct, served, tokens of each)."""
    direct_s, served_s, direct_tokens, served_tokens = [], [], 0, 0
    with httpx.Client() as client:
        server.ask(client, texts[0], 4)  # warm-up
        for _ in range(ROUNDS):
            for text in texts:
                start = time.perf_counter()
                direct_tokens += direct.ask(text, max_tokens)
                direct_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                served_tokens += server.ask(client, text, max_tokens)
                served_s.append(time.perf_counter() - start)
    return direct_s, served_s, direct_tokens // ROUNDS, served_tokens // ROUNDS


def figures(n_prompts: int = 16, max_tokens: int = 24) -> list[dict]:
    """Rows for perf/run_all.py (see the module doc). Direct and the single-slot server at
    concurrency 1 are measured prompt by prompt in turn (:func:`paired_seconds`); the ratio is
    their total seconds over ``ROUNDS`` passes."""
    texts = prompts(n_prompts)
    direct = Direct()
    rates, memory, tokens = {}, {}, {}
    for slots, levels in ((1, (1, 4, 8)), (2, (4, 8))):
        server = Server(slots)
        try:
            if slots == 1:
                direct_s, served_s, direct_tokens, tokens[1, 1] = paired_seconds(direct, server, texts, max_tokens)
                rates[1, 1] = len(served_s) / sum(served_s)
            for concurrency in levels:
                if (slots, concurrency) != (1, 1):
                    took, tokens[slots, concurrency] = server.seconds(texts, max_tokens, concurrency)
                    rates[slots, concurrency] = n_prompts / took
            memory[slots] = server.resident_mb()
        finally:
            server.close()
    direct_rate = len(direct_s) / sum(direct_s)
    per_pass = [(sum(direct_s[k:k + n_prompts]), sum(served_s[k:k + n_prompts]))
                for k in range(0, len(direct_s), n_prompts)]
    passes = ", ".join(f"{d:.2f}/{s:.2f}" for d, s in per_pass)
    load = os.getloadavg()[0]
    note = (f"direct {direct_rate:.2f} req/s ({direct_tokens} tokens); RSS 1 slot {memory[1]:.0f} MB, "
            f"2 slots {memory[2]:.0f} MB; load {load:.1f}")
    rows = [{"name": "local model: 1 slot, concurrency 1 vs direct", "value": rates[1, 1], "unit": "req/s",
             "ratio": rates[1, 1] / direct_rate, "target": ">= 0.95x llama-cpp-python direct",
             "passed": rates[1, 1] / direct_rate >= 0.95,
             "note": f"{tokens[1, 1]} tokens; {ROUNDS} passes, each prompt asked of direct then of the server, "
                     f"direct/server s per pass: {passes}; {note}"}]
    for concurrency in (4, 8):
        ratio = rates[2, concurrency] / rates[1, concurrency]
        rows.append({"name": f"local model: 2 slots vs 1, concurrency {concurrency}", "value": rates[2, concurrency],
                     "unit": "req/s", "ratio": ratio, "target": "> 1x the single-slot server", "passed": ratio > 1.0,
                     "note": f"1 slot {rates[1, concurrency]:.2f} req/s; {note}"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    for row in figures(args.prompts, args.max_tokens):
        print(f"{row['name']:<44} {row['value']:6.2f} {row['unit']}  {row['ratio']:5.2f}x  "
              f"{verdict(row['passed'])}  ({row['target']}; {row['note']})")


if __name__ == "__main__":
    main()
