"""The word-reversal demo (issue #12): batches hold the shipped text's words and their reverse,
held-out inputs come from text the training never draws from, and `zoo evaluate` scores an
export by exact match."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from click.testing import CliRunner

from cli import main
from runtime.exact_match import exact_match
from tests.conftest import card
from zoo.training import reverse

VOCAB = card("transformer-tiny")["vocab_size"]


def test_vocabulary_is_the_most_frequent_words() -> None:
    words = re.findall(r"[a-z]+", reverse.SHIPPED_TEXT.read_text(encoding="utf-8").lower())
    top = [w for w, _ in Counter(words).most_common(VOCAB - 3)]
    tokenizer = reverse.vocabulary(VOCAB)
    assert set(tokenizer.words) <= set(Counter(words)) and len(tokenizer.words) == VOCAB - 3
    assert set(tokenizer.words[:20]) == set(top[:20])  # ties aside, the same most frequent
    assert tokenizer.decode(tokenizer.encode("the king")) == "the king"


def test_batches_pair_each_run_with_its_reverse() -> None:
    inputs, labels = reverse.reverse_batch(VOCAB, 16, 1, 2, 0, torch.Generator().manual_seed(3))
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    decoder = inputs["decoder_input_ids"].numpy()
    for row in range(16):
        n = int(mask[row].sum())
        assert reverse.SHORTEST <= n <= reverse.LONGEST and mask[row, :n].all()
        words = ids[row, :n]
        np.testing.assert_array_equal(labels[row, :n].numpy(), words[::-1])
        assert labels[row, n] == 2 and (labels[row, n + 1:] == -100).all()  # eos, then ignored
        np.testing.assert_array_equal(decoder[row, : n + 1], [1, *words[::-1]])
        assert (ids[row, n:] == 0).all()


def test_held_out_runs_come_from_the_last_tenth() -> None:
    train_ids, held_ids = reverse.stream(VOCAB)
    pairs = reverse.held_out(VOCAB, 50)
    joined = [w for source, _ in pairs for w in source]
    assert joined == held_ids[: len(joined)].tolist()
    assert len(held_ids) < len(train_ids) / 8
    assert all(target == source[::-1] for source, target in pairs)


class CardOnly:
    card = card("transformer-tiny")


def test_exact_match_counts_whole_outputs(monkeypatch) -> None:
    pairs = reverse.held_out(VOCAB, 6)
    outputs = [target for _, target in pairs]
    outputs[4] = outputs[4][:-1]  # one row stops a word early
    eos = card("transformer-tiny")["eos_token_id"]

    def fake_generate(engine, ids, mask, new_tokens, sampling, eos_id):  # noqa: ANN001
        assert eos_id == eos and new_tokens == reverse.LONGEST + 1
        rows = [out + [eos] * (new_tokens - len(out)) for out in outputs]
        return np.array(rows)

    monkeypatch.setattr("runtime.exact_match.generate", fake_generate)
    result = exact_match(CardOnly(), pairs)
    assert (result.correct, result.total) == (5, 6)


def test_train_export_evaluate_end_to_end(tmp_path: Path) -> None:
    """A few steps only (fast): the files and the command line work; accuracy is the demo's."""
    runner = CliRunner()
    built, trained, exported = tmp_path / "b", tmp_path / "t", tmp_path / "e"
    for args in (["build", "transformer-tiny", "-o", str(built)],
                 ["train", str(built), "--task", "reverse", "--steps", "20", "-o", str(trained)],
                 ["export", str(trained), "--onnx", "-o", str(exported)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, result.output
    assert (exported / "word-tokenizer.json").is_file()
    result = runner.invoke(main, ["evaluate", str(exported), "--task", "reverse", "--count", "20"])
    assert result.exit_code == 0, result.output
    assert re.search(r"exact match: \d+/20 = ", result.output)
    result = runner.invoke(main, ["run", str(exported), "--text", "the king is"])
    assert result.exit_code == 0 and result.output.count("\n") == 1
