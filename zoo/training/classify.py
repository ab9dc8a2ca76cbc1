"""`--task classify`: the classifier card made from SOURCE and the labels in the data, the body's
weights carried over, the batches, and the evaluation.

SOURCE may be a card (trained from scratch), a pre-trained folder (mlm or lm) or an imported
one: every tensor whose name and shape the classifier shares is kept, the new head is
initialised from the seed, and what was kept, initialised and dropped is returned for
`init.json`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from registry.catalog import Card
from registry.errors import ZooError
from registry.schema import default_pooling, validate
from runtime.files.labelled import Rows, classes, label_ids, read_rows, split
from runtime.files.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer, sequence_ids
from runtime.scores import majority_baseline, scores
from zoo.assemble import build_model

EVAL_BATCH = 64
INIT_RECORD = "init.json"
EVAL_RECORD = "eval.json"


def classifier_card(card: Card, data: Path) -> Card:
    """`card` as a classifier for the labels in `data`: num_labels, labels, a pooling (the
    card's, else the family's default) and no MLM head (whose output is also `logits`)."""
    names, count = classes(read_rows(data), card["labels"], card["num_labels"])
    changes = {"num_labels": count, "labels": names,
               "pooling": card["pooling"] or default_pooling(card.fields), "mlm_head": False}
    fields = validate({**card.fields, **changes}, f"{card.name} (--task classify)")
    origins = {**card.origins, **{key: "--task classify" for key in changes}}
    return Card(card.name, card.path, fields, origins)


def carry_weights(source: nn.Module, target: nn.Module) -> dict[str, list[str]]:
    """Copy every tensor `target` shares (name and shape) with `source` into it."""
    theirs, ours = source.state_dict(), target.state_dict()
    kept = [name for name, tensor in ours.items()
            if name in theirs and theirs[name].shape == tensor.shape]
    target.load_state_dict({**ours, **{name: theirs[name] for name in kept}})
    return {"kept": kept, "initialised": [name for name in ours if name not in kept],
            "dropped": [name for name in theirs if name not in ours]}


def prepare_classifier(model: nn.Module, card: Card, data: Path, seed: int, source: str
                       ) -> tuple[nn.Module, Card, dict[str, Any]]:
    """(the classifier, its card, the init record) for training on `data`."""
    new_card = classifier_card(card, data)
    classifier = build_model(new_card, seed=seed)
    record = carry_weights(model, classifier)
    origin = "a folder (its weights)" if Path(source).is_dir() else "a card (seeded weights)"
    return classifier, new_card, {"source": source, "source_is": origin, "from_card": card.name,
                                  **record}


def text_tokenizer(folder: Path | None) -> Tokenizer:
    """The source folder's tokenizer (an imported model's tokenizer.json), else bytes."""
    found = load_tokenizer(folder) if folder is not None and folder.is_dir() else None
    return found or ByteTokenizer()


@dataclass
class Split:
    ids: list[list[int]]
    labels: list[int]


@dataclass
class ClassifyData:
    train: Split
    eval: Split | None
    names: list[str]  # for the scores: the card's labels, else the ids as text

    @staticmethod
    def read(card: Card, tokenizer: Tokenizer, data: Path, eval_file: Path | None,
             eval_fraction: float | None, seed: int, block: int) -> ClassifyData:
        if eval_file is not None and eval_fraction is not None:
            raise ZooError("give --eval FILE or --eval-fraction F, not both")
        rows = read_rows(data)
        held: Rows | None = read_rows(eval_file) if eval_file is not None else None
        if eval_fraction is not None:
            rows, held = split(rows, eval_fraction, seed)

        def encoded(part: Rows) -> Split:
            labels = label_ids(part, card["labels"], card["num_labels"])
            ids = [sequence_ids(tokenizer, example.text)[:block] for example in part.examples]
            for example, tokens in zip(part.examples, ids, strict=True):
                if not tokens:
                    raise ZooError(f"{part.where}:{example.line}: the text has no tokens")
            return Split(ids, labels)

        names = card["labels"] or [str(i) for i in range(card["num_labels"])]
        return ClassifyData(encoded(rows), encoded(held) if held else None, names)


def padded(sequences: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (ids, mask) for a batch."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    return ids, mask


@torch.no_grad()
def predict(model: nn.Module, sequences: list[list[int]], pad: int) -> list[int]:
    """Each sequence's most likely class, in batches, with dropout off."""
    was_training = model.training
    model.eval()
    found: list[int] = []
    for start in range(0, len(sequences), EVAL_BATCH):
        ids, mask = padded(sequences[start:start + EVAL_BATCH], pad)
        found += model(ids, mask)["logits"].argmax(dim=-1).tolist()
    model.train(was_training)
    return found


def evaluate(model: nn.Module, data: ClassifyData, pad: int) -> dict[str, Any]:
    """eval.json's content: the scores on the held-out rows and the majority baseline's."""
    assert data.eval is not None
    predicted = predict(model, data.eval.ids, pad)
    return {**scores(data.eval.labels, predicted, data.names),
            "majority_baseline": majority_baseline(data.train.labels, data.eval.labels,
                                                   data.names)}
