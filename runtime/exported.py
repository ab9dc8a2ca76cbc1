"""An export opened to run it: `zoo.load(OUT)`'s object, with generate / chat / embed / classify
/ masked_predictions, and the options of `zoo run`. ONNX Runtime, numpy and tokenizers only."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.catalog import Card
from registry.dual import image_tower
from registry.errors import ZooError, first_line
from registry.options import option
from registry.paths import display_path, inside
from registry.stems import is_mel_card, is_patch_card
from runtime.classify import SequenceOutputs, run_images, run_sequences
from runtime.dual import image_vectors, prompts_for, zero_shot
from runtime.encode import MaskedPrediction, encode
from runtime.files.audio import read_audio
from runtime.files.chat import CHAT_TEMPLATE
from runtime.files.chat_worker import render_chat
from runtime.files.conversations import template_specials
from runtime.files.images import export_processor, load_pixels
from runtime.files.tokenizer import HuggingFaceTokenizer, Tokenizer, load_tokenizer, sequence_ids
from runtime.files.tools import presented
from runtime.generate import generate, left_padded
from runtime.grammar.engine import Grammar, Grammars, json_grammar, read_schema_file, regex_grammar
from runtime.opening import open_export
from runtime.prompts import check_ids, check_text
from runtime.sampling import Sampling, check_new_tokens
from runtime.sessions import Runtime
from runtime.transcribe import TranscribeOptions, Transcriber
from runtime.transcript import Transcript

Prompt = str | Sequence[int]  # a text (the export's tokenizer reads it) or token ids


@dataclass(frozen=True)
class GenerateOptions:
    """`zoo run`'s generation options: greedy unless a temperature is set."""

    max_new_tokens: int = option(32)
    temperature: float = option(0.0, "0 = greedy.")
    top_k: int = option(0, "0 = no limit.")
    top_p: float = option(1.0)
    beams: int = option(1, "Beam search width.")
    seed: int = option(0, "Sampling seed.")
    json_schema: str | dict | None = option(
        None, "A JSON schema every answer must follow (a file; in Python the schema or its "
        "JSON text), enforced at every step.", parse=read_schema_file, metavar="FILE")
    regex: str | None = option(None, "A regular expression every answer must match as a "
                               "whole, enforced at every step.", metavar="PATTERN")
    adapter: str | None = option(
        None, "A LoRA adapter of an export made with --adapters keep (its name in "
        "manifest.json's adapters); without it, the base.", metavar="NAME")

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, self.top_p, self.seed, self.beams)

    def grammar(self) -> Grammar | None:
        """What the answer must match, or None (free decoding)."""
        if self.json_schema is not None and self.regex is not None:
            raise ZooError("--json-schema and --regex cannot be combined")
        if self.regex is not None:
            return regex_grammar(self.regex, "--regex")
        if self.json_schema is None:
            return None
        schema = self.json_schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as exc:
                raise ZooError(f"--json-schema: not valid JSON ({first_line(exc)})") from None
        return json_grammar(schema, "--json-schema")


@dataclass(frozen=True)
class Generated:
    """One prompt's new tokens: `ids` has max_new_tokens entries, padded with eos after the
    first one; `text` is their text (special tokens dropped), where the export has a tokenizer."""

    prompt: list[int]
    ids: list[int]
    text: str | None


