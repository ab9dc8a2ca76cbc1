"""Whisper's special tokens of generation, as transformers' WhisperForConditionalGeneration
reads them from generation_config.json (older checkpoints: some in config.json): the decoder's
start (<|startoftranscript|>), the end, a token per language (`lang_to_id`) and per task
(`task_to_id`), <|notimestamps|> and the timestamps after it, the tokens never generated
(`suppress_tokens`) and those not generated first (`begin_suppress_tokens`).

The import reads them from the Hugging Face folder and writes them, checked, as the built
folder's generation_config.json; the export writes them into its own; transcription reads them
back from there. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from registry.errors import ZooError
from registry.paths import display_path, inside
from registry.stems import is_mel_card
from runtime.files.audio import (
    PREPROCESSOR_CONFIG,
    MelSettings,
    default_mel_settings,
    read_mel_settings,
)
from runtime.files.json_files import read_json

GENERATION_CONFIG = "generation_config.json"
TASKS = ("transcribe", "translate")
SECONDS_PER_TIMESTAMP = 0.02  # Whisper's timestamp tokens are 20 ms apart


class SpeechTokensError(ZooError):
    """A generation_config.json whose Whisper tokens are missing or out of the vocabulary."""


@dataclass(frozen=True)
class SpeechTokens:
    start: int  # decoder_start_token_id: <|startoftranscript|>
    end: int  # eos_token_id: <|endoftext|>
    no_timestamps: int  # <|notimestamps|>; the timestamps are the ids after it
    languages: dict[str, int]  # "en": <|en|>'s id
    tasks: dict[str, int]  # "transcribe", "translate": their ids
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    max_initial_timestamp_index: int | None = None

    @property
    def timestamp_begin(self) -> int:
        """<|0.00|>'s id: the first timestamp, right after <|notimestamps|>."""
        return self.no_timestamps + 1

    def prompt(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """The forced start of a transcript: <|startoftranscript|>, the language's token
        (where one is given: none lets a multilingual model's first step say it), the task's,
        and <|notimestamps|> unless timestamps are asked for."""
        ids = [self.start]
        if language is not None:
            ids.append(self.language_id(language))
        ids.append(self.tasks[task])
        return ids if timestamps else [*ids, self.no_timestamps]

    def language_id(self, language: str) -> int:
        code = language.strip("<|>").lower()
        if code not in self.languages:
            known = ", ".join(sorted(self.languages)) or "none"
            raise SpeechTokensError(f"language {language!r} is not one of the model's ({known})")
        return self.languages[code]

    def generation_config(self) -> dict[str, Any]:
        """What transformers' Whisper generation reads, for generation_config.json."""
        return {"decoder_start_token_id": self.start, "eos_token_id": self.end,
                "no_timestamps_token_id": self.no_timestamps,
                "lang_to_id": {f"<|{code}|>": token for code, token in self.languages.items()},
                "task_to_id": dict(self.tasks), "is_multilingual": len(self.languages) > 1,
                "suppress_tokens": list(self.suppress),
                "begin_suppress_tokens": list(self.begin_suppress),
                "max_initial_timestamp_index": self.max_initial_timestamp_index}


def _read_object(path: Path) -> dict[str, Any]:
    value = read_json(path, SpeechTokensError)
    if not isinstance(value, dict):
        raise SpeechTokensError(f"{display_path(path)}: should hold a JSON object")
    return value


class _Checked:
    """Values read from generation_config.json, then config.json, each checked to be a token
    id of the vocabulary, errors naming the file and key."""

    def __init__(self, files: list[tuple[str, dict[str, Any]]], vocab_size: int) -> None:
        self.files, self.vocab_size = files, vocab_size

    def find(self, key: str) -> tuple[str, Any]:
        return next(((where, data[key]) for where, data in self.files
                     if data.get(key) is not None), (self.files[0][0], None))

    def token(self, key: str, where: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not (
                0 <= value < self.vocab_size):
            raise SpeechTokensError(f"{where}: {key}={value!r} should be a token id below "
                                    f"vocab_size={self.vocab_size}")
        return value

    def required(self, key: str) -> int:
        where, value = self.find(key)
        if value is None:
            raise SpeechTokensError(f"{where}: no {key} (a Whisper model's generation needs it)")
        return self.token(key, where, value)

    def ids(self, key: str) -> tuple[int, ...]:
        where, value = self.find(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise SpeechTokensError(f"{where}: {key} should be a list of token ids")
        return tuple(self.token(key, where, item) for item in value)

    def forced(self) -> list[tuple[int, int | None]]:
        """forced_decoder_ids (older checkpoints' prompt, [[1, language or null], [2, task],
        ...]): positions from 1, ids of the vocabulary or null. transformers builds the prompt
        from lang_to_id and task_to_id instead, and so does the zoo."""
        where, value = self.find("forced_decoder_ids")
        pairs = value or []
        if not isinstance(pairs, list) or not all(
                isinstance(pair, list) and len(pair) == 2 for pair in pairs):
            raise SpeechTokensError(f"{where}: forced_decoder_ids should be a list of "
                                    "[position, token id] pairs")
        found = []
        for position, token in pairs:
            if isinstance(position, bool) or not isinstance(position, int) or position < 1:
                raise SpeechTokensError(f"{where}: forced_decoder_ids position {position!r} "
                                        "should be a whole number from 1")
            found.append((position, None if token is None else self.token(
                "forced_decoder_ids", where, token)))
        return found

    def names(self, key: str, strip: bool) -> dict[str, int]:
        where, value = self.find(key)
        if not isinstance(value or {}, dict):
            raise SpeechTokensError(f"{where}: {key} should map names to token ids")
        return {(name.strip("<|>") if strip else name): self.token(key, where, token)
                for name, token in (value or {}).items()}


def read_speech_tokens(folder: Path, vocab_size: int) -> SpeechTokens:
    """The tokens from `folder`'s generation_config.json (required) and config.json (where the
    folder has one, for what older checkpoints keep there)."""
    folder = Path(folder)
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        raise SpeechTokensError(f"{display_path(folder)}: no {GENERATION_CONFIG} (a Whisper "
                                "folder keeps its languages, tasks and timestamps there)")
    files = [(display_path(path), _read_object(path))]
    if (folder / "config.json").is_file():
        files.append((display_path(folder / "config.json"), _read_object(folder / "config.json")))
    checked = _Checked(files, vocab_size)
    tasks = checked.names("task_to_id", strip=False)
    missing = [task for task in TASKS if task not in tasks]
    if missing:
        raise SpeechTokensError(f"{files[0][0]}: task_to_id has no {', '.join(missing)}")
    where, initial = checked.find("max_initial_timestamp_index")
    if initial is not None and (isinstance(initial, bool) or not isinstance(initial, int)
                                or initial < 0):
        raise SpeechTokensError(f"{where}: max_initial_timestamp_index={initial!r} should be "
                                "a whole number of 0 or more")
    checked.forced()  # read and checked; the prompt is made from lang_to_id and task_to_id
    no_timestamps = checked.required("no_timestamps_token_id")
    if no_timestamps + 1 >= vocab_size:
        raise SpeechTokensError(f"{files[0][0]}: no_timestamps_token_id={no_timestamps} leaves "
                                f"no timestamp tokens below vocab_size={vocab_size}")
    return SpeechTokens(checked.required("decoder_start_token_id"),
                        checked.required("eos_token_id"), no_timestamps,
                        checked.names("lang_to_id", strip=True), tasks,
                        checked.ids("suppress_tokens"), checked.ids("begin_suppress_tokens"),
                        initial)


def speech_files(folder: Path, card: Any) -> list[Path]:
    """A Whisper folder's files that travel with it (import to built folder to export): its
    generation_config.json (read and checked) and its feature extractor's
    preprocessor_config.json where it has one (its mel bins checked against the card's); none
    for another card."""
    if not is_mel_card(card):
        return []
    folder = Path(folder)
    where = display_path(folder)
    tokens = inside(folder, GENERATION_CONFIG, where, "generation config")
    read_speech_tokens(folder, card["vocab_size"])
    processor = inside(folder, PREPROCESSOR_CONFIG, where, "preprocessor config")
    if not processor.is_file():
        return [tokens]
    check_settings(read_mel_settings(processor), card, display_path(processor))
    return [tokens, processor]


def check_settings(settings: MelSettings, card: Any, where: str) -> None:
    """The features are what the model reads: its mel bins, two frames per encoder state."""
    if settings.n_mels != card["n_mels"]:
        raise SpeechTokensError(f"{where}: feature_size={settings.n_mels}, but the model reads "
                                f"n_mels={card['n_mels']} mel bins")
    if settings.nb_max_frames != 2 * card["max_source_positions"]:
        raise SpeechTokensError(f"{where}: nb_max_frames={settings.nb_max_frames}, but the "
                                f"model reads {2 * card['max_source_positions']} frames "
                                "(2 x max_source_positions)")


def card_mel_settings(card: Any) -> MelSettings:
    """WhisperFeatureExtractor's settings for a card without a preprocessor_config.json (built
    from seed): its mel bins, windows of its 2 x max_source_positions frames of 10 ms."""
    defaults = default_mel_settings(card["n_mels"])
    frames = 2 * card["max_source_positions"]
    samples = frames * defaults.hop_length
    if samples % defaults.sampling_rate:
        raise SpeechTokensError(f"{card.name}: max_source_positions={card['max_source_positions']} "
                                "makes no whole number of seconds; give the export a "
                                "preprocessor_config.json")
    return replace(defaults, chunk_length=samples // defaults.sampling_rate,
                   n_samples=samples, nb_max_frames=frames)


def speech_generation(folder: Path, card: Any) -> dict[str, Any]:
    """The Whisper entries of an export's generation_config.json, from the one its built folder
    brought (`speech_files`); none for another card or a folder without one (a card built
    from seed has no languages)."""
    if not is_mel_card(card) or not (Path(folder) / GENERATION_CONFIG).is_file():
        return {}
    return read_speech_tokens(folder, card["vocab_size"]).generation_config()
