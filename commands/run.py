"""`zoo run OUT`: generate from a decoder or encoder-decoder, pooled vectors and masked-token
predictions from an encoder, labels or vectors from a model with a sentence vector, a
transcript from a speech model."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from registry.errors import ZooError
from registry.options import option, parse_ids
from runtime.classify import SequenceOutputs
from runtime.exported import Exported, GenerateOptions, Prompt, load
from runtime.prompts import check_text
from runtime.sampling import check_new_tokens
from runtime.sessions import PROVIDERS
from runtime.transcribe import TranscribeOptions
from runtime.transcript import RESPONSE_FORMATS, TIMED_FORMATS, format_transcript


@dataclass(frozen=True)
class RunRequest:
    folder: Path
    texts: tuple[str, ...] = option((), "Text prompt (needs an export with a tokenizer); "
                                    "repeat for a batch.", flags=("--text",))
    id_lists: tuple[list[int], ...] = option(
        (), "Comma-separated token ids; repeat for a (left-padded) batch.", flags=("--ids",),
        parse=parse_ids)
    chats: tuple[str, ...] = option((), "A user's message, put in the export's chat template "
                                    "(chat_template.jinja); prints the reply. Repeat for more.",
                                    flags=("--chat",))
    images: tuple[Path, ...] = option((), "An image file (PNG, JPEG, ...) for an image "
                                      "model's export (a ViT): its top labels; repeat for a "
                                      "batch.", flags=("--image",), path="file")
    labels: str | None = option(None, "A dual encoder's export (CLIP, SigLIP): score each "
                                "--image against these labels, separated by commas "
                                "(zero-shot).", metavar="A,B,...")
    template: str | None = option(None, "With --labels: the text each label is put in, at "
                                  "{} (CLIP's: 'a photo of a {}.').", metavar="TEXT")
    audio: Path | None = option(None, "An audio file (WAV, FLAC, ...) for a speech model's "
                                "export (Whisper): its transcript.", path="file")
    response_format: str = option("text", "Speech models: the transcript's form, as OpenAI's "
                                  "response_format.", flags=("--format",),
                                  choices=RESPONSE_FORMATS)
    transcription: TranscribeOptions = TranscribeOptions()
    as_json: bool = option(False, "Classifiers and embedding models: print the raw numbers as "
                           "JSON.", flags=("--json",))
    options: GenerateOptions = GenerateOptions()
    provider: str = option("cpu", "ONNX Runtime's execution provider.", choices=PROVIDERS)
    threads: int | None = option(None, "ONNX Runtime CPU threads [all cores].")


def run_export(request: RunRequest, progress: Callable[[str], None] = lambda m: None
               ) -> list[str]:
    check_new_tokens(request.options.max_new_tokens)  # bad options need no export opened
    if request.chats:
        exported = load(request.folder, request.provider, request.threads)
        return [exported.chat(message, request.options).text or ""
                for message in request.chats]
    if request.audio is not None:
        return [_transcript_text(request)]
    if request.images:
        if request.texts or request.id_lists:
            raise ZooError("--image cannot be combined with --text or --ids")
        exported = load(request.folder, request.provider, request.threads)
        shown = [str(path) for path in request.images]
        result = (exported.images(request.images) if request.labels is None else
                  exported.zero_shot(request.images, request.labels.split(","),
                                     request.template))
        return _sequence_lines(result, shown, request.as_json)
    if request.labels is not None or request.template is not None:
        raise ZooError("--labels and --template score images: give them with --image FILE")
    texts = tuple(check_text(text) for text in request.texts)
    if not texts and not request.id_lists:
        raise ZooError("give token ids with --ids 1,2,3 (or --text)")
    exported = load(request.folder, request.provider, request.threads)
    exported.use_adapter(request.options.adapter)  # embedders and classifiers too
    prompts: list[Prompt] = list(texts) if texts else list(request.id_lists)
    what = "--text" if texts else "--ids"
    if exported.card["pooling"] is not None:
        shown = list(texts) or [",".join(map(str, ids)) for ids in request.id_lists]
        result = exported.sequences(prompts, what)
        return _sequence_lines(result, shown, request.as_json)
    if request.as_json:
        raise ZooError("--json is for classifiers and embedding models (cards with pooling)")
    if not exported.runtime.spec.generates:
        return _encoder_lines(exported, prompts, what)
    return _generated_lines(exported, prompts, what, request.options, progress)


def _transcript_text(request: RunRequest) -> str:
    """The transcript in --format; subtitles and verbose_json always with timestamps."""
    if request.texts or request.id_lists or request.images or request.chats:
        raise ZooError("--audio cannot be combined with --text, --ids, --chat or --image")
    exported = load(request.folder, request.provider, request.threads)
    options = request.transcription
    if request.response_format in TIMED_FORMATS:
        options = replace(options, timestamps=True)
    body, _ = format_transcript(exported.transcribe(request.audio, options),
                                request.response_format)
    return body.rstrip("\n")


def _generated_lines(exported: Exported, prompts: list[Prompt], what: str,
                     options: GenerateOptions, progress: Callable[[str], None]) -> list[str]:
    start = time.perf_counter()
    generated = exported.generate(prompts, options, what)
    if len(prompts) > 1:  # a batch of users: what they got per second, together
        eos = exported.card["eos_token_id"]
        made = sum(row.ids.index(eos) + 1 if eos in row.ids else len(row.ids)
                   for row in generated)
        seconds = time.perf_counter() - start
        progress(f"{len(prompts)} prompts: {made} new tokens (each up to its eos) in "
                 f"{seconds:.2f} s, {made / seconds:.1f} tokens/s aggregate")
    if not isinstance(prompts[0], str):
        return [",".join(str(token) for token in row.ids) for row in generated]
    continues = exported.runtime.spec.continues_prompt  # a translation does not
    return [(str(prompt) if continues else "") + (row.text or "")
            for prompt, row in zip(prompts, generated, strict=True)]


def _encoder_lines(exported: Exported, prompts: list[Prompt], what: str) -> list[str]:
    lines = []
    for ids in exported.tokens(prompts, what):
        pooled, predictions = exported.masked_predictions(ids)
        if pooled is not None:
            lines.append("pooled: " + " ".join(f"{value:.5f}" for value in pooled))
        for prediction in predictions:
            best = ", ".join(f"{token} ({probability:.3f})" for token, probability
                             in zip(prediction.tokens, prediction.probabilities, strict=True))
            lines.append(f"masked position {prediction.position}: {best}")
    return lines


def _sequence_lines(result: SequenceOutputs, shown: list[str], as_json: bool) -> list[str]:
    """A classifier's top labels per text, or the vectors' size and norm; then, for two or
    more texts, the cosine-similarity matrix."""
    if as_json:
        return [json.dumps({"inputs": shown, **result.to_json()})]
    norms = result.norms()
    lines = []
    for row, text in enumerate(shown):
        lines.append(f"[{row}] {text!r}")
        if result.probabilities is not None:
            lines.append("    " + ", ".join(f"{label} {p:.3f}" for label, p in result.top(row)))
        else:
            lines.append(f"    vector: {result.embeddings.shape[1]} dims, norm {norms[row]:.5f}")
    if len(shown) > 1:
        lines.append("cosine similarity:")
        lines += [f"  [{row}] " + " ".join(f"{value:+.4f}" for value in values)
                  for row, values in enumerate(result.cosine())]
    return lines
