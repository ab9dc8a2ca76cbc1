"""`zoo embed` and `zoo classify`: every row of a text file through an export with a sentence
vector, written in row order to one file (vectors as .npy; labels and probabilities as JSONL).
Rows are tokenized as `zoo run` and the Python API tokenize a text, so a row's result is the
one `Exported.embed` / `classify` gives it alone."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from export.api import Exported, load
from export.runtime.classify import label_names
from export.runtime.corpus import CorpusOutputs, run_corpus, token_budget
from export.runtime.prompts import check_ids
from registry.errors import ZooError
from registry.paths import display_path
from zoo.files.atomic import atomic_write_bytes, check_writable, refuse_existing
from zoo.files.texts import read_texts
from zoo.files.tokenizer import sequence_ids

# (rows done, rows in all, rows per second so far)
RowsProgress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class CorpusRequest:
    folder: Path
    data: Path
    out: Path
    column: str = "text"
    truncate: bool = False  # cut rows past max_positions instead of refusing them
    force: bool = False
    provider: str = "cpu"
    threads: int | None = None


def embed_command(request: CorpusRequest, progress: RowsProgress = lambda *a: None
                  ) -> list[str]:
    exported, result = _run(request, progress, classifier=False)
    buffer = io.BytesIO()
    np.save(buffer, result.embeddings, allow_pickle=False)
    atomic_write_bytes(request.out, buffer.getvalue())
    rows, width = result.embeddings.shape
    return [f"wrote {request.out} ({rows} x {width} float32 sentence vectors, row order)"]


def classify_command(request: CorpusRequest, progress: RowsProgress = lambda *a: None
                     ) -> list[str]:
    exported, result = _run(request, progress, classifier=True)
    assert result.probabilities is not None
    names = label_names(exported.card)
    lines = []
    for row in result.probabilities:
        best = int(np.argmax(row))  # first maximum on ties, as `zoo evaluate`
        lines.append(json.dumps({"label": names[best], "probabilities": dict(
            zip(names, (round(float(p), 7) for p in row), strict=True))}))
    atomic_write_bytes(request.out, ("\n".join(lines) + "\n").encode("utf-8"))
    return [f"wrote {request.out} ({len(lines)} rows: label and probabilities, row order)"]


def _run(request: CorpusRequest, progress: RowsProgress, classifier: bool
         ) -> tuple[Exported, CorpusOutputs]:
    refuse_existing(request.out, request.force)  # before minutes of work
    check_writable(request.out)
    exported = load(request.folder, request.provider, request.threads)
    card, where = exported.card, display_path(request.folder)
    if card["pooling"] is None:
        raise ZooError(f"{where}: this export has no sentence vector (its card sets no pooling)")
    if classifier and not card["num_labels"]:
        raise ZooError(f"{where}: not a classifier (num_labels is 0); `zoo embed` writes its "
                       "vectors")
    if exported.tokenizer is None:
        raise ZooError(f"{where}: this export has no tokenizer to read the texts with")
    prompts = _tokenized(exported, request)
    start = time.perf_counter()

    def done(rows: int) -> None:
        progress(rows, len(prompts), rows / max(time.perf_counter() - start, 1e-9))

    return exported, run_corpus(exported.runtime, prompts, token_budget(request.threads), done)


def _tokenized(exported: Exported, request: CorpusRequest) -> list[list[int]]:
    """Each row's ids (with the tokenizer's special tokens, as `zoo run` reads a text); a row
    with no tokens, or past max_positions without --truncate, is an error at its line."""
    assert exported.tokenizer is not None
    where, limit = display_path(request.data), exported.card["max_positions"]
    prompts = []
    for row in read_texts(request.data, request.column):
        ids = sequence_ids(exported.tokenizer, row.text)
        if not ids:
            raise ZooError(f"{where}:{row.line}: the text has no tokens")
        if len(ids) > limit:
            if not request.truncate:
                raise ZooError(f"{where}:{row.line}: {len(ids)} tokens, past max_positions="
                               f"{limit} (--truncate cuts such rows to fit)")
            ids = ids[:limit]
        prompts.append(ids)
    check_ids(exported.card, prompts, where)  # every id in the vocabulary
    return prompts
