"""`--task chat`: supervised fine-tuning of a decoder on conversations, rendered by the model's
own chat template with the assistant's tokens marked (runtime/files/conversations.py), the loss
on those tokens only.

One conversation a row, right-padded: no packing, so attention never crosses two
conversations (a causal decoder's padding after a row's last token changes nothing before it,
and carries no loss). Rows are drawn at random each step from a generator that is a pure
function of (seed, step, rank), as every task's batches, so a resumed run sees the same
batches. Held-out rows (--eval FILE or --eval-fraction) are scored by the same loss at each
checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from registry.errors import ZooError
from runtime.files.conversations import ChatRenderer, Conversations, read_conversations
from runtime.files.labelled import held_out
from zoo.training.data import IGNORE, Batch

EVAL_BATCH = 16


@dataclass
class ChatRows:
    ids: list[list[int]]  # each conversation's tokens, cut at the block size plus one
    trained: list[list[bool]]  # per token: an assistant's, so a target of the loss


def encoded(renderer: ChatRenderer, conversations: Conversations, block: int) -> ChatRows:
    """Every conversation as ids and mask, refused where no reply token is left to learn
    within `block` + 1 tokens (the first token is never a target)."""
    rows = ChatRows([], [])
    for row in conversations.rows:
        where = f"{conversations.where}:{row.line}"
        rendered = renderer.render(where, row.messages)
        ids, trained = rendered.ids[:block + 1], rendered.trained[:block + 1]
        if not any(trained[1:]):
            raise ZooError(f"{where}: messages: no assistant token within the first "
                           f"{block + 1} of its {len(rendered.ids)} tokens (raise --block-size)")
        rows.ids.append(ids)
        rows.trained.append(trained)
    return rows


@dataclass
class ChatData:
    train: ChatRows
    eval: ChatRows | None

    @staticmethod
    def read(renderer: ChatRenderer, data: Path, eval_file: Path | None,
             eval_fraction: float | None, seed: int, block: int) -> ChatData:
        if eval_file is not None and eval_fraction is not None:
            raise ZooError("give --eval FILE or --eval-fraction F, not both")
        conversations = read_conversations(data)
        held = read_conversations(eval_file) if eval_file is not None else None
        if eval_fraction is not None:
            chosen = held_out(len(conversations.rows), eval_fraction, seed, conversations.where)
            held = Conversations(conversations.where, [
                row for i, row in enumerate(conversations.rows) if i in chosen])
            conversations = Conversations(conversations.where, [
                row for i, row in enumerate(conversations.rows) if i not in chosen])
        return ChatData(encoded(renderer, conversations, block),
                        encoded(renderer, held, block) if held is not None else None)


def chat_batch(rows: ChatRows, chosen: list[int], pad: int) -> Batch:
    """Next-token prediction on the chosen rows, right-padded; a label only where the token
    predicted is an assistant's."""
    width = max(len(rows.ids[i]) for i in chosen) - 1
    inputs = torch.full((len(chosen), width), pad, dtype=torch.long)
    labels = torch.full((len(chosen), width), IGNORE, dtype=torch.long)
    for row, index in enumerate(chosen):
        ids = torch.tensor(rows.ids[index])
        trained = torch.tensor(rows.trained[index][1:])
        inputs[row, :len(ids) - 1] = ids[:-1]
        labels[row, :len(ids) - 1] = torch.where(trained, ids[1:], IGNORE)
    return Batch({"input_ids": inputs}, labels, sum(len(rows.ids[i]) - 1 for i in chosen))


@torch.no_grad()
def held_out_loss(model: nn.Module, rows: ChatRows, pad: int) -> dict[str, Any]:
    """The mean cross-entropy over every held-out assistant token, dropout off."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(rows.ids), EVAL_BATCH):
        batch = chat_batch(rows, list(range(start, min(start + EVAL_BATCH, len(rows.ids)))),
                           pad)
        logits = model(batch.inputs["input_ids"])[0]
        total += F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                                 ignore_index=IGNORE, reduction="sum").item()
        count += int((batch.labels != IGNORE).sum())
    model.train(was_training)
    return {"loss": total / count, "tokens": count, "examples": len(rows.ids)}
