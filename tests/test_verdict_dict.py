"""A verdict's dict (what the ledger stores and the optimizer is shown) is ``dataclasses.asdict``'s,
a deep copy: an optimizer that edits what it was shown cannot change the verdict the session keeps."""

from __future__ import annotations

import dataclasses

from heldout.contracts import Verdict


@dataclasses.dataclass
class Measured:
    cycles: list


class Opaque:
    pass


VERDICTS = [
    Verdict("ex-1", 1.0, dimensions={"strict": 1.0, "flexible": 1.0}, feedback="correct: 'a b'",
            output={"text": "So the answer is a b.", "answer": "a b", "why": None, "extracted": ["a", ("b", 2)]},
            usage={"prompt_tokens": 120.0, "cached": 0.0}),
    Verdict.failure("ex-2", "worker call failed", "model_error"),
    Verdict("ex-3", 0.5, output=Measured([1, (2, {"k": [3]})])),       # a dataclass inside: asdict's rule
    Verdict("ex-4", 0.5, output={"nested": {(1, 2): [Measured([4])]}}),
    Verdict("ex-5", 0.0, output=Opaque()),                                 # copied by asdict (deepcopy)
]


def test_a_verdicts_dict_is_what_dataclasses_asdict_makes_of_it():
    for verdict in VERDICTS:
        got, expected = verdict.to_dict(), dataclasses.asdict(verdict)
        if isinstance(verdict.output, Opaque):
            assert type(got["output"]) is Opaque and got["output"] is not verdict.output
            got, expected = ({k: v for k, v in d.items() if k != "output"} for d in (got, expected))
        assert got == expected
        assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]


def test_editing_the_dict_leaves_the_verdict_as_it_was():
    verdict = VERDICTS[0]
    shown = verdict.to_dict()
    shown["dimensions"]["strict"] = 0.0
    shown["output"]["extracted"][0] = "z"
    shown["usage"].clear()
    assert verdict.dimensions["strict"] == 1.0
    assert verdict.output["extracted"] == ["a", ("b", 2)]
    assert verdict.usage == {"prompt_tokens": 120.0, "cached": 0.0}
