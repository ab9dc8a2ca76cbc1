"""Audio preprocessing without torch (runtime/files/audio.py): files the test writes with
soundfile (WAV at 8, 16 and 44.1 kHz, mono and stereo, int16 and float, FLAC) decoded to the
PCM values the test wrote, channels averaged and resampled as scipy.signal.resample_poly does;
log-mel features equal to transformers' WhisperFeatureExtractor; preprocessor_config.json as
transformers writes and reads it; files that must be refused (truncated, not audio, 0 channels,
a NaN sample, a header claiming 10 hours) in one line naming the file, before decoding."""

from __future__ import annotations

import json
import struct
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from runtime.files.audio import (
    MAX_AUDIO_SECONDS,
    AudioError,
    audio_windows,
    decode_audio,
    default_mel_settings,
    export_mel_settings,
    log_mel,
    mel_settings,
    read_audio,
    read_mel_settings,
    window_offsets,
    write_preprocessor_config,
)

soundfile = pytest.importorskip("soundfile")
signal = pytest.importorskip("scipy.signal")
whisper_features = pytest.importorskip("transformers.models.whisper.feature_extraction_whisper")

# rate, channels, soundfile subtype, container
FILES = [(8000, 1, "PCM_16", "WAV"), (16000, 2, "PCM_16", "WAV"), (44100, 2, "FLOAT", "WAV"),
         (44100, 1, "PCM_16", "FLAC"), (8000, 2, "FLOAT", "WAV"), (48000, 1, "PCM_16", "WAV")]


def pcm(rate: int, channels: int, subtype: str, seconds: float = 0.5) -> np.ndarray:
    """(frames, channels) samples exactly representable in `subtype`: int16 steps / 32768."""
    rng = np.random.default_rng(rate + channels)
    steps = rng.integers(-20000, 20000, (int(rate * seconds), channels))
    return (steps / 32768.0).astype(np.float32 if subtype == "FLOAT" else np.float64)


@pytest.mark.parametrize(("rate", "channels", "subtype", "container"), FILES)
def test_files_decode_to_the_mean_of_channels_resampled(tmp_path: Path, rate: int,
                                                        channels: int, subtype: str,
                                                        container: str) -> None:
    written = pcm(rate, channels, subtype)
    path = tmp_path / f"a.{container.lower()}"
    soundfile.write(path, written, rate, subtype=subtype, format=container)
    mono = written.astype(np.float64).mean(axis=1)  # transformers' loader and ffmpeg -ac 1
    expected = mono if rate == 16000 else signal.resample_poly(mono, 16000, rate)
    for samples in (read_audio(path), decode_audio(path.read_bytes(), "upload")):
        assert samples.dtype == np.float32 and samples.shape == expected.shape
        np.testing.assert_allclose(samples, expected, atol=1e-5, rtol=0)


def test_a_resampled_tone_is_the_same_tone() -> None:
    """Independent of scipy: a 440 Hz sine at 44.1 kHz is, at 16 kHz, the 440 Hz sine."""
    from runtime.files.audio import resample

    def tone(rate: int) -> np.ndarray:
        return 0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)

    for rate in (8000, 44100):
        inner = slice(1000, -1000)  # the filter's edges see the zeros past the ends
        np.testing.assert_allclose(resample(tone(rate), rate)[inner], tone(16000)[inner],
                                   atol=2e-3, rtol=0)


