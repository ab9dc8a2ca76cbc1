"""`zoo train --task classify` (issue #11): bad data as one line naming file and line, the
scores against hand-computed values, the body's weights carried over, exact resume, and a
short run whose eval.json matches the saved model's own predictions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from runtime.scores import majority_baseline, scores
from tests.conftest import card
from tests.support.helpers import assert_error_after_progress, assert_one_line_error, zoo, zoo_ok
from zoo.assemble import build_model
from zoo.files.weights import load_built, save_built
from zoo.training.checkpoints import latest_checkpoint
from zoo.training.classify import prepare_classifier
from zoo.training.train import TrainOptions, train


def toy_rows(count: int, seed: int = 0) -> list[dict]:
    """Two classes a byte model tells apart at once: vowels against digits."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(["vowel", "digit"])
        letters = "aeiou" if label == "vowel" else "0123456789"
        rows.append({"text": "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))),
                     "label": label})
    return rows


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


GOOD = '{"text": "aa", "label": "x"}\n{"text": "11", "label": "y"}\n'


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "data.jsonl: data file is empty"),
    (b"\n \n", "data.jsonl: data file is empty"),
    (GOOD.encode() + b'{"label": "x"}\n', "data.jsonl:3: expected a non-empty 'text'"),
    (GOOD.encode() + b'{"text": "", "label": "x"}\n', "data.jsonl:3: expected a non-empty"),
    (GOOD.encode() + b'{"text": "ab"}\n', "data.jsonl:3: expected a 'label'"),
    (GOOD.encode() + b'{"text": "ab", "label": true}\n', "data.jsonl:3: expected a 'label'"),
    (GOOD.encode() + b'{"text": "ab", "label": "x"\n', "data.jsonl:3: not a JSON object"),
    (b'{"text": "aa", "label": "x"}\n{"text": "bb", "label": "x"}\n', "only one label ('x')"),
    (GOOD.encode() + b'{"text": "a\xff", "label": "x"}\n', "data.jsonl:3: not UTF-8 text"),
])
def test_bad_jsonl_is_one_line_and_writes_nothing(tmp_path: Path, content: bytes,
                                                  expected: str) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(content)
    assert_one_line_error(zoo("train", "bert-tiny", "--task", "classify", "--data", data,
                              "-o", tmp_path / "out"), expected)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("content", "expected"), [
    ("words,class\nab,x\n", "data.csv:1: the CSV header ['words', 'class'] should name"),
    ("text,label\nab,x\ncd\n", "data.csv:3: 1 columns, the header has 2"),
    ("text,label\nab,x\n,y\n", "data.csv:3: expected a non-empty 'text'"),
    ("text,label\nab,x\ncd,\n", "data.csv:3: expected a 'label'"),
])
def test_bad_csv_is_one_line(tmp_path: Path, content: str, expected: str) -> None:
    data = tmp_path / "data.csv"
    data.write_text(content, encoding="utf-8")
    assert_one_line_error(zoo("train", "gpt-tiny", "--task", "classify", "--data", data,
                              "-o", tmp_path / "out"), expected)


def test_unknown_label_in_the_eval_file_names_its_line(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "train.jsonl", toy_rows(20))
    held = jsonl(tmp_path / "eval.jsonl", [{"text": "ae", "label": "vowel"},
                                           {"text": "zz", "label": "letter"}])
    assert_error_after_progress(zoo("train", "bert-tiny", "--task", "classify", "--data", data,
                                    "--eval", held, "--steps", "1", "-o", tmp_path / "out"),
                                "eval.jsonl:2: label 'letter' is not one of the classes (digit, "
                                "vowel)")
    assert not (tmp_path / "out").exists()


