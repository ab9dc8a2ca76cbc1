"""`zoo embed` and `zoo classify`: every row of a text file through an export with a sentence
vector, written in row order to one file (vectors as .npy; labels and probabilities as JSONL).
Rows are tokenized as `zoo run` and the Python API tokenize a text, so a row's result is the
one `Exported.embed` / `classify` gives it alone.

`--against REFERENCE` runs a second export (the fp32 one, say) over the same rows first and
prints both side by side: rows/s, and the candidate's vectors' cosine to the reference's; for a
classifier also the same label and the largest change of a probability, and with
`--label-column` each one's accuracy against the rows' labels."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from registry.errors import ZooError
from registry.options import option
from registry.paths import display_path
from runtime.classify import cosines, label_names
from runtime.corpus import CorpusOutputs, run_corpus, token_budget
from runtime.exported import Exported, load
from runtime.files.atomic import output_file, write_file
from runtime.files.images import image_files
from runtime.files.labelled import Example, Rows, label_ids
from runtime.files.texts import TextRow, read_labels, read_texts
from runtime.files.tokenizer import sequence_ids
from runtime.prompts import check_ids
from runtime.sessions import PROVIDERS

IMAGE_BATCH = 32  # images decoded and run at once (CLIP-B at 224 pixels: 19 MB of pixels)
# (rows done, rows in all, rows per second so far)
RowsProgress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class CorpusRequest:
    folder: Path
    out: Path = option(help="The file to write (embed: .npy; classify: JSONL).",
                       flags=("-o", "--out"), path="file")
    data: Path | None = option(None, "One text a line, or .jsonl / .csv with a text column.",
                               path="file")
    images: Path | None = option(  # a dual encoder's images, in its texts' space
        None, "A folder of image files (a CLIP or SigLIP export): each image's vector, in "
        "file-name order, in the space of its texts' (--data) vectors.", path="dir")
    column: str = option("text", "The JSONL field or CSV column holding the text.")
    truncate: bool = option(False, "Cut rows past max_positions instead of refusing them.")
    force: bool = option(False, "Overwrite an existing output file.")
    provider: str = option("cpu", "ONNX Runtime's execution provider.", choices=PROVIDERS)
    threads: int | None = option(None, "ONNX Runtime CPU threads [all cores].")
    against: Path | None = option(  # a reference export run over the same rows, side by side
        None, "Run this export over the rows too (first), and print the two side by side: "
        "rows/s, cosine, labels.", metavar="REFERENCE")
    label_column: str | None = option(  # classify: the rows' true labels, to score accuracy
        None, "The JSONL field or CSV column holding each row's true label: print the "
        "accuracy (of --against's export too).", metavar="COLUMN")


@dataclass
class Run:
    """One export over the rows: what it gave and how long the batches took."""

    exported: Exported
    result: CorpusOutputs
    seconds: float
    expected: list[int] | None  # the rows' class ids, where the labels were given

    @property
    def rows_per_second(self) -> float:
        return len(self.result.embeddings) / max(self.seconds, 1e-9)


def embed_command(request: CorpusRequest, progress: RowsProgress = lambda *a: None
                  ) -> list[str]:
    if request.label_column is not None:
        raise ZooError("--label-column scores a classifier: it is an option of `zoo classify`")
    if (request.data is None) == (request.images is None):
        raise ZooError("give the texts with --data FILE or the images with --images DIR "
                       "(one of them)")
    if request.images is not None:
        return _embed_images(request, progress)
    with output_file(request.out, request.force):
        reference, run = _runs(request, progress, None)
        buffer = io.BytesIO()
        np.save(buffer, run.result.embeddings, allow_pickle=False)
        write_file(request.out, buffer.getvalue(), request.force)
    rows, width = run.result.embeddings.shape
    return [f"wrote {request.out} ({rows} x {width} float32 sentence vectors, row order; "
            f"{run.rows_per_second:.1f} rows/s)"] + _side_by_side(request, reference, run, None)


def classify_command(request: CorpusRequest, progress: RowsProgress = lambda *a: None
                     ) -> list[str]:
    if request.data is None:
        raise ZooError("give the rows with --data FILE")
    with output_file(request.out, request.force):
        truth = _truth(request) if request.label_column is not None else None
        reference, run = _runs(request, progress, truth, classifier=True)
        lines = _labelled(run)
        write_file(request.out, ("\n".join(lines) + "\n").encode("utf-8"), request.force)
    return [f"wrote {request.out} ({len(lines)} rows: label and probabilities, row order; "
            f"{run.rows_per_second:.1f} rows/s)"] + _side_by_side(request, reference, run, truth)


def _embed_images(request: CorpusRequest, progress: RowsProgress) -> list[str]:
    """A folder's images (in file-name order) to a dual encoder's unit vectors, IMAGE_BATCH a
    batch; --against and --truncate are the texts' options."""
    assert request.images is not None
    if request.against is not None or request.truncate:
        raise ZooError("--against and --truncate are for texts (--data), not --images")
    with output_file(request.out, request.force):
        paths = image_files(request.images)  # refused before the export is opened
        exported = load(request.folder, request.provider, request.threads)
        if not exported.runtime.spec.joint_space:
            raise ZooError(f"{display_path(request.folder)}: --images needs a dual encoder's "
                           "export (CLIP, SigLIP), whose images and texts share a space")
        start, vectors = time.perf_counter(), []
        for first in range(0, len(paths), IMAGE_BATCH):
            vectors.append(exported.images(paths[first:first + IMAGE_BATCH]).embeddings)
            done = first + len(vectors[-1])
            progress(done, len(paths), done / max(time.perf_counter() - start, 1e-9))
        embeddings = np.concatenate(vectors)
        buffer = io.BytesIO()
        np.save(buffer, embeddings, allow_pickle=False)
        write_file(request.out, buffer.getvalue(), request.force)
    rate = len(paths) / max(time.perf_counter() - start, 1e-9)
    return [f"wrote {request.out} ({len(paths)} x {embeddings.shape[1]} float32 image vectors, "
            f"file-name order; {rate:.1f} images/s)"]


