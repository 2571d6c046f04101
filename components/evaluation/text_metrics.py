"""Answer-level metrics: normalised exact match and chrF.

Exact match compares answers after a light normalisation (Unicode NFKC, case folding, whitespace
collapsed, surrounding whitespace and one trailing full stop removed). Unlike SQuAD's
normalisation it keeps punctuation and articles, because here "-5" and "5" or "3 m" and "3 cm"
are different answers.

chrF (Popović, 2015) is sacrebleu's default `CHRF()` corpus score, reimplemented in 40 lines
rather than pulled into the runtime image: character n-grams of order 1-6, whitespace removed,
recall weighted with beta=2, statistics summed over the corpus, precision and recall averaged over
the orders both sides have (sacrebleu's effective order; a hypothesis n-gram counts only where its
reference has n-grams of that order). tests/test_evaluate_units.py checks it equals sacrebleu's on
a fixed set of pairs. Unlike BLEU it gives partial credit to short answers (numbers, single
words), which is what the evaluation sets hold.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

CHRF_ORDER = 6
CHRF_BETA = 2.0


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"\s+", " ", text).strip()
    return text.removesuffix(".").rstrip()


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Fraction of predictions equal to their reference after `normalize_answer`."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        return 0.0
    hits = sum(
        normalize_answer(p) == normalize_answer(r)
        for p, r in zip(predictions, references, strict=True)
    )
    return hits / len(references)


def _char_ngrams(text: str, n: int) -> Counter[str]:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus-level chrF2 in [0, 100]."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    # Per order: matched n-grams, n-grams in predictions, n-grams in references.
    stats = [[0, 0, 0] for _ in range(CHRF_ORDER)]
    for prediction, reference in zip(predictions, references, strict=True):
        hyp = "".join(prediction.split())
        ref = "".join(reference.split())
        for n in range(1, CHRF_ORDER + 1):
            hyp_ngrams, ref_ngrams = _char_ngrams(hyp, n), _char_ngrams(ref, n)
            if not ref_ngrams:  # sacrebleu: no reference n-grams of this order, no hyp count
                continue
            stats[n - 1][0] += sum((hyp_ngrams & ref_ngrams).values())
            stats[n - 1][1] += sum(hyp_ngrams.values())
            stats[n - 1][2] += sum(ref_ngrams.values())
    # Precision and recall averaged over the orders both sides reach (sacrebleu's effective
    # order), so a 3-character answer is not punished for having no 6-grams.
    precision = recall = 0.0
    effective_order = 0
    for matched, hyp_total, ref_total in stats:
        if hyp_total > 0 and ref_total > 0:
            precision += matched / hyp_total
            recall += matched / ref_total
            effective_order += 1
    if effective_order == 0:
        return 0.0
    precision /= effective_order
    recall /= effective_order
    if precision + recall == 0:
        return 0.0
    beta2 = CHRF_BETA**2
    return 100.0 * (1 + beta2) * precision * recall / (beta2 * precision + recall)