def reference_features(samples: np.ndarray, n_mels: int, numpy_path: bool,
                       monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """WhisperFeatureExtractor's input_features; `numpy_path`: its float64 numpy STFT (taken
    where torch is not installed) instead of torch.stft in float32."""
    monkeypatch.setattr(whisper_features, "is_torch_available", lambda: not numpy_path)
    extractor = whisper_features.WhisperFeatureExtractor(feature_size=n_mels)
    return extractor(samples, sampling_rate=16000, return_tensors="np").input_features[0]


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """A tone that swells and fades in noise (loud and near-silent frames both)."""
    time = np.arange(int(seconds * 16000)) / 16000
    noise = np.random.default_rng(seed).standard_normal(len(time))
    return (0.3 * np.sin(2 * np.pi * 440 * time) * np.sin(np.pi * time / 3)
            + 0.05 * noise).astype(np.float32)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("seconds", [0.5, 7, 30, 31])
def test_log_mel_is_whisper_feature_extractor(n_mels: int, seconds: float,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    samples = speech_like(seconds)
    ours = log_mel(samples, default_mel_settings(n_mels))
    assert ours.dtype == np.float32 and ours.shape == (n_mels, 3000)
    expected = reference_features(samples, n_mels, True, monkeypatch)
    np.testing.assert_allclose(ours, expected, atol=1e-5, rtol=0)
    # transformers' torch path rounds in float32: its two paths differ by up to ~7e-5
    expected = reference_features(samples, n_mels, False, monkeypatch)
    np.testing.assert_allclose(ours, expected, atol=2e-4, rtol=0)


def test_long_audio_is_cut_into_30_second_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = speech_like(65)
    settings = default_mel_settings(80)
    windows = audio_windows(samples, settings)
    assert window_offsets(samples, settings) == [0.0, 30.0, 60.0]
    assert len(windows) == 3
    for window, start in zip(windows, (0, 30, 60), strict=True):
        part = samples[start * 16000:(start + 30) * 16000]
        np.testing.assert_allclose(window, reference_features(part, 80, True, monkeypatch),
                                   atol=1e-5, rtol=0)
    assert len(audio_windows(samples[:0], settings)) == 1  # silence: one padded window


def test_preprocessor_config_is_transformers(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    whisper_features.WhisperFeatureExtractor(feature_size=128).save_pretrained(theirs)
    ours.mkdir()
    write_preprocessor_config(ours, default_mel_settings(128))
    name = "preprocessor_config.json"
    assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text())
    assert read_mel_settings(theirs / name) == default_mel_settings(128)
    assert export_mel_settings(ours) == default_mel_settings(128)
    with pytest.raises(AudioError, match="no preprocessor_config.json"):
        export_mel_settings(tmp_path)
    loaded = whisper_features.WhisperFeatureExtractor.from_pretrained(ours)
    assert (loaded.feature_size, loaded.nb_max_frames, loaded.n_samples) == (128, 3000, 480000)


@pytest.mark.parametrize(("change", "key"), [
    ({"feature_size": 0}, "feature_size"), ({"feature_size": 80.0}, "feature_size"),
    ({"sampling_rate": 8000}, "sampling_rate"), ({"hop_length": "160"}, "hop_length"),
    ({"n_samples": 16000}, "n_samples"), ({"nb_max_frames": 1500}, "nb_max_frames"),
    ({"padding_value": None}, "padding_value"), ({"dither": 0.1}, "dither"),
    ({"feature_extractor_type": "ASTFeatureExtractor"}, "feature_extractor_type"),
    ({"n_fft": 200, "feature_size": 128}, "feature_size")])
def test_a_config_it_cannot_follow_is_refused_by_key(change: dict, key: str) -> None:
    config = {**whisper_features.WhisperFeatureExtractor().to_dict(), **change}
    with pytest.raises(AudioError) as refused:
        mel_settings(config, "m/preprocessor_config.json")
    assert str(refused.value).startswith(f"m/preprocessor_config.json: {key}=")


def wav_header(channels: int, rate: int, bits: int, data_bytes: int) -> bytes:
    """A canonical 44-byte PCM WAV header declaring `data_bytes` of samples."""
    align = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * align, align, bits)
            + b"data" + struct.pack("<I", data_bytes))