def _labelled(run: Run) -> list[str]:
    """A JSONL line a row: its label and every class's probability."""
    assert run.result.probabilities is not None
    names = label_names(run.exported.card)
    lines = []
    for row in run.result.probabilities:
        best = int(np.argmax(row))  # first maximum on ties, as `zoo evaluate`
        lines.append(json.dumps({"label": names[best], "probabilities": dict(
            zip(names, (round(float(p), 7) for p in row), strict=True))}))
    return lines


def _runs(request: CorpusRequest, progress: RowsProgress, truth: Rows | None,
          classifier: bool = False) -> tuple[Run | None, Run]:
    """(the reference's run or None, the export's run): both exports opened and compared
    before either runs the rows, the reference run first."""
    exported = _opened(request, classifier)
    if request.against is None:
        return None, _run(exported, request, progress, truth)
    against = replace(request, folder=request.against)
    reference = _opened(against, classifier)
    _check_comparable(reference, exported, request, classifier)
    return (_run(reference, against, progress, truth),
            _run(exported, request, progress, truth))


def _opened(request: CorpusRequest, classifier: bool) -> Exported:
    """The export, refused in one line where it cannot do the command's work."""
    exported = load(request.folder, request.provider, request.threads)
    card, where = exported.card, display_path(request.folder)
    if card["pooling"] is None:
        raise ZooError(f"{where}: this export has no sentence vector (its card sets no pooling)")
    if classifier and not card["num_labels"]:
        raise ZooError(f"{where}: not a classifier (num_labels is 0); `zoo embed` writes its "
                       "vectors")
    if exported.tokenizer is None:
        raise ZooError(f"{where}: this export has no tokenizer to read the texts with")
    return exported


def _check_comparable(reference: Exported, exported: Exported, request: CorpusRequest,
                      classifier: bool) -> None:
    """--against a model whose vectors or classes are not the export's: one line, before
    either runs the rows."""
    assert request.against is not None
    against, where = display_path(request.against), display_path(request.folder)
    widths = reference.card["d_model"], exported.card["d_model"]
    if widths[0] != widths[1]:
        raise ZooError(f"{against}: its sentence vectors have {widths[0]} values, "
                       f"{where}'s {widths[1]}: they cannot be compared")
    if classifier and label_names(reference.card) != label_names(exported.card):
        raise ZooError(f"{against}: its classes {label_names(reference.card)} are not "
                       f"{where}'s {label_names(exported.card)}")


def _run(exported: Exported, request: CorpusRequest, progress: RowsProgress,
         truth: Rows | None) -> Run:
    card = exported.card
    # the labels checked against the classes before the rows are run
    expected = None if truth is None else label_ids(truth, card["labels"], card["num_labels"])
    prompts = _tokenized(exported, request)
    start = time.perf_counter()

    def done(rows: int) -> None:
        progress(rows, len(prompts), rows / max(time.perf_counter() - start, 1e-9))

    result = run_corpus(exported.runtime, prompts, token_budget(request.threads), done)
    return Run(exported, result, time.perf_counter() - start, expected)


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


def _truth(request: CorpusRequest) -> Rows:
    """The rows' labels (read before any model work, so a bad label stops the command early)."""
    assert request.label_column is not None
    texts = read_texts(request.data, request.column)
    labels: list[TextRow] = read_labels(request.data, request.label_column)
    return Rows(display_path(request.data), [Example(text.text, label.text, label.line)
                                             for text, label in zip(texts, labels, strict=True)])


def _accuracy(run: Run) -> str:
    assert run.result.probabilities is not None and run.expected is not None
    right = int((run.result.probabilities.argmax(-1) == np.array(run.expected)).sum())
    return f"{right / len(run.expected):.3f} ({right}/{len(run.expected)})"


def _side_by_side(request: CorpusRequest, reference: Run | None, run: Run,
                  truth: Rows | None) -> list[str]:
    """The table of the runs (the reference first), then how far the export is from it."""
    if reference is None and truth is None:
        return []
    runs = [(reference, " (reference)")] if reference is not None else []
    runs.append((run, ""))
    names = [display_path(r.exported.folder) + suffix for r, suffix in runs if r is not None]
    width = max(len(name) for name in names + ["export"])
    header = f"{'export':<{width}}  {'rows/s':>8}" + ("  accuracy" if truth else "")
    lines = [header]
    for name, (each, _) in zip(names, runs, strict=True):
        assert each is not None
        score = f"  {_accuracy(each)}" if truth is not None else ""
        lines.append(f"{name:<{width}}  {each.rows_per_second:>8.1f}{score}")
    if reference is None:
        return lines
    cos = cosines(reference.result.embeddings, run.result.embeddings)
    versus = (f"{display_path(request.folder)} against {display_path(reference.exported.folder)}"
              f" on {len(cos)} rows: sentence-vector cosine min {cos.min():.5f}, "
              f"mean {cos.mean():.5f}")
    p, q = reference.result.probabilities, run.result.probabilities
    if p is not None and q is not None:
        same = int((p.argmax(-1) == q.argmax(-1)).sum())
        versus += (f"; the same label on {same} of {len(p)}; max probability change "
                   f"{np.abs(p - q).max():.5f}")
    return lines + [versus]
