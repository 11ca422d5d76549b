"""DSPy (3.4.1) driven through a heldout view: ``dspy.Evaluate``, ``MIPROv2`` and ``dspy.GEPA``
count against heldout's budget.

How the worker is reached. A heldout prompt task is a DSPy program, :class:`HeldoutProgram`: one
``dspy.Predict`` (``<task inputs> -> answer``) whose instructions (plus any demos) *are* the
candidate, run as usual on :func:`worker_lm`, a ``dspy.LM`` whose engine talks to no endpoint:
each call is one ``view.evaluate`` of the candidate on the example (the harness renders, calls its
metered worker, scores, charges **one metric call**) and returns what the view showed (train: the
output; val: a placeholder, as the standard policy hides it). DSPy never talks to the worker
itself, and ``len(worker_lm.history)`` is the number of metric calls DSPy believes it made.

Metrics. :func:`metric` (``metric(example, prediction, trace=None)``, for ``dspy.Evaluate`` and
``MIPROv2``) and :func:`feedback_metric` (``(gold, pred, trace, pred_name, pred_trace)``, for
``dspy.GEPA``) read the view's verdict carried by the prediction: the score, and feedback built
only from the fields the policy showed. They cost nothing; the program call already paid. DSPy's
optimizers only maximise, so the score they return is *oriented*: ``view.metric.sign * score``,
a lower-is-better metric's (a cost's) negated; the ``dspy_run`` event states it
(``scores_fed_to_dspy``).

The architect. :func:`architect_lm` is a ``dspy.LM`` over ``view.architect``: MIPROv2's prompt
model and dspy.GEPA's reflection LM, metered like every other method's optimisation tokens.

Budget. A call the budget cannot pay for is refused by the view (nothing runs); the engine notes
it (:attr:`ViewBridge.refusals`) and DSPy scores that example as a failure. A budget below the
method's minimum (``minimum_metric_calls`` of its settings) is refused before anything runs
(:class:`~heldout.adapters.settings.BudgetTooSmall`: the cell fails, it is not the seed's score).
``MIPROv2`` proposes instructions and few-shot demos by default (``zero_shot=true``: instructions
only, the earlier reduced form); its trials are sized to what the budget leaves after its
bootstrap (:class:`BudgetSizedMIPRO`). ``dspy.GEPA`` gets the remaining budget and a stop check
on the first refusal. Example ids are split-prefixed (``train:ID``) like the GEPA adapter's.
DSPy counts one metric call per program call; under ``--verifier repeated:K`` the view charges K,
and the ``dspy_run`` event names the difference (``charged_beyond_dspy_count``, (K - 1) per call).

The user's own program. :class:`UserProgram` wraps any ``dspy.Module`` the user builds (a
``ChainOfThought``, a pipeline) so MIPROv2 and dspy.GEPA optimise it on the same protected worker.
Its candidate is what DSPy's chat adapter renders: each predictor's system message and demos, under
a ``## Step N`` heading when there are several; the user message is the task's, so the harness
re-scores exactly this candidate on test with no user code running. One program call is one
metric call: its first LM call is the view evaluation, every later one reads the same worker text
(:class:`ShownTextAdapter`). A program call that raises stops the run (``dspy_program_error`` in
the ledger, every later call refused, :class:`ProgramFailed`): the cell fails, never ``ok`` on 0s.

Run isolated: ``--optimizer-cmd "dspy-mipro=python -m heldout.adapters.dspy mipro"`` (or ``gepa``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import contextvars
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from heldout.adapters.client import run_from_env
from heldout.adapters.settings import (DSPyGEPASettings, MIPROSettings, mipro_cost, refuse_below_minimum,
                                       val_size_for_budget, verifier_repeats)
from heldout.adapters.shown import feedback_text, output_text
from heldout.contracts import BudgetExceeded, Candidate, HeldoutError, TaskView

# litellm (imported by dspy) would fetch a model price list from the network at import
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
try:
    import dspy
    from dspy.lm15 import Message, Response, TextPart, Usage
    from dspy.propose import grounded_proposer
    from dspy.propose.utils import get_dspy_source_code as dspy_source_code
    from dspy.utils.exceptions import AdapterParseError
except ImportError as exc:  # an optional extra
    raise HeldoutError(f"the DSPy adapter needs dspy==3.4.1 (pip install 'heldout[dspy]'): {exc}") from exc

ANSWER = "answer"
REF = "heldout_ref"  # the input field carrying the split-prefixed example id
EVENT = "dspy_run"
PROGRAM_ERROR = "dspy_program_error"


class ProgramFailed(HeldoutError):
    """The user's DSPy program raised on a call; the run stops with its error."""