def long_flac(tmp_path: Path, rate: int, hours: float) -> bytes:
    """A short FLAC whose STREAMINFO says `hours` (its 36-bit total-samples field)."""
    soundfile.write(tmp_path / "short.flac", np.zeros(1600), rate)
    data = bytearray((tmp_path / "short.flac").read_bytes())
    fields = int.from_bytes(data[18:26], "big")  # rate, channels, bits, total samples
    fields = (fields >> 36 << 36) | int(rate * 3600 * hours)
    data[18:26] = fields.to_bytes(8, "big")
    return bytes(data)


def refused_files(tmp_path: Path) -> dict[str, tuple[bytes, str]]:
    """name: (the file's bytes, part of the refusal)."""
    soundfile.write(tmp_path / "good.wav", pcm(16000, 2, "PCM_16"), 16000)
    soundfile.write(tmp_path / "good.flac", pcm(16000, 1, "PCM_16"), 16000)
    good_wav = (tmp_path / "good.wav").read_bytes()
    good_flac = (tmp_path / "good.flac").read_bytes()
    nan = np.zeros((800, 1), np.float32)
    nan[400] = np.nan
    soundfile.write(tmp_path / "nan.wav", nan, 16000, subtype="FLOAT")
    inf = nan.copy()
    inf[400] = np.inf
    soundfile.write(tmp_path / "inf.wav", inf, 16000, subtype="FLOAT")
    return {
        "header-cut.wav": (good_wav[:30], "not audio soundfile can read"),
        "cut.flac": (good_flac[:len(good_flac) // 2], "not audio soundfile can read"),
        "text.wav": (b"these are words, not samples\n" * 10, "not audio soundfile can read"),
        "no-channels.wav": (wav_header(0, 16000, 16, 1000) + bytes(1000),
                            "Channel count is zero"),
        "nan.wav": ((tmp_path / "nan.wav").read_bytes(), "NaN or infinite"),
        "inf.wav": ((tmp_path / "inf.wav").read_bytes(), "NaN or infinite"),
        "empty.wav": (wav_header(1, 16000, 16, 0), "no samples"),
        "slow.wav": (wav_header(1, 10, 16, 20) + bytes(20), "sample rate of 10 Hz"),
        "ten-hours.flac": (long_flac(tmp_path, 16000, 10),
                           "10.0 hours at 16000 Hz is longer than the 2 hours"),
        # above 48 kHz, the samples of 2 hours at 48 kHz: a FLAC of silence is a few MB
        "fast.flac": (long_flac(tmp_path, 96000, 1.5),
                      "1.5 hours at 96000 Hz is longer than the 1 hours"),
    }


def test_bad_files_are_refused_in_one_line_naming_them(tmp_path: Path) -> None:
    for name, (data, part) in refused_files(tmp_path).items():
        path = tmp_path / name
        path.write_bytes(data)
        for read in (partial(read_audio, path), partial(decode_audio, data, name)):
            with pytest.raises(AudioError) as refused:
                read()
            message = str(refused.value)
            assert "\n" not in message and name in message and part in message, message
    with pytest.raises(AudioError, match="missing.wav: no such file"):
        read_audio(tmp_path / "missing.wav")


def test_a_ten_hour_wav_is_refused_from_its_header(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """10 hours of 8-bit 8 kHz samples declared, the file sparse (no samples written); no
    sample is decoded (soundfile's readers are planted to fail)."""
    assert MAX_AUDIO_SECONDS == 2 * 3600
    path = tmp_path / "ten-hours.wav"
    samples = 8000 * 3600 * 10
    with path.open("wb") as stream:
        stream.write(wav_header(1, 8000, 8, samples))
        stream.truncate(44 + samples)

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("samples were decoded")

    monkeypatch.setattr(soundfile.SoundFile, "blocks", no_decoding)
    monkeypatch.setattr(soundfile.SoundFile, "read", no_decoding)
    with pytest.raises(AudioError, match=r"ten-hours.wav: 10.0 hours at 8000 Hz is longer "
                                         r"than the 2 hours an audio file may last \(refused"):
        read_audio(path)
