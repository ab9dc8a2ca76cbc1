"""Classification scores: accuracy, per-label precision/recall/F1, macro-F1, the confusion
matrix, and the majority-class baseline to compare them with.

Macro-F1 averages F1 over the labels that occur in the truth or the predictions (scikit-learn's
default); a label never predicted has precision 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def scores(truth: list[int], predicted: list[int], names: list[str]) -> dict[str, Any]:
    """{"accuracy", "macro_f1", "per_label": {name: precision, recall, f1, support},
    "confusion": rows = true label, columns = predicted, in `names` order}."""
    count = len(names)
    confusion = [[0] * count for _ in range(count)]
    for true, guess in zip(truth, predicted, strict=True):
        confusion[true][guess] += 1
    per_label, f1s = {}, []
    for label, name in enumerate(names):
        hits = confusion[label][label]
        support = sum(confusion[label])
        guessed = sum(row[label] for row in confusion)
        precision, recall = _ratio(hits, guessed), _ratio(hits, support)
        f1 = _ratio(2 * precision * recall, precision + recall) if precision + recall else 0.0
        per_label[name] = {"precision": precision, "recall": recall, "f1": f1,
                           "support": support}
        if support or guessed:
            f1s.append(f1)
    correct = sum(confusion[i][i] for i in range(count))
    return {"examples": len(truth), "accuracy": _ratio(correct, len(truth)),
            "macro_f1": sum(f1s) / len(f1s) if f1s else 0.0, "per_label": per_label,
            "labels": list(names), "confusion": confusion}


def majority_baseline(train: list[int], truth: list[int], names: list[str]) -> dict[str, Any]:
    """The scores of always answering the most frequent training label (lowest id on ties)."""
    counts = Counter(train)
    majority = min(counts, key=lambda label: (-counts[label], label))
    result = scores(truth, [majority] * len(truth), names)
    return {"label": names[majority], "accuracy": result["accuracy"],
            "macro_f1": result["macro_f1"]}