@dataclass
class Rollout:
    """One program call being served: the candidate, the example, and what the view showed."""

    candidate: Candidate
    split: str
    example_id: str
    shown: dict[str, Any] | None = None
    as_answer: bool = True  # the worker's text goes to DSPy as the answer field, else as written


_ROLLOUT: contextvars.ContextVar[Rollout | None] = contextvars.ContextVar("heldout_dspy_rollout", default=None)


@dataclass
class ViewBridge:
    """The view as the DSPy engines use it, with the counts the tests compare to the ledger."""

    view: TaskView
    worker_calls: int = 0  # calls the worker LM served (each charged by the view)
    refusals: int = 0  # calls the view refused for lack of budget (nothing ran, nothing charged)
    errors: list[str] = field(default_factory=list)
    failure: str | None = None  # the first error a user's program raised; nothing runs after it
    metric_calls: int = 0  # what the view charged for those calls (K per call under repeated:K)

    def evaluate(self, rollout: Rollout) -> dict[str, Any]:
        if self.failure is not None:
            raise ProgramFailed(self.failure)
        before = self.view.remaining
        try:
            shown = self.view.evaluate(rollout.candidate, rollout.split, [rollout.example_id])[0]
        except BudgetExceeded:
            self.refusals += 1
            raise
        self.worker_calls += 1
        self.metric_calls += before - self.view.remaining
        return shown

    def should_stop(self, state: Any = None) -> bool:
        return self.refusals > 0 or self.failure is not None

    def fail(self, rollout: Rollout, exc: BaseException) -> ProgramFailed:
        """Note the first error of the user's program in the ledger and say what it was."""
        if self.failure is None:
            error = f"{type(exc).__name__}: {exc}"[:2000]
            self.failure = f"the DSPy program raised on {rollout.split}:{rollout.example_id}: {error}"
            self.view.record_event(PROGRAM_ERROR, split=rollout.split, example_id=rollout.example_id, error=error)
        return ProgramFailed(self.failure)


def _messages(request: Any) -> list[dict[str, str]]:
    system = request.system
    if system is not None and not isinstance(system, str):
        system = "".join(part.text for part in system)
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": m.role, "content": m.text or ""} for m in request.messages]


def _response(text: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> Response:
    return Response(id=None, model="heldout", message=Message.assistant([TextPart(text)]), finish_reason="stop",
                    usage=Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens,
                                total_tokens=prompt_tokens + completion_tokens))


class WorkerEngine:
    """A DSPy engine with no endpoint: one call = one view evaluation of the current rollout."""

    def __init__(self, bridge: ViewBridge) -> None:
        self.bridge = bridge

    def complete(self, request: Any) -> Response:
        rollout = _ROLLOUT.get()
        if rollout is None:
            raise HeldoutError("heldout's worker LM answers only inside a HeldoutProgram call: the harness, "
                               "not DSPy, renders the task's prompt for the worker")
        if rollout.shown is None:  # a program call's first LM call is its one metric call
            rollout.shown = self.bridge.evaluate(rollout)
        if not rollout.as_answer:
            return _response(output_text(rollout.shown))
        text = output_text(rollout.shown).replace("[[ ##", "[ ##")
        return _response(f"[[ ## {ANSWER} ## ]]\n{text}\n\n[[ ## completed ## ]]")

    def stream(self, request: Any):
        raise HeldoutError("heldout's worker LM does not stream")

    def close(self) -> None:
        pass


