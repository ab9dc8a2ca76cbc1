"""Speech to a transcript with a Whisper export, torch-free: the audio cut into consecutive
30-s windows (runtime/files/audio.py's `audio_windows`, Whisper's sequential long form without
its seeking), each window's log-mel frames encoded once, then greedy decoding after the forced
prompt (<|startoftranscript|>, the language, the task, <|notimestamps|> unless timestamps are
asked for) under transformers' suppress and timestamp rules (runtime/speech_rules.py), every
window of a batch decoded side by side. A window's timestamps are shifted by its start.

Without a language, the first window's is detected as Whisper does: the likeliest language
token after <|startoftranscript|>, then used for every window. `no_speech_prob` is the
probability of <|nospeech|> there; `avg_logprob` the mean log-probability of the chosen tokens
under the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from registry.errors import ZooError
from registry.options import option
from registry.paths import display_path
from runtime.engine import Engine
from runtime.files.audio import audio_windows, export_mel_settings, window_offsets
from runtime.files.tokenizer import Tokenizer
from runtime.speech_rules import constrained
from runtime.speech_sessions import SpeechSession
from runtime.speech_tokens import SECONDS_PER_TIMESTAMP, TASKS, SpeechTokens, read_speech_tokens
from runtime.transcript import Segment, Transcript

WINDOWS_AT_ONCE = 8  # windows decoded side by side (4 MB of float32 frames at 80 bins)


@dataclass(frozen=True)
class TranscribeOptions:
    """`zoo run --audio`'s options (and `POST /v1/audio/transcriptions`' fields)."""

    language: str | None = option(None, "Speech models: the audio's language, a code of the "
                                  "model's (en, fr, ...) [detected from the first 30 s].")
    task: str = option("transcribe", "Speech models: transcribe, or translate into English.",
                       choices=TASKS)
    timestamps: bool = option(False, "Speech models: segments at Whisper's timestamp tokens "
                              "(srt, vtt and verbose_json always have them).")
    max_new_tokens: int | None = None  # per window; None: up to the decoder's positions


@dataclass
class WindowTokens:
    """One window's decoding: the tokens after its prompt (the end token last, where it came)
    and their log-probabilities."""

    offset: float
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    no_speech_prob: float = 0.0
    done: bool = False


def _log_softmax(scores: np.ndarray) -> np.ndarray:
    finite = scores[np.isfinite(scores)]
    top = finite.max() if finite.size else 0.0
    with np.errstate(divide="ignore"):
        return scores - top - np.log(np.exp(scores - top).sum())


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


class Transcriber:
    """An export's Whisper graphs, its special tokens and tokenizer, with the options."""

    def __init__(self, engine: Engine, folder: Path, tokenizer: Tokenizer | None,
                 options: TranscribeOptions) -> None:
        card = engine.card
        if tokenizer is None:
            raise ZooError(f"{display_path(folder)}: no tokenizer.json (a transcript is text)")
        if options.task not in TASKS:
            raise ZooError(f"task {options.task!r} should be one of {', '.join(TASKS)}")
        self.engine, self.tokenizer, self.options = engine, tokenizer, options
        self.tokens: SpeechTokens = read_speech_tokens(folder, card["vocab_size"])
        self.settings = export_mel_settings(folder)
        if self.settings.nb_max_frames != 2 * card["max_source_positions"]:
            raise ZooError(f"{display_path(folder)}: preprocessor_config.json makes "
                           f"{self.settings.nb_max_frames} frames a window; the model reads "
                           f"{2 * card['max_source_positions']}")
        if options.language is not None:
            self.tokens.language_id(options.language)  # refused here if the model has none
        some_language = next(iter(self.tokens.languages), None)  # told, or detected
        limit = card["max_positions"] - len(self.tokens.prompt(some_language, options.task,
                                                               options.timestamps))
        wanted = options.max_new_tokens or limit
        if not 1 <= wanted <= limit:
            raise ZooError(f"--max-new-tokens {wanted}: a window's transcript has 1 to {limit}")
        self.max_new = wanted

    def transcribe(self, samples: np.ndarray) -> Transcript:
        """16-kHz mono samples to the transcript of every window."""
        windows = audio_windows(samples, self.settings)
        offsets = window_offsets(samples, self.settings)
        duration = len(samples) / self.settings.sampling_rate
        language = self.options.language
        rows: list[WindowTokens] = []
        for start in range(0, len(windows), WINDOWS_AT_ONCE):
            batch = np.stack(windows[start:start + WINDOWS_AT_ONCE])
            language, decoded = self.decode(batch, offsets[start:start + len(batch)], language)
            rows += decoded
        segments = tuple(segment for row in rows
                         for segment in self._segments(row, min(duration, row.offset
                                                                + self.settings.chunk_length)))
        text = "".join(segment.text for segment in segments).strip()
        return Transcript(text, language, duration, segments)

    def decode(self, features: np.ndarray, offsets: list[float], language: str | None
               ) -> tuple[str | None, list[WindowTokens]]:
        """A batch of windows' frames (B, n_mels, frames) to their tokens, greedily; the
        language given, else the first window's."""
        tokens, options = self.tokens, self.options
        session = SpeechSession(self.engine)
        session.encode(features)
        first = _softmax(session.step(np.full((len(features), 1), tokens.start, np.int64)))
        if language is None and tokens.languages:  # the first window's likeliest language
            codes = list(tokens.languages)
            language = codes[int(np.argmax(first[0, list(tokens.languages.values())]))]
        prompt = tokens.prompt(language, options.task, options.timestamps)
        rows = [WindowTokens(offset, no_speech_prob=float(first[row, tokens.no_timestamps - 1]))
                for row, offset in enumerate(offsets)]
        logits = session.step(np.tile(np.array(prompt[1:], np.int64), (len(features), 1)))
        live = np.arange(len(features))
        for _ in range(self.max_new):
            chosen = []
            for index, row_logits in zip(live, logits, strict=True):
                row = rows[index]
                scores = _log_softmax(constrained(row_logits, row.generated, tokens,
                                                  options.timestamps))
                token = int(np.argmax(scores))
                row.generated.append(token)
                row.logprobs.append(float(scores[token]))
                row.done = token == tokens.end
                chosen.append(token)
            going = np.array([not rows[index].done for index in live])
            if not going.any():
                break
            if not going.all():
                session.keep(np.flatnonzero(going))
            live = live[going]
            logits = session.step(np.array(chosen, np.int64)[going][:, None])
        return language, rows

    def _segments(self, row: WindowTokens, window_end: float) -> list[Segment]:
        """The window's text, split at its timestamp pairs where it has them, its times shifted
        by the window's start."""
        tokens = self.tokens
        ids = [token for token in row.generated if token != tokens.end]
        score = float(np.mean(row.logprobs)) if row.logprobs else 0.0

        def segment(start: float, end: float, text_ids: list[int]) -> Segment:
            return Segment(round(start, 3), round(end, 3), self.tokenizer.decode(text_ids),
                           tuple(text_ids), score, row.no_speech_prob, 0.0,
                           round(row.offset * 100))

        def seconds(token: int) -> float:  # within the window (a wild model may say later)
            return min(window_end, row.offset
                       + (token - tokens.timestamp_begin) * SECONDS_PER_TIMESTAMP)

        if not self.options.timestamps:
            text_ids = [token for token in ids if token < tokens.end]
            return [segment(row.offset, window_end, text_ids)] if text_ids else []
        found, start, text_ids = [], None, []
        for token in ids:
            if token >= tokens.timestamp_begin:
                if start is not None and text_ids:  # the segment's end
                    found.append(segment(start, seconds(token), text_ids))
                    start, text_ids = None, []
                else:
                    start = seconds(token)
            elif token < tokens.end:
                text_ids.append(token)
        if text_ids:  # text after the last timestamp: it runs to the window's end
            found.append(segment(row.offset if start is None else start, window_end, text_ids))
        return found
