"""A transcript in OpenAI's response formats (runtime/transcript.py): json and verbose_json
read back by the openai client's own models (`Transcription`, `TranscriptionVerbose`,
`TranscriptionSegment`) with every value, text with its newline, and SubRip / WebVTT cues
written out by hand from the formats' rules (HH:MM:SS,mmm and HH:MM:SS.mmm)."""

from __future__ import annotations

import json
import zlib

import pytest

from registry.errors import ZooError
from runtime.transcript import Segment, Transcript, format_transcript

audio_types = pytest.importorskip("openai.types.audio")

TRANSCRIPT = Transcript(
    text=" Hello there. Ça va --> bien?", language="fr", duration=3662.25,
    segments=(Segment(0.0, 2.5, " Hello there.", (50364, 2425, 456, 13), avg_logprob=-0.25,
                      no_speech_prob=0.01, temperature=0.2),
              Segment(3661.0007, 3662.25, " Ça va --> bien?", (50, 51), seek=366000)))


def test_json_is_the_clients_transcription() -> None:
    body, media_type = format_transcript(TRANSCRIPT, "json")
    assert media_type == "application/json"
    parsed = audio_types.Transcription.model_validate(json.loads(body))
    assert parsed.text == "Hello there. Ça va --> bien?"
    assert (parsed.usage.type, parsed.usage.seconds) == ("duration", 3663)


def test_verbose_json_is_the_clients_transcription_verbose() -> None:
    body, media_type = format_transcript(TRANSCRIPT, "verbose_json")
    assert media_type == "application/json"
    parsed = audio_types.TranscriptionVerbose.model_validate(json.loads(body))
    assert (parsed.language, parsed.duration) == ("french", 3662.25)
    assert parsed.text == "Hello there. Ça va --> bien?"
    first, second = parsed.segments
    assert isinstance(first, audio_types.TranscriptionSegment)
    assert (first.id, first.start, first.end, first.text, first.tokens) == (
        0, 0.0, 2.5, " Hello there.", [50364, 2425, 456, 13])
    assert (first.avg_logprob, first.no_speech_prob, first.temperature, first.seek) == (
        -0.25, 0.01, 0.2, 0)
    data = b" Hello there."
    assert first.compression_ratio == len(data) / len(zlib.compress(data))  # Whisper's score
    assert (second.id, second.seek, second.tokens) == (1, 366000, [50, 51])
    unknown = Transcript("x", None, 1.0, ())
    assert json.loads(format_transcript(unknown, "verbose_json")[0])["language"] == "unknown"


def test_text_srt_and_vtt() -> None:
    assert format_transcript(TRANSCRIPT, "text") == ("Hello there. Ça va --> bien?\n",
                                                     "text/plain; charset=utf-8")
    srt, media_type = format_transcript(TRANSCRIPT, "srt")
    assert media_type == "text/plain; charset=utf-8"
    assert srt == ("1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
                   "2\n01:01:01,001 --> 01:01:02,250\nÇa va -> bien?\n\n")
    vtt, media_type = format_transcript(TRANSCRIPT, "vtt")
    assert media_type == "text/plain; charset=utf-8"
    assert vtt == ("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n"
                   "01:01:01.001 --> 01:01:02.250\nÇa va -> bien?\n\n")


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ZooError, match="response_format='xml' should be one of json, text"):
        format_transcript(TRANSCRIPT, "xml")
