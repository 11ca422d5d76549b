"""The folders and result files the protocols write inside a study, named in one place: each
protocol writes under its own, and a report reads them to tell a protocol's folder from a run's
without importing the protocols (and the statistics libraries they need)."""

GENERALISATION_DIR = "protocol"  # protocol generalisation's folder
LEAK_ABLATION_DIR = "ablation"  # leak ablate's sessions
LEAK_RESULT_FILE = "ablation.json"  # ... and its result
RECIPE_DIR = "recipe"  # recipe baseline's sessions
VERIFIER_ABLATION_DIR = "verifier_ablation"  # compare verifiers' sessions
VERIFIER_RESULT_FILE = "verifier_ablation.json"  # ... and its result

__all__ = ["GENERALISATION_DIR", "LEAK_ABLATION_DIR", "LEAK_RESULT_FILE", "RECIPE_DIR", "VERIFIER_ABLATION_DIR",
           "VERIFIER_RESULT_FILE"]