class ArchitectEngine:
    """A DSPy engine over the session's metered architect (``view.architect``)."""

    def __init__(self, view: TaskView) -> None:
        self.view = view

    def complete(self, request: Any) -> Response:
        config = request.config
        temperature = getattr(config, "temperature", None)
        max_tokens = getattr(config, "max_tokens", None)
        text = self.view.architect(_messages(request), temperature=1.0 if temperature is None else float(temperature),
                                   max_tokens=max_tokens)
        return _response(text)

    def stream(self, request: Any):
        raise HeldoutError("heldout's architect LM does not stream")

    def close(self) -> None:
        pass


def worker_lm(bridge: ViewBridge) -> "dspy.LM":
    return dspy.LM("heldout/worker", engine=WorkerEngine(bridge), cache=False, num_retries=0)


def architect_lm(view: TaskView) -> "dspy.LM":
    return dspy.LM("heldout/architect", engine=ArchitectEngine(view), cache=False, num_retries=0)


def _input_fields(view: TaskView) -> list[str]:
    first = (view.train or view.val or [{"input": {}}])[0]["input"]
    keys = list(first) if isinstance(first, dict) else []
    return keys if keys and all(k.isidentifier() and k not in (ANSWER, REF) for k in keys) else ["input"]


class _Shared:
    """Holds the worker LM and its bridge so that DSPy's copies of a program share them (one LM,
    one history, one view)."""

    def __init__(self, bridge: ViewBridge) -> None:
        self.bridge = bridge
        self.lm = worker_lm(bridge)

    def __deepcopy__(self, memo: dict) -> "_Shared":
        return self


class HeldoutProgram(dspy.Module):
    """The task as a DSPy program; see the module docstring. ``component`` names the candidate's
    text component DSPy optimises (the instruction); other components stay as the seed has them."""

    def __init__(self, view: TaskView, bridge: ViewBridge) -> None:
        super().__init__()
        self._base = dict(view.seed_candidate)
        self._component = "instruction" if "instruction" in self._base else sorted(self._base)[0]
        self._fields = _input_fields(view)
        signature = dspy.Signature(", ".join(self._fields) + f" -> {ANSWER}", self._base[self._component])
        self.predict = dspy.Predict(signature)
        self._worker = _Shared(bridge)
        self._adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)  # one LM call per program call

    @property
    def worker(self) -> "dspy.LM":
        return self._worker.lm

    def candidate(self) -> Candidate:
        """The heldout candidate this program stands for: instructions, then any demos."""
        text = self.predict.signature.instructions
        demos = [d for d in self.predict.demos or [] if d.get(ANSWER) is not None]
        if demos:
            shown = "\n\n".join("\n".join(f"{k}: {d.get(k, '')}" for k in self._fields) + f"\n{ANSWER}: {d[ANSWER]}"
                                for d in demos)
            text = f"{text}\n\nExamples:\n\n{shown}"
        return {**self._base, self._component: text}

    def forward(self, **inputs: Any) -> "dspy.Prediction":
        split, example_id = _example_ref(inputs)
        rollout = Rollout(self.candidate(), split, example_id)
        token = _ROLLOUT.set(rollout)
        try:
            with dspy.context(lm=self._worker.lm, adapter=self._adapter):
                prediction = self.predict(**{k: inputs.get(k, "") for k in self._fields})
        finally:
            _ROLLOUT.reset(token)
        return _with_verdict(prediction, rollout.shown, self._worker.bridge.view.metric.sign)


def _with_verdict(prediction: "dspy.Prediction", shown: dict[str, Any], sign: int) -> "dspy.Prediction":
    """The program's answer carrying the view's verdict, for the metrics. A copy: the predictor's
    own prediction sits in DSPy's trace, from which demos and dspy.GEPA's reflective records are
    written, and the verdict (the harness's readings of the output) is no text a model should see."""
    answered = dspy.Prediction(**{k: v for k, v in prediction.items()})
    answered.heldout_verdict = shown
    answered.heldout_sign = sign  # the metric's direction: DSPy maximises what the metrics return
    return answered


