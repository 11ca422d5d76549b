"""DSPy programs a user brings (``--optimizer NAME=dspy-mipro?program=dspy_programs:FACTORY``),
written against the task's input field (``question`` for BBH)."""

import dspy


def chain_of_thought() -> dspy.Module:
    return dspy.ChainOfThought("question -> answer")


class PlanThenAnswer(dspy.Module):
    """Two predictors: a plan, then the answer from the question and the plan."""

    def __init__(self) -> None:
        super().__init__()
        self.plan = dspy.Predict("question -> plan")
        self.answer = dspy.ChainOfThought("question, plan -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        return self.answer(question=question, plan=self.plan(question=question).plan)


def plan_then_answer() -> dspy.Module:
    return PlanThenAnswer()


class Broken(dspy.Module):
    """Calls its predictor, then fails in its own code."""

    def __init__(self) -> None:
        super().__init__()
        self.predict = dspy.Predict("question -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        self.predict(question=question)
        raise ValueError("the user's module is broken")


def broken() -> dspy.Module:
    return Broken()


def not_a_module() -> str:
    return "question -> answer"
