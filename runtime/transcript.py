"""A transcript and its forms in OpenAI's `POST /v1/audio/transcriptions` (`response_format`):
json and verbose_json shaped as the openai client's `Transcription` and
`TranscriptionVerbose` (segments as `TranscriptionSegment`), plain text, SubRip (srt) and
WebVTT (vtt) subtitles as the API returns them. Standard library only."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass

from registry.errors import ZooError

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
TIMED_FORMATS = ("srt", "verbose_json", "vtt")  # the forms that carry segments' times
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"

# Whisper's languages (code: the name verbose_json's `language` gives), in its token order
LANGUAGES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
    "la": "latin", "mi": "maori", "ml": "malayalam", "cy": "welsh", "sk": "slovak",
    "te": "telugu", "fa": "persian", "lv": "latvian", "bn": "bengali", "sr": "serbian",
    "az": "azerbaijani", "sl": "slovenian", "kn": "kannada", "et": "estonian", "mk": "macedonian",
    "br": "breton", "eu": "basque", "is": "icelandic", "hy": "armenian", "ne": "nepali",
    "mn": "mongolian", "bs": "bosnian", "kk": "kazakh", "sq": "albanian", "sw": "swahili",
    "gl": "galician", "mr": "marathi", "pa": "punjabi", "si": "sinhala", "km": "khmer",
    "sn": "shona", "yo": "yoruba", "so": "somali", "af": "afrikaans", "oc": "occitan",
    "ka": "georgian", "be": "belarusian", "tg": "tajik", "sd": "sindhi", "gu": "gujarati",
    "am": "amharic", "yi": "yiddish", "lo": "lao", "uz": "uzbek", "fo": "faroese",
    "ht": "haitian creole", "ps": "pashto", "tk": "turkmen", "nn": "nynorsk", "mt": "maltese",
    "sa": "sanskrit", "lb": "luxembourgish", "my": "myanmar", "bo": "tibetan", "tl": "tagalog",
    "mg": "malagasy", "as": "assamese", "tt": "tatar", "haw": "hawaiian", "ln": "lingala",
    "ha": "hausa", "ba": "bashkir", "jw": "javanese", "su": "sundanese", "yue": "cantonese",
}


@dataclass(frozen=True)
class Segment:
    """A stretch of the transcript, its times in seconds from the audio's start. The scores
    are what Whisper's decoding measured (verbose_json reports them); `seek` is the mel frame
    (100 a second) its window starts at."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    temperature: float = 0.0
    seek: int = 0


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None  # a code of LANGUAGES; None where none was told or detected
    duration: float  # seconds of audio
    segments: tuple[Segment, ...]


def compression_ratio(text: str) -> float:
    """Whisper's repetition score: the text's UTF-8 length over its zlib-compressed length."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def format_transcript(transcript: Transcript, response_format: str) -> tuple[str, str]:
    """(body, media type) of the transcript in one of RESPONSE_FORMATS."""
    if response_format not in RESPONSE_FORMATS:
        raise ZooError(f"response_format={response_format!r} should be one of "
                       f"{', '.join(RESPONSE_FORMATS)}")
    text = transcript.text.strip()
    if response_format == "text":
        return text + "\n", TEXT_TYPE
    if response_format == "srt":
        return _subtitles(transcript.segments, ",", numbered=True), TEXT_TYPE
    if response_format == "vtt":
        return "WEBVTT\n\n" + _subtitles(transcript.segments, ".", numbered=False), TEXT_TYPE
    usage = {"type": "duration", "seconds": math.ceil(transcript.duration)}  # billed seconds
    if response_format == "json":
        return json.dumps({"text": text, "usage": usage}, ensure_ascii=False), JSON_TYPE
    verbose = {"task": "transcribe", "language": LANGUAGES.get(transcript.language or "",
                                                                 "unknown"),
               "duration": transcript.duration, "text": text,
               "segments": [_verbose_segment(index, segment)
                            for index, segment in enumerate(transcript.segments)],
               "usage": usage}
    return json.dumps(verbose, ensure_ascii=False), JSON_TYPE


def _verbose_segment(index: int, segment: Segment) -> dict[str, object]:
    return {"id": index, "seek": segment.seek, "start": segment.start, "end": segment.end,
            "text": segment.text, "tokens": list(segment.tokens),
            "temperature": segment.temperature, "avg_logprob": segment.avg_logprob,
            "compression_ratio": compression_ratio(segment.text),
            "no_speech_prob": segment.no_speech_prob}


def timestamp(seconds: float, decimal_mark: str) -> str:
    """HH:MM:SS,mmm (SubRip) or HH:MM:SS.mmm (WebVTT), to the nearest millisecond."""
    milliseconds = max(0, round(seconds * 1000))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{decimal_mark}{milliseconds:03d}"


def _subtitles(segments: tuple[Segment, ...], decimal_mark: str, numbered: bool) -> str:
    """One cue per segment: (its number,) its times, its text (stripped, and `-->` written
    `->` so that a text cannot end its cue, as Whisper's writers do), a blank line."""
    cues = []
    for number, segment in enumerate(segments, start=1):
        times = (f"{timestamp(segment.start, decimal_mark)} --> "
                 f"{timestamp(segment.end, decimal_mark)}")
        text = segment.text.strip().replace("-->", "->")
        cues.append((f"{number}\n" if numbered else "") + f"{times}\n{text}\n\n")
    return "".join(cues)