def _example_ref(inputs: dict[str, Any]) -> tuple[str, str]:
    """(split, example id) of a program call, popped from its ``heldout_ref`` input."""
    ref = inputs.pop(REF, None)
    if not isinstance(ref, str) or ":" not in ref:
        raise HeldoutError(f"a heldout DSPy program is called on examples from heldout_examples(); missing {REF}")
    split, _, example_id = ref.partition(":")
    return split, example_id


def _refused(exc: BaseException | None) -> bool:
    """True when ``exc`` is, or was raised while handling, the view's refusal of a call."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (BudgetExceeded, ProgramFailed)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class ShownTextAdapter(dspy.ChatAdapter):
    """DSPy's chat adapter, reading text the worker wrote for the task's prompt: when the text
    marks every output field (``[[ ## name ## ]]``) they are read as DSPy reads them; otherwise
    each output field holds the whole text (the harness, not DSPy, reads the answer)."""

    def __init__(self) -> None:
        super().__init__(use_json_adapter_fallback=False)  # one LM call per predictor call

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        try:
            return super().parse(signature, completion)
        except AdapterParseError:
            return {name: completion for name in signature.output_fields}


class UserProgram(dspy.Module):
    """A user's ``dspy.Module`` run on heldout's worker; see the module docstring. Its candidate
    is DSPy's rendering of its predictors, in the seed candidate's instruction component."""

    def __init__(self, view: TaskView, bridge: ViewBridge, module: Any) -> None:
        super().__init__()
        if not isinstance(module, dspy.Module):
            raise HeldoutError(f"a DSPy program factory returns a dspy.Module, got {type(module).__name__}")
        if not module.named_predictors():
            raise HeldoutError("the DSPy program has no predictor (dspy.Predict, ChainOfThought ...) to optimise")
        self.program = module
        self._base = dict(view.seed_candidate)
        self._component = "instruction" if "instruction" in self._base else sorted(self._base)[0]
        self._fields = _input_fields(view)
        self._worker = _Shared(bridge)
        self._adapter = ShownTextAdapter()

    @property
    def worker(self) -> "dspy.LM":
        return self._worker.lm

    def candidate(self) -> Candidate:
        """DSPy's rendering of every predictor: its system message, then its demos."""
        predictors = self.program.named_predictors()
        blocks = []
        for step, (name, predictor) in enumerate(predictors, start=1):
            text = self._adapter.format_system_message(predictor.signature)
            demos = self._adapter.format_demos(predictor.signature, list(predictor.demos or []))
            if demos:
                text += "\n\nExamples:\n\n" + "\n\n".join(m["content"] for m in demos)
            blocks.append(text if len(predictors) == 1 else f"## Step {step}: {name}\n{text}")
        return {**self._base, self._component: "\n\n".join(blocks)}

    def forward(self, **inputs: Any) -> "dspy.Prediction":
        split, example_id = _example_ref(inputs)
        rollout = Rollout(self.candidate(), split, example_id, as_answer=False)
        token = _ROLLOUT.set(rollout)
        try:
            with dspy.context(lm=self._worker.lm, adapter=self._adapter):
                prediction = self.program(**{k: inputs.get(k, "") for k in self._fields})
        except Exception as exc:
            if _refused(exc):  # the view refused the call (DSPy's LM may wrap that): nothing ran
                raise
            raise self._worker.bridge.fail(rollout, exc) from exc  # the user's program itself
        finally:
            _ROLLOUT.reset(token)
        if rollout.shown is None:
            raise self._worker.bridge.fail(rollout, HeldoutError("the program returned without calling its LM"))
        if not isinstance(prediction, dspy.Prediction):
            raise self._worker.bridge.fail(rollout, HeldoutError(
                f"the program returned {type(prediction).__name__}, not a dspy.Prediction"))
        return _with_verdict(prediction, rollout.shown, self._worker.bridge.view.metric.sign)


def heldout_examples(view: TaskView, split: str) -> list["dspy.Example"]:
    """The view's ``split`` as DSPy examples: the task inputs and ``heldout_ref`` as inputs, and
    the target as ``answer`` where the view shows targets (train)."""
    fields = _input_fields(view)
    out = []
    for ex in view.train if split == "train" else view.val:
        given = ex["input"] if fields != ["input"] else {"input": ex["input"]}
        values = {k: str(given.get(k, "")) for k in fields}
        if "target" in ex:
            values[ANSWER] = str(ex["target"])
        out.append(dspy.Example(**values, **{REF: f"{split}:{ex['id']}"}).with_inputs(REF, *fields))
    return out


def _verdict(prediction: Any) -> dict[str, Any]:
    verdict = getattr(prediction, "heldout_verdict", None) if prediction is not None else None
    if verdict is None:
        raise HeldoutError("this prediction did not come from a HeldoutProgram call: there is no verdict to read")
    return verdict


def _oriented_score(prediction: Any) -> float:
    """The view's score of this prediction times the metric's sign (DSPy maximises it)."""
    verdict = _verdict(prediction)  # first: a prediction of another program gets the clear error
    return prediction.heldout_sign * float(verdict.get("score", 0.0))


def metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """The 3-argument DSPy metric: the view's oriented score of this prediction (already paid for)."""
    return _oriented_score(prediction)


def feedback_metric(gold: Any, pred: Any, trace: Any = None, pred_name: str | None = None,
                    pred_trace: Any = None) -> "dspy.Prediction":
    """The 5-argument metric ``dspy.GEPA`` asks for: the oriented score and policy-filtered feedback."""
    return dspy.Prediction(score=_oriented_score(pred), feedback=feedback_text(_verdict(pred)))


# -- the named methods ------------------------------------------------------------------------------
def _valset(view: TaskView) -> tuple[list, str]:
    return (heldout_examples(view, "val"), "val") if view.val else (heldout_examples(view, "train"), "train")


ProgramFactory = Callable[[], Any]
"""The user's ``FACTORY``: called with no arguments, returns the ``dspy.Module`` to optimise."""


def _student(view: TaskView, bridge: ViewBridge, program: ProgramFactory | None) -> HeldoutProgram | UserProgram:
    """heldout's one-``Predict`` program, or the user's module ``program()`` (an error in the
    factory itself is the user's, reported as such)."""
    if program is None:
        return HeldoutProgram(view, bridge)
    try:
        module = program()
    except Exception as exc:
        raise ProgramFailed(f"the DSPy program factory raised: {type(exc).__name__}: {exc}") from exc
    return UserProgram(view, bridge, module)


def _record(view: TaskView, bridge: ViewBridge, program: HeldoutProgram | UserProgram, settings: Any,
            **data: Any) -> None:
    # DSPy counts a program call as one metric call; the view charges what the verifier costs
    view.record_event(EVENT, worker_lm_calls=len(program.worker.history), bridge_worker_calls=bridge.worker_calls,
                      settings=asdict(settings),
                      refusals=bridge.refusals, program=type(program).__name__, metric_calls_charged=bridge.metric_calls,
                      charged_beyond_dspy_count=bridge.metric_calls - bridge.worker_calls,
                      scores_fed_to_dspy=_orientation(view.metric), **data)
    if bridge.failure is not None:  # DSPy scored the failed calls 0 and went on; the run does not
        raise ProgramFailed(bridge.failure)


def _orientation(metric: Any) -> str:
    return f"{metric.name} as it is ({metric.direction})" if metric.higher_is_better else \
        f"-1 * {metric.name} ({metric.direction}; DSPy maximises)"


@contextlib.contextmanager
def _failures_first(bridge: ViewBridge):
    """An optimizer that trips over the user's failed program (all its later calls refused) ends
    with that program's error, not with the library's complaint about it."""
    try:
        yield
    except Exception as exc:
        if bridge.failure is not None and not isinstance(exc, ProgramFailed):
            raise ProgramFailed(bridge.failure) from exc
        raise


class BudgetSizedMIPRO(dspy.MIPROv2):
    """MIPROv2 whose number of trials is chosen once its few-shot bootstrap has spent what it
    spent: the most trials (up to ``max_trials``) whose :func:`mipro_cost` the remaining budget
    pays for. Everything else is DSPy's own MIPROv2."""

    def __init__(self, *args: Any, view: TaskView, heldout_settings: MIPROSettings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.view, self.heldout_settings = view, heldout_settings
        self.sized_trials: int | None = None
        self.bootstrap_metric_calls: int | None = None
        self.planned_metric_calls: int | None = None
        self._remaining_at_start = view.remaining

    def _optimize_prompt_parameters(self, program, instruction_candidates, demo_candidates, evaluate, valset,
                                    num_trials, minibatch, minibatch_size, minibatch_full_eval_steps, seed):
        self.bootstrap_metric_calls = self._remaining_at_start - self.view.remaining
        sized = dataclasses.replace(self.heldout_settings, minibatch_size=minibatch_size)
        trials = min(num_trials, self.heldout_settings.max_trials)
        while trials > 1 and mipro_cost(len(valset), trials, sized) > self.view.remaining:
            trials -= 1
        self.sized_trials, self.planned_metric_calls = trials, mipro_cost(len(valset), trials, sized)
        return super()._optimize_prompt_parameters(program, instruction_candidates, demo_candidates, evaluate,
                                                   valset, trials, minibatch, minibatch_size,
                                                   minibatch_full_eval_steps, seed)


def program_source(module: Any) -> str:
    """What MIPROv2's program-aware proposer reads (DSPy: the source of the program's class and of
    its sub-modules), as it would read it had the user run the program without heldout: the
    user's own module for :class:`UserProgram`; for :class:`HeldoutProgram`, its one predictor as
    a DSPy user writes it. Never the wrappers' source, which is harness code, not the program."""
    if isinstance(module, UserProgram):
        return dspy_source_code(module.program)
    if isinstance(module, HeldoutProgram):
        fields = ", ".join(module._fields)
        return (f"class Program(dspy.Module):\n    def __init__(self):\n        super().__init__()\n"
                f"        self.predict = dspy.Predict(\"{fields} -> {ANSWER}\")\n\n"
                f"    def forward(self, {fields}):\n"
                f"        return self.predict({', '.join(f'{name}={name}' for name in module._fields)})\n")
    return dspy_source_code(module)


@contextlib.contextmanager
def _proposer_reads_the_program():
    """During a MIPROv2 compile, its program-aware proposer reads :func:`program_source`."""
    saved = grounded_proposer.get_dspy_source_code
    grounded_proposer.get_dspy_source_code = program_source
    try:
        yield
    finally:
        grounded_proposer.get_dspy_source_code = saved


def _demos_in(candidate: Candidate) -> bool:
    return any("Examples:" in str(text) for text in candidate.values())


def optimize_mipro(view: TaskView, seed: int, settings: MIPROSettings = MIPROSettings(),
                   program: ProgramFactory | None = None) -> Candidate:
    passed = settings.passed_to_dspy()  # a contradictory zero_shot is refused before anything runs
    bridge = ViewBridge(view)
    student = _student(view, bridge, program)
    trainset = heldout_examples(view, "train")
    valset, selected_on = _valset(view)
    refuse_below_minimum("dspy-mipro", view.remaining, settings.minimum_metric_calls(len(view.train), len(view.val)),
                         _repeats(view))
    minibatch = min(settings.minibatch_size, len(valset))
    common = dict(metric=metric, prompt_model=architect_lm(view), task_model=student.worker, auto=settings.auto,
                  num_threads=settings.num_threads, max_bootstrapped_demos=passed["max_bootstrapped_demos"],
                  max_labeled_demos=passed["max_labeled_demos"], seed=seed, verbose=False)
    if settings.auto is not None:  # MIPROv2 sizes the run; the view's refusals hold the budget
        teleprompter, trials = dspy.MIPROv2(**common), None
    else:
        teleprompter = BudgetSizedMIPRO(**common, num_candidates=settings.num_candidates, view=view,
                                        heldout_settings=settings)
        trials = settings.max_trials  # DSPy's argument; the budget cuts it after the bootstrap
    view.record_event("final_selection", split=selected_on,
                      how="MIPROv2 keeps the trial program with the best full evaluation on this split")
    with dspy.context(lm=student.worker), _failures_first(bridge), _proposer_reads_the_program():
        best = teleprompter.compile(student, trainset=trainset, valset=valset, num_trials=trials, seed=seed,
                                    minibatch=minibatch < len(valset), minibatch_size=minibatch,
                                    provide_traceback=True,
                                    minibatch_full_eval_steps=settings.minibatch_full_eval_steps,
                                    program_aware_proposer=passed["program_aware_proposer"],
                                    data_aware_proposer=passed["data_aware_proposer"],
                                    tip_aware_proposer=passed["tip_aware_proposer"],
                                    fewshot_aware_proposer=passed["fewshot_aware_proposer"])
    logs = getattr(best, "trial_logs", None) or {}
    believed = max((log.get("total_eval_calls_so_far", 0) for log in logs.values()), default=None)
    final = best.candidate()
    _record(view, bridge, student, settings, outcome="refused" if bridge.refusals else "done",
            passed_to_dspy=passed, trials=getattr(teleprompter, "sized_trials", None),
            bootstrap_metric_calls=getattr(teleprompter, "bootstrap_metric_calls", None),
            mipro_total_eval_calls=believed, planned_metric_calls=getattr(teleprompter, "planned_metric_calls", None),
            final_has_demos=_demos_in(final),
            sized_by="MIPROv2 auto=" + settings.auto if settings.auto else
            "heldout (trials cut until mipro_cost fits what the bootstrap left)")
    return final


def _repeats(view: TaskView) -> int:
    return verifier_repeats(getattr(view, "verifier", None))


def optimize_gepa(view: TaskView, seed: int, settings: DSPyGEPASettings = DSPyGEPASettings(),
                  program: ProgramFactory | None = None) -> Candidate:
    refuse_below_minimum("dspy-gepa", view.remaining, settings.minimum_metric_calls(len(view.train), len(view.val)),
                         _repeats(view))
    bridge = ViewBridge(view)
    student = _student(view, bridge, program)
    trainset = heldout_examples(view, "train")
    valset, selected_on = _valset(view)
    minibatch = min(settings.reflection_minibatch_size, len(trainset))
    fits = max(1, val_size_for_budget(len(valset), minibatch, view.remaining // _repeats(view)))
    sized = {"val_examples": len(valset), "val_examples_used": fits}
    valset = valset[:fits]
    view.record_event("final_selection", split=selected_on,
                      how=f"dspy.GEPA returns its best candidate on the first {fits} examples of this split")
    teleprompter = dspy.GEPA(metric=feedback_metric, max_metric_calls=view.remaining, reflection_lm=architect_lm(view),
                             reflection_minibatch_size=settings.reflection_minibatch_size, use_merge=settings.use_merge,
                             num_threads=settings.num_threads, seed=seed, track_stats=True,
                             # oriented like the metric it is fed; no perfect cost is known to the view
                             failure_score=view.metric.sign * float(view.metric.failure_score or 0.0),
                             skip_perfect_score=view.metric.higher_is_better,
                             gepa_kwargs={"stop_callbacks": [bridge.should_stop]})
    try:
        with dspy.context(lm=student.worker), _failures_first(bridge):
            best = teleprompter.compile(student, trainset=trainset, valset=valset)
    except BudgetExceeded as exc:  # the architect's token budget, outside an evaluation
        _record(view, bridge, student, settings, outcome="budget_exhausted", error=str(exc)[:500], **sized)
        return student.candidate()
    results = getattr(best, "detailed_results", None)
    _record(view, bridge, student, settings, outcome="refused" if bridge.refusals else "done",
            gepa_total_metric_calls=getattr(results, "total_metric_calls", None), **sized)
    return best.candidate()


METHODS = {"mipro": optimize_mipro, "gepa": optimize_gepa}


def main(argv: Sequence[str] | None = None) -> int:
    """Isolated entry point: ``python -m heldout.adapters.dspy mipro|gepa`` under ``--optimizer-cmd``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] not in METHODS:
        print(f"usage: python -m heldout.adapters.dspy {{{'|'.join(METHODS)}}}", file=sys.stderr)
        return 2
    return run_from_env(METHODS[args[0]])


if __name__ == "__main__":
    raise SystemExit(main())
