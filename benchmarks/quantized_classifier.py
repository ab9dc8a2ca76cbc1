"""Quantization on the demo's trained classifier (issue #14): accuracy, macro-F1, predictions
that match the fp32 export, and sentence-embedding cosine to fp32, for each export given:

    make demo-speakers                     # out/demo-speakers/classifier and data/eval.jsonl
    C=out/demo-speakers
    zoo export $C/classifier --onnx --quantize int8 -o $C/int8
    zoo export $C/classifier --onnx --quantize int4 -o $C/int4
    PYTHONPATH=. .venv/bin/python benchmarks/quantized_classifier.py \
        --data $C/data/eval.jsonl $C/onnx $C/int8 $C/int4

The first export is the reference (fp32).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.files.labelled import label_ids, read_rows  # noqa: E402
from runtime.scores import scores  # noqa: E402
from zoo import load  # noqa: E402

BATCH = 16


def outputs(folder: Path, prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Sentence embeddings and predicted labels of every prompt, through ONNX Runtime."""
    model = load(folder)
    parts = [model.sequences(prompts[i:i + BATCH]) for i in range(0, len(prompts), BATCH)]
    embeddings = np.concatenate([part.embeddings for part in parts]).astype(np.float64)
    labels = np.concatenate([part.probabilities.argmax(-1) for part in parts])
    return embeddings, labels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="labelled rows (JSONL/CSV)")
    parser.add_argument("exports", type=Path, nargs="+", help="fp32 export first")
    args = parser.parse_args()
    fp32 = load(args.exports[0])
    reference, tokenizer = fp32.card, fp32.tokenizer
    if tokenizer is None or not reference["num_labels"]:
        print(f"error: {args.exports[0]}: not a classifier export with a tokenizer",
              file=sys.stderr)
        return 2
    rows = read_rows(args.data)
    truth = label_ids(rows, reference["labels"], reference["num_labels"])
    limit = reference["max_positions"]
    prompts = [tokenizer.encode(example.text)[:limit] for example in rows.examples]
    names = reference["labels"] or [str(i) for i in range(reference["num_labels"])]
    base_vectors, base_labels = outputs(args.exports[0], prompts)
    print("| export | accuracy | macro-F1 | same label as fp32 | embedding cosine to fp32: "
          "mean / min |\n| --- | --- | --- | --- | --- |")
    for folder in args.exports:
        vectors, labels = outputs(folder, prompts)
        result = scores(truth, labels.tolist(), names)
        cosine = (vectors * base_vectors).sum(1) / (np.linalg.norm(vectors, axis=1)
                                                    * np.linalg.norm(base_vectors, axis=1))
        print(f"| {folder} | {result['accuracy']:.3f} | {result['macro_f1']:.3f} | "
              f"{int((labels == base_labels).sum())}/{len(labels)} | "
              f"{cosine.mean():.6f} / {cosine.min():.6f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