class Exported:
    """An export folder opened with ONNX Runtime (every file's sha256 checked first)."""

    def __init__(self, folder: str | Path, provider: str = "cpu",
                 threads: int | None = None) -> None:
        self.folder = Path(folder)
        self.runtime: Runtime = open_export(self.folder, provider, threads)
        self.tokenizer: Tokenizer | None = load_tokenizer(self.folder)
        self.grammars = Grammars(self.tokenizer, self.card, display_path(self.folder))

    @property
    def card(self) -> Card:
        return self.runtime.card

    def tokens(self, prompts: Prompt | Sequence[Prompt], what: str = "prompt",
               whole: bool = False) -> list[list[int]]:
        """Token ids of one prompt or a batch, checked against the vocabulary and
        max_positions; `what` names them in errors (`zoo run` says --text or --ids). `whole`:
        each text is a whole sequence (a sentence vector's, a prompt, a source), with its
        tokenizer's special tokens."""
        batch = [prompts] if _is_one(prompts) else list(prompts)  # type: ignore[list-item]
        if not batch:
            raise ZooError(f"{what}: no prompt given")
        ids = [self._ids(prompt, whole) for prompt in batch]
        if any(not prompt for prompt in ids):
            raise ZooError(f"an empty prompt: every {what} needs at least one token")
        check_ids(self.card, ids, what)
        return ids

    def _ids(self, prompt: Prompt, whole: bool = False) -> list[int]:
        if not isinstance(prompt, str):
            return [int(token) for token in prompt]
        if self.tokenizer is None:
            raise ZooError(f"{display_path(self.folder)}: this export has no tokenizer; pass "
                           "token ids instead of text (--ids)")
        text = check_text(prompt)
        return sequence_ids(self.tokenizer, text) if whole else self.tokenizer.encode(text)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 options: GenerateOptions | None = None, what: str = "prompt"
                 ) -> list[Generated]:
        """Continue (a decoder) or translate (an encoder-decoder) each prompt; a batch is
        left-padded and every row gets what it would alone."""
        options = options or GenerateOptions()
        check_new_tokens(options.max_new_tokens)
        if not self.runtime.spec.generates:
            raise ZooError(f"{display_path(self.folder)}: a {self.card.family} export does not "
                           "generate; use embed, classify or masked_predictions")
        if is_mel_card(self.card):
            raise ZooError(f"{display_path(self.folder)}: a speech model reads audio, not "
                           f"{what} (zoo run --audio FILE; in Python, transcribe(FILE))")
        # a text with its tokenizer's special tokens (Llama 2's BOS, a source's </s>), as
        # transformers' pipelines and llama.cpp encode one; a chat prompt comes as ids (BOS in
        # its template)
        batch = self.tokens(prompts, what, whole=True)
        self.use_adapter(options.adapter)
        grammar = options.grammar()
        constraints = None if grammar is None else \
            [self.grammars.constraint(grammar) for _ in batch]
        ids, mask = left_padded(batch, self.card["pad_token_id"])
        rows = generate(self.runtime, ids, mask, options.max_new_tokens, options.sampling(),
                        self.card["eos_token_id"], constraints=constraints)
        return [Generated(prompt, row, self._text(row)) for prompt, row in
                zip(batch, rows.tolist(), strict=True)]

    def use_adapter(self, name: str | None) -> None:
        """Run with the LoRA adapter `name` of an --adapters keep export from now on (None:
        the base); an unknown name is refused in one line listing the known ones."""
        self.runtime.adapters.activate(name)

    def chat(self, messages: str | list[dict[str, str]],
             options: GenerateOptions | None = None) -> Generated:
        """The assistant's reply: `messages` (a user's text, or {role, content} dicts) put in
        the export's chat template (chat_template.jinja), then generated to eos."""
        return self.generate([self.chat_prompt(messages)], options, "--chat")[0]

    def chat_prompt(self, messages: str | list[dict[str, Any]],
                    tools: Any = None) -> list[int]:
        """The prompt's ids; `tools` (runtime/serve/tools.py Tools, `zoo serve`'s) shown by
        the template where it reads them, else as a system message."""
        # kept inside the folder as every file the export reads, listed in the manifest or not
        template = inside(self.folder, CHAT_TEMPLATE, display_path(self.folder), "chat template")
        if not template.is_file() or not isinstance(self.tokenizer, HuggingFaceTokenizer):
            raise ZooError(f"{display_path(self.folder)}: no chat template (chat_template.jinja "
                           "and tokenizer.json); give the prompt as text")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": check_text(messages)}]
        reads_tools = "tools" in template.read_text(encoding="utf-8", errors="replace")
        messages, shown_tools = presented(messages, tools, reads_tools)
        bos, eos = template_specials(self.tokenizer, self.card["bos_token_id"],
                                     self.card["eos_token_id"])
        text = render_chat(template, messages, bos, eos, tools=shown_tools)
        return self.tokenizer.encode(text)

    def _text(self, ids: list[int]) -> str | None:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else None

    def sequences(self, prompts: Prompt | Sequence[Prompt], what: str = "prompt"
                  ) -> SequenceOutputs:
        """A model with a sentence vector (a card with pooling): every prompt's vector and, for
        a classifier, its label probabilities."""
        if self.card["pooling"] is None:
            raise ZooError(f"{display_path(self.folder)}: this export has no sentence vector "
                           "(its card sets no pooling)")
        if is_patch_card(self.card):
            raise ZooError(f"{display_path(self.folder)}: an image model reads images, not "
                           "text (zoo run --image FILE; in Python, images([...]))")
        return run_sequences(self.runtime, self.tokens(prompts, what, whole=True))

    def images(self, paths: Sequence[str | Path]) -> SequenceOutputs:
        """An image model (a ViT): each image file's class-token vector and, for a classifier,
        its label probabilities, the files run through the export's preprocessor_config.json.
        A dual encoder (CLIP): each image's unit vector, in its texts' space."""
        return run_images(self.runtime, self._pixels(paths))

    def _pixels(self, paths: Sequence[str | Path]) -> np.ndarray:
        if image_tower(self.card) is None:
            raise ZooError(f"{display_path(self.folder)}: not an image model (its card's stem "
                           "reads tokens); give it text or ids")
        if not paths:
            raise ZooError("no image given")
        processor = export_processor(self.folder, self.card)
        return load_pixels([Path(p) for p in paths], processor)

    def zero_shot(self, paths: Sequence[str | Path], labels: Sequence[str],
                  template: str | None = None) -> SequenceOutputs:
        """A dual encoder (CLIP, SigLIP): each image's vector and its score for each label
        (the label's text put in `template` at `{}`; runtime/dual.py says how scored)."""
        where = display_path(self.folder)
        if not self.runtime.spec.joint_space:
            raise ZooError(f"{where}: --labels needs a dual encoder (CLIP, SigLIP), not a "
                           f"{self.runtime.spec.kind}")
        labels = [check_text(label.strip()) for label in labels]
        if not labels or not all(labels) or len(set(labels)) != len(labels):
            raise ZooError(f"--labels {','.join(labels)!r} should name two or more different "
                           "labels, separated by commas")
        if template is not None and "{}" not in template:
            raise ZooError(f"--template {template!r} should hold {{}} where the label goes")
        pixels = self._pixels(paths)
        prompts = self.tokens(prompts_for(labels, template), "--labels", whole=True)
        scores = zero_shot(self.runtime, pixels, prompts)
        return SequenceOutputs(image_vectors(self.runtime, pixels), scores, labels)

    def transcribe(self, audio: str | Path | np.ndarray,
                   options: TranscribeOptions | None = None) -> Transcript:
        """A speech model (Whisper): an audio file (or 16-kHz mono float32 samples) to its
        transcript, in consecutive 30-s windows (runtime/transcribe.py)."""
        if not is_mel_card(self.card):
            raise ZooError(f"{display_path(self.folder)}: not a speech model (its card's stem "
                           "reads no audio)")
        transcriber = Transcriber(self.runtime, self.folder, self.tokenizer,
                                  options or TranscribeOptions())  # options checked first
        samples = audio if isinstance(audio, np.ndarray) else read_audio(Path(audio))
        return transcriber.transcribe(samples)

    def embed(self, prompts: Prompt | Sequence[Prompt]) -> np.ndarray:
        """(batch, d) sentence vectors, normalised where the card says so."""
        return self.sequences(prompts).embeddings

    def classify(self, prompts: Prompt | Sequence[Prompt]) -> list[dict[str, float]]:
        """Per prompt, {label: probability}, the most likely first."""
        result = self.sequences(prompts)
        if result.probabilities is None:
            raise ZooError(f"{display_path(self.folder)}: not a classifier (num_labels is 0)")
        return [dict(result.top(row, len(result.labels)))
                for row in range(len(result.embeddings))]

    def masked_predictions(self, ids: Sequence[int]
                           ) -> tuple[np.ndarray | None, list[MaskedPrediction]]:
        """An encoder: the pooled vector of one sequence and the top tokens at each mask."""
        return encode(self.runtime, np.array(self.tokens(ids)[0]))


def load(folder: str | Path, provider: str = "cpu", threads: int | None = None) -> Exported:
    """Open an export folder (`zoo export`'s OUT) with ONNX Runtime on `provider`."""
    return Exported(folder, provider, threads)


def _is_one(prompts: Prompt | Sequence[Prompt]) -> bool:
    """A single prompt (a text, or ids) rather than a batch of them."""
    if isinstance(prompts, str):
        return True
    items = list(prompts)
    return bool(items) and all(isinstance(item, int | np.integer) for item in items)
