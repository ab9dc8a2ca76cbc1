"""Loads a zoo export folder with Optimum's ORTModelFor* classes or sentence-transformers, as a
Hugging Face model folder: nothing added or edited. Runs in examples/optimum/.venv (setup.sh):
optimum-onnx needs an older transformers than the zoo's own environment has.

    .venv/bin/python run.py FOLDER causal-lm --text "ROMEO:" [--max-new-tokens 32]
    .venv/bin/python run.py FOLDER causal-lm-head-dim --text "ROMEO:" [--max-new-tokens 32]
    .venv/bin/python run.py FOLDER feature-extraction --text A --text B
    .venv/bin/python run.py FOLDER masked-lm --text A --text B
    .venv/bin/python run.py FOLDER sequence-classification --text A --text B
    .venv/bin/python run.py FOLDER sentence-transformers --text A --text B
    .venv/bin/python run.py FOLDER translation --text A --text B [--max-new-tokens 32]
    .venv/bin/python run.py FOLDER image-classification --image a.png --image b.jpg
    .venv/bin/python run.py FOLDER zero-shot-image-classification --image a.png --label cat \
        --label dog
    .venv/bin/python run.py FOLDER speech-recognition --audio a.wav [--language en] [--timestamps]

causal-lm-head-dim is causal-lm with Optimum's empty cache sized by config.json's `head_dim`:
optimum-onnx 0.1.0's ORTModelForCausalLM sizes it hidden_size // num_attention_heads for every
model type but Gemma's, GPT-OSS's and Nemotron's, so a Qwen3 or Qwen3-MoE whose head_dim is
another (Qwen3-30B-A3B: 128, not 2048 // 32) fails at its first step (huggingface/optimum#2379,
whose fix this is).

Prints one JSON object: `tokens` (prompt and new ids) for causal-lm; `last_hidden_state` (one
(T, D) list per text) for feature-extraction; `logits` (one (T, V) list per text) for
masked-lm; `labels` and `scores` ({label: probability} per
text) for sequence-classification; `vectors` for sentence-transformers; `inputs` (each text's
source ids), `tokens` (its new ids, from ORTModelForSeq2SeqLM.generate) and `texts`
(`pipeline("translation")`'s) for translation; `labels` and `scores` ({label: probability}
per image, ORTModelForImageClassification on the folder's preprocessor_config.json through
transformers' AutoImageProcessor) for image-classification; the same for
zero-shot-image-classification, each image's softmax over the --label texts
(ORTModelForZeroShotImageClassification on onnx/model.onnx, a CLIP export: the folder's
tokenizer pads the labels, its processor reads the images); `tokens` (per 16-bit PCM WAV file,
ORTModelForSpeechSeq2Seq.generate's greedy ids on the folder's WhisperFeatureExtractor
features, the forced prompt first) for speech-recognition.

    .venv/bin/python run.py --jobs JOBS.json

runs a JSON list of {"folder", "task", "texts", "max_new_tokens"} in one process (the libraries
take seconds to import) and prints the list of results, an error as {"error": "..."}.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any


def causal_lm(folder: str, texts: list[str], max_new_tokens: int,
              head_dim: bool = False) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = ORTModelForCausalLM.from_pretrained(folder)
    if head_dim:  # causal-lm-head-dim: the cache's last axis as config.json gives it
        model.embed_size_per_head = model.config.head_dim
    inputs = tokenizer(texts[0], return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return {"tokens": output[0].tolist()}


def feature_extraction(folder: str, texts: list[str]) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = ORTModelForFeatureExtraction.from_pretrained(folder)
    states = [model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].tolist()
              for text in texts]
    return {"last_hidden_state": states}


def masked_lm(folder: str, texts: list[str]) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForMaskedLM
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = ORTModelForMaskedLM.from_pretrained(folder)
    logits = [model(**tokenizer(text, return_tensors="pt")).logits[0].tolist() for text in texts]
    return {"logits": logits}


def sequence_classification(folder: str, texts: list[str]) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForSequenceClassification
    from transformers import AutoTokenizer, pipeline

    classifier = pipeline("text-classification",
                          model=ORTModelForSequenceClassification.from_pretrained(folder),
                          tokenizer=AutoTokenizer.from_pretrained(folder))
    ranked = [classifier(text, top_k=None) for text in texts]
    return {"labels": [row[0]["label"] for row in ranked],
            "scores": [{entry["label"]: entry["score"] for entry in row} for row in ranked]}


def translation(folder: str, texts: list[str], max_new_tokens: int) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from transformers import AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(folder)
    # subfolder "onnx": there the layout's encoder and merged decoder are the only graphs, so a
    # quantized export's encoder_model_int8.onnx is found by name pattern as the one match
    # (from the folder's root, the contract's encoder.onnx matches too: Optimum would take the
    # first of the two, with a warning)
    model = ORTModelForSeq2SeqLM.from_pretrained(folder, subfolder="onnx")
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    inputs, tokens, translations = [], [], []
    for text in texts:  # one at a time: no padding, each source its own length
        source = tokenizer(text, return_tensors="pt")
        inputs.append(source["input_ids"][0].tolist())
        output = model.generate(**source, max_new_tokens=max_new_tokens, do_sample=False)
        tokens.append(output[0, 1:].tolist())  # [0]: the decoder's start token
        result = translator(text, max_new_tokens=max_new_tokens, do_sample=False,
                            num_beams=1)  # greedy: the translation pipeline's default is 4 beams
        translations.append(result[0]["translation_text"])
    return {"inputs": inputs, "tokens": tokens, "texts": translations}


def sentence_transformers(folder: str, texts: list[str]) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, backend="onnx", device="cpu")
    return {"vectors": model.encode(texts).tolist()}


def image_classification(folder: str, images: list[str]) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForImageClassification
    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(folder)
    model = ORTModelForImageClassification.from_pretrained(folder)
    labels, scores = [], []
    for path in images:
        with Image.open(path) as image:
            logits = model(**processor(image, return_tensors="pt")).logits[0]
        probabilities = logits.softmax(-1).tolist()
        names = [model.config.id2label[i] for i in range(len(probabilities))]
        labels.append(names[max(range(len(names)), key=probabilities.__getitem__)])
        scores.append(dict(zip(names, probabilities, strict=True)))
    return {"labels": labels, "scores": scores}


def zero_shot(folder: str, images: list[str], labels: list[str]) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForZeroShotImageClassification
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = AutoImageProcessor.from_pretrained(folder)
    model = ORTModelForZeroShotImageClassification.from_pretrained(folder)
    texts = tokenizer(labels, padding=True, return_tensors="pt")
    best, scores = [], []
    for path in images:
        with Image.open(path) as image:
            pixels = processor(image, return_tensors="pt")["pixel_values"]
        logits = model(input_ids=texts["input_ids"], attention_mask=texts["attention_mask"],
                       pixel_values=pixels).logits_per_image[0]
        probabilities = logits.softmax(-1).tolist()
        best.append(labels[max(range(len(labels)), key=probabilities.__getitem__)])
        scores.append(dict(zip(labels, probabilities, strict=True)))
    return {"labels": best, "scores": scores}
def read_wav(path: str) -> Any:
    """A 16-bit PCM mono WAV's samples as float32 in [-1, 1] (the standard library's reader:
    this environment has no soundfile)."""
    import wave

    import numpy as np

    with wave.open(path, "rb") as audio:
        if audio.getsampwidth() != 2 or audio.getnchannels() != 1:
            raise ValueError(f"{path}: give a 16-bit PCM mono WAV")
        data = audio.readframes(audio.getnframes())
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0


def speech_recognition(folder: str, paths: list[str], max_new_tokens: int,
                       language: str | None = None, timestamps: bool = False
                       ) -> dict[str, Any]:
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq
    from transformers import AutoFeatureExtractor

    extractor = AutoFeatureExtractor.from_pretrained(folder)
    model = ORTModelForSpeechSeq2Seq.from_pretrained(folder, subfolder="onnx")
    tokens = []
    for path in paths:
        features = extractor(read_wav(path), sampling_rate=extractor.sampling_rate,
                             return_tensors="pt").input_features
        output = model.generate(features, language=language, task="transcribe",
                                return_timestamps=timestamps, max_new_tokens=max_new_tokens)
        tokens.append(output[0].tolist())
    return {"tokens": tokens}


TASKS = {"causal-lm": causal_lm, "causal-lm-head-dim": partial(causal_lm, head_dim=True),
         "feature-extraction": feature_extraction, "masked-lm": masked_lm,
         "sequence-classification": sequence_classification,
         "sentence-transformers": sentence_transformers, "translation": translation,
         "image-classification": image_classification,
         "zero-shot-image-classification": zero_shot, "speech-recognition": speech_recognition}
GENERATING = ("causal-lm", "causal-lm-head-dim", "translation")
SPEECH = ("speech-recognition",)


def run(folder: str, task: str, texts: list[str], max_new_tokens: int = 32,
        labels: list[str] | None = None, language: str | None = None,
        timestamps: bool = False) -> dict[str, Any]:
    if task == "zero-shot-image-classification":
        return zero_shot(folder, texts, labels or [])
    if task in SPEECH:
        return TASKS[task](folder, texts, max_new_tokens, language, timestamps)
    if task in GENERATING:
        return TASKS[task](folder, texts, max_new_tokens)
    return TASKS[task](folder, texts)


def error_line(exc: Exception) -> str:
    """The error on one line: its lines joined (ONNX Runtime's shape errors give the axis and
    the sizes on the second)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def main() -> int:
    if sys.argv[1:2] == ["--jobs"]:
        results = []
        for job in json.loads(open(sys.argv[2], encoding="utf-8").read()):
            try:
                results.append(run(**job))
            except Exception as exc:  # the libraries raise many types: one line per job
                results.append({"error": error_line(exc)})
        print(json.dumps(results))
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("task", choices=list(TASKS))
    parser.add_argument("--text", action="append")
    parser.add_argument("--image", action="append", dest="text")  # image-classification's
    parser.add_argument("--label", action="append")  # zero-shot-image-classification's
    parser.add_argument("--audio", action="append", dest="text")  # speech-recognition's
    parser.add_argument("--language")
    parser.add_argument("--timestamps", action="store_true")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    if not args.text:
        parser.error("give at least one --text (or --image, --audio)")
    try:
        result = run(args.folder, args.task, args.text, args.max_new_tokens, labels=args.label,
                     language=args.language, timestamps=args.timestamps)
    except Exception as exc:  # the libraries raise many types: one line, exit 1
        print(error_line(exc), file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
