"""What a library's reflection model may be told about one evaluation: the fields the visibility
policy showed for that split, and nothing else (standard library only; the isolated child has it)."""

from __future__ import annotations

from typing import Any, Mapping

HIDDEN_OUTPUT = "(not shown to the optimizer under this visibility policy)"


def feedback_text(shown: Mapping[str, Any]) -> str:
    """Feedback built from ``score``, ``error``, ``feedback`` and ``target``, each only when the
    view showed it (under the standard policy a val result carries the score alone)."""
    parts = []
    if "score" in shown:
        parts.append(f"Score: {float(shown['score']):g}")
    if shown.get("error"):
        parts.append(f"Error: {shown['error']}")
    if shown.get("feedback"):
        parts.append(str(shown["feedback"]))
    if "target" in shown:
        parts.append(f"Expected answer: {shown['target']}")
    return "\n".join(parts)


def output_text(shown: Mapping[str, Any]) -> str:
    """The candidate's output as the text a model would read, when the view showed it, else a
    placeholder saying it is hidden. A prompt task's output is the worker's text (its other
    fields, the readings of each extraction mode, are the harness's bookkeeping and never a
    Python dict repr in a proposer's prompt); other outputs are written one field per line."""
    if "output" not in shown:
        return HIDDEN_OUTPUT
    output = shown["output"]
    if isinstance(output, Mapping):
        if isinstance(output.get("text"), str):
            return output["text"]
        return "\n".join(f"{key}: {value}" for key, value in output.items() if value is not None)
    return str(output)