def test_scores_against_hand_computed_values() -> None:
    # truth 0 0 1 1 2 / predicted 0 1 1 1 0: confusion [[1,1,0],[0,2,0],[1,0,0]]
    got = scores([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], ["a", "b", "c"])
    assert got["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert got["accuracy"] == pytest.approx(3 / 5)
    a, b, c = (got["per_label"][name] for name in "abc")
    assert (a["precision"], a["recall"]) == (pytest.approx(1 / 2), pytest.approx(1 / 2))
    assert (b["precision"], b["recall"]) == (pytest.approx(2 / 3), pytest.approx(1.0))
    assert (c["precision"], c["recall"], c["support"]) == (0.0, 0.0, 1)
    f1_b = 2 * (2 / 3) * 1 / (2 / 3 + 1)
    assert got["macro_f1"] == pytest.approx((0.5 + f1_b + 0.0) / 3)
    baseline = majority_baseline([1, 1, 0], [0, 0, 1, 1, 2], ["a", "b", "c"])
    # always "b": accuracy 2/5; F1 of b = 2 * 0.4 * 1 / 1.4, the others 0, averaged over 3
    assert baseline == {"label": "b", "accuracy": pytest.approx(0.4),
                        "macro_f1": pytest.approx(2 * 0.4 / 1.4 / 3)}


def test_body_weights_are_kept_and_the_head_is_new(tmp_path: Path) -> None:
    """From an mlm model: every body tensor equal to the source's, the MLM head dropped."""
    source_card = card("bert-tiny")
    source = build_model(source_card, seed=7)
    save_built(source, source_card, tmp_path / "mlm")
    data = jsonl(tmp_path / "d.jsonl", toy_rows(10))
    loaded, loaded_card = load_built(tmp_path / "mlm")
    model, new_card, record = prepare_classifier(loaded, loaded_card, data, 1,
                                                 str(tmp_path / "mlm"))
    assert (new_card["num_labels"], new_card["labels"]) == (2, ["digit", "vowel"])
    assert (new_card["pooling"], new_card["mlm_head"]) == ("pooler", False)
    theirs, ours = source.state_dict(), model.state_dict()
    assert sorted(record["initialised"]) == ["classifier.linear.bias", "classifier.linear.weight"]
    assert record["dropped"] and all(n.startswith("mlm_head.") for n in record["dropped"])
    for name in record["kept"]:
        assert torch.equal(ours[name], theirs[name]), name
    assert len(record["kept"]) == len(theirs) - len(record["dropped"])


def options(out: Path, data: Path, **changes: object) -> TrainOptions:
    base = {"task": "classify", "out": out, "data": data, "steps": 12, "batch_size": 8,
            "checkpoint_every": 6, "lr": 3e-3, "warmup": 2, "eval_fraction": 0.25}
    return TrainOptions(**{**base, **changes})


class Interrupt(Exception):
    pass


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "d.jsonl", toy_rows(40))
    tiny = card("gpt-tiny")

    def fresh() -> tuple:
        return prepare_classifier(build_model(tiny, seed=3), tiny, data, 3, "gpt-tiny")[:2]

    model, classifier = fresh()
    whole = train(model, classifier, options(tmp_path / "whole", data))

    def stop_after_8(step: int, *rest: float) -> None:
        if step >= 8:
            raise Interrupt  # between checkpoints: the last one is step 6

    model, classifier = fresh()
    with pytest.raises(Interrupt):
        train(model, classifier, options(tmp_path / "cut", data), stop_after_8, log_every=1)
    assert latest_checkpoint(tmp_path / "cut").step == 6
    model, classifier = fresh()
    resumed = train(model, classifier, options(tmp_path / "cut", data, resume=True))
    assert resumed["losses"] == pytest.approx(whole["losses"], abs=1e-5)
    a, _ = load_built(tmp_path / "whole")
    b, _ = load_built(tmp_path / "cut")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=0, msg=name)
    assert (json.loads((tmp_path / "cut" / "eval.json").read_text())
            == json.loads((tmp_path / "whole" / "eval.json").read_text()))


def test_a_short_run_learns_and_eval_json_agrees_with_the_model(tmp_path: Path) -> None:
    """eval.json's accuracy and confusion, recomputed from the saved model's own argmax."""
    train_file = jsonl(tmp_path / "train.jsonl", toy_rows(64, seed=1))
    held_rows = toy_rows(24, seed=2)
    held = jsonl(tmp_path / "eval.jsonl", held_rows)
    output = zoo_ok("train", "bert-tiny", "--task", "classify", "--data", str(train_file),
                    "--eval", str(held), "--steps", "30", "--batch-size", "16",
                    "--lr", "3e-3", "--warmup", "5", "--checkpoint-every", "15",
                    "-o", str(tmp_path / "out"))
    assert "eval at step 15" in output and "eval at step 30" in output
    result = json.loads((tmp_path / "out" / "eval.json").read_text())
    model, trained = load_built(tmp_path / "out")
    names = trained["labels"]
    truth = [names.index(row["label"]) for row in held_rows]
    predicted = []
    with torch.no_grad():
        for row in held_rows:
            ids = torch.tensor([list(row["text"].encode())])
            predicted.append(int(model(ids, torch.ones_like(ids))["logits"].argmax()))
    confusion = [[sum(1 for t, p in zip(truth, predicted, strict=True) if (t, p) == (i, j))
                  for j in range(2)] for i in range(2)]
    assert result["confusion"] == confusion
    assert result["accuracy"] == pytest.approx(sum(t == p for t, p in zip(
        truth, predicted, strict=True)) / len(truth))
    assert result["accuracy"] > result["majority_baseline"]["accuracy"] + 0.2
    record = json.loads((tmp_path / "out" / "init.json").read_text())
    assert record["source_is"].startswith("a card")
    assert (tmp_path / "out" / "byte-tokenizer.json").is_file()


def test_evaluation_predicts_each_row_as_if_alone() -> None:
    """Batched, right-padded predictions equal each text's argmax computed unpadded."""
    from zoo.training.classify import predict

    classifier = card("bert-tiny", pooling="mean", num_labels=5, mlm_head=False)
    model = build_model(classifier, seed=5)
    rng = random.Random(0)
    texts = [[rng.randrange(3, 256) for _ in range(rng.randint(1, 40))] for _ in range(40)]
    with torch.no_grad():
        alone = [int(model(torch.tensor([t]), torch.ones(1, len(t), dtype=torch.long))[
            "logits"].argmax()) for t in texts]
    assert predict(model, texts, classifier["pad_token_id"]) == alone
    assert len(set(alone)) > 1  # a constant answer would prove nothing
