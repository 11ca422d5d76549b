"""Answer extraction and scoring for the dataset benchmarks, as named, composable parts.

* :mod:`.text`      sanitising, folding, anchored answer cues, run-on cuts, the output cap;
* :mod:`.pipeline`  :class:`Grammar`, the registered stages and the modes built from them;
* :mod:`.formats`   one grammar per answer format (letters, numbers, words, word lists, brackets,
                    spans), registered in :data:`FORMATS`;
* :mod:`.reference` the ``published`` mode: each family's reference rule, reproduced exactly, in
                    linear time (HotpotQA's, whose official script extracts nothing, is
                    :func:`.scoring.hotpot_prediction`);
* :mod:`.scoring`   the per-family scorers (``score_bbh``, ``score_choice``, ``score_number``,
                    ``score_span``) that report every mode side by side;
* :mod:`.code`      MBPP+ code extraction (evalplus's sanitizer when installed, an equivalent
                    otherwise).

Pure functions: no I/O, no model calls. See docs/scoring.md for the modes and the headline."""

from heldout.benchmarks.extraction.formats import FORMATS, choice_options, normalize_word_list, register_format
from heldout.benchmarks.extraction.pipeline import (
    EXTRACTION_MODES,
    HEADLINE_MODE,
    MODES,
    STAGES,
    Grammar,
    Reading,
    read,
    stage,
)
from heldout.benchmarks.extraction.scoring import (
    BBH_FORMATS,
    BBH_TASK_FORMATS,
    TokenScores,
    bbh_format_of,
    exact_match,
    extract_bbh,
    extract_choice_letter,
    extract_number,
    extract_span,
    normalize_answer,
    numbers_match,
    pal_text_reading,
    score_bbh,
    score_choice,
    score_number,
    score_span,
    token_f1,
    token_scores,
)
from heldout.benchmarks.extraction.text import MAX_OUTPUT_CHARS, QUESTION_MARKERS, sanitize_text

__all__ = [
    "BBH_FORMATS", "BBH_TASK_FORMATS", "EXTRACTION_MODES", "FORMATS", "Grammar", "HEADLINE_MODE",
    "MAX_OUTPUT_CHARS", "MODES", "QUESTION_MARKERS", "Reading", "STAGES", "TokenScores", "bbh_format_of",
    "choice_options", "exact_match", "extract_bbh", "extract_choice_letter", "extract_number", "extract_span",
    "normalize_answer", "normalize_word_list", "numbers_match", "pal_text_reading", "read", "register_format",
    "sanitize_text",
    "score_bbh", "score_choice", "score_number", "score_span", "stage", "token_f1", "token_scores",
]
