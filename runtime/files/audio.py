"""Audio to Whisper's `input_features` without torch (soundfile and numpy), as transformers'
WhisperFeatureExtractor computes them from `preprocessor_config.json`.

Reading: soundfile decodes the file (WAV, FLAC, and whatever libsndfile reads), the channels
are averaged into one (as transformers' audio loader and ffmpeg's `-ac 1` do), and the samples
are resampled to 16 kHz with a polyphase Kaiser-windowed sinc filter (scipy's resample_poly's
design, in numpy). The length is bounded: a file whose header says more than
MAX_AUDIO_SECONDS is refused before any sample is decoded.

Features: the samples padded or cut to 30 s, a centred STFT with a periodic Hann window
(torch.stft's reflect padding), Whisper's Slaney mel filters, log10, clamped to 8 below the
maximum, (x + 4) / 4; (n_mels, nb_max_frames) float32. Longer audio is cut into consecutive
30-s windows (`audio_windows`, `window_offsets`).
"""

from __future__ import annotations

import functools
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from registry.errors import ZooError, first_line, needs_package
from registry.paths import display_path
from runtime.files.atomic import atomic_write_bytes
from runtime.files.json_files import read_json

SAMPLE_RATE = 16000  # what Whisper reads
MAX_AUDIO_SECONDS = 2 * 60 * 60  # 2 hours: 240 windows of 30 s
RATES = (1000, 768000)  # the sample rates a file may declare (Hz, both included)
MAX_DECODED_RATE = 48000  # above it, a file may last less (max_frames)
BLOCK_FRAMES = 1 << 16  # frames decoded at a time (channels averaged block by block)
PREPROCESSOR_CONFIG = "preprocessor_config.json"
FEATURE_EXTRACTOR = "WhisperFeatureExtractor"
MEL_MAX_HZ = 8000.0  # WhisperFeatureExtractor's mel filters span 0 to 8 kHz


class AudioError(ZooError):
    """An audio file or a preprocessor_config.json that cannot be read."""


# --- reading -------------------------------------------------------------------------------

def read_audio(path: Path) -> np.ndarray:
    """The file at `path` as float32 mono samples at 16 kHz, refused in one line naming it
    where missing, not audio, truncated, of 0 channels, too long, empty or not finite."""
    where = display_path(path)
    if not Path(path).is_file():
        raise AudioError(f"{where}: no such file")
    return _decoded(str(path), where)


def decode_audio(data: bytes, name: str) -> np.ndarray:
    """Uploaded bytes as read_audio reads a file (`name` names them in errors)."""
    return _decoded(io.BytesIO(data), name)


def _decoded(source: Any, where: str) -> np.ndarray:
    soundfile = needs_package("soundfile", where)
    try:
        with soundfile.SoundFile(source) as sound:  # opening reads the header only
            rate, channels, frames = sound.samplerate, sound.channels, sound.frames
            _check_header(rate, channels, frames, where)
            samples = np.empty(frames, np.float32)  # at most max_frames(rate): checked
            read = 0
            for block in sound.blocks(max(1, BLOCK_FRAMES // channels), dtype="float32",
                                      always_2d=True):
                if read + len(block) > frames:  # more than the header said
                    raise AudioError(f"{where}: more samples than its header declares")
                samples[read:read + len(block)] = block.mean(axis=1, dtype=np.float32)
                read += len(block)
    except soundfile.SoundFileError as exc:  # not audio, truncated, corrupt, 0 channels
        reason = getattr(exc, "error_string", None) or first_line(exc)  # without the path
        raise AudioError(f"{where}: not audio soundfile can read ({reason})") from None
    samples = samples[:read]
    if samples.size == 0:
        raise AudioError(f"{where}: no samples (empty audio)")
    if not np.isfinite(samples).all():
        raise AudioError(f"{where}: a sample is NaN or infinite")
    return resample(samples, rate, SAMPLE_RATE)


def max_frames(rate: int) -> int:
    """The frames a file at `rate` Hz may hold: MAX_AUDIO_SECONDS, and above 48 kHz the
    samples of MAX_AUDIO_SECONDS at 48 kHz (the decoded samples' memory is bounded too:
    1.4 GB of float32, where a FLAC of silence at 768 kHz claiming 2 hours is a few MB)."""
    return MAX_AUDIO_SECONDS * min(rate, MAX_DECODED_RATE)


def _check_header(rate: int, channels: int, frames: int, where: str) -> None:
    if channels < 1:
        raise AudioError(f"{where}: the header says {channels} channels (at least 1 expected)")
    if not RATES[0] <= rate <= RATES[1]:
        raise AudioError(f"{where}: a sample rate of {rate} Hz (expected {RATES[0]} to "
                         f"{RATES[1]} Hz)")
    if frames > max_frames(rate):
        raise AudioError(f"{where}: {frames / rate / 3600:.1f} hours at {rate} Hz is longer "
                         f"than the {max_frames(rate) / rate / 3600:.3g} hours an audio file "
                         "may last (refused before decoding)")


# --- resampling ----------------------------------------------------------------------------

def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """`samples` at `rate` Hz resampled to `target` Hz: ceil(n * target / rate) samples,
    float32. The filter is scipy.signal.resample_poly's (a Kaiser window, beta 5, 10 zero
    crossings each side of the lower Nyquist), applied by phase so that only the taps that
    meet input samples are computed."""
    divisor = math.gcd(rate, target)
    up, down = target // divisor, rate // divisor
    if up == down:
        return np.asarray(samples, dtype=np.float32)
    half_len = 10 * max(up, down)
    taps = _lowpass(2 * half_len + 1, 1.0 / max(up, down)) * up
    return _polyphase(np.asarray(samples, dtype=np.float32), taps, up, down, half_len)


def _lowpass(length: int, cutoff: float) -> np.ndarray:
    """scipy.signal.firwin(length, cutoff, window=("kaiser", 5.0)): a windowed sinc whose
    taps sum to 1 (cutoff relative to Nyquist)."""
    offsets = np.arange(length) - (length - 1) / 2
    taps = cutoff * np.sinc(cutoff * offsets) * np.kaiser(length, 5.0)
    return taps / taps.sum()


def _polyphase(samples: np.ndarray, taps: np.ndarray, up: int, down: int,
               half_len: int) -> np.ndarray:
    """Output m is sum_j taps[j] * upsampled[m * down + half_len - j], where the upsampled
    signal holds sample u at u * up and zeros between: only the taps of one phase meet
    samples, so output m = sum_k phase[k] * samples[t // up - k] with t = m * down + half_len.
    Outputs m0, m0 + up, ... share a phase and step `down` samples apart."""
    count = -(-len(samples) * up // down)
    width = -(-len(taps) // up)  # taps per phase
    phases = np.zeros(width * up)
    phases[:len(taps)] = taps
    phases = phases.reshape(width, up).T[:, ::-1]  # phases[p] reversed: oldest sample first
    last = ((count - 1) * down + half_len) // up
    tail = max(0, last + 1 - len(samples))
    padded = np.concatenate([np.zeros(width, np.float32), samples, np.zeros(tail, np.float32)])
    windows = sliding_window_view(padded, width)  # windows[s + 1] ends at samples[s]
    out = np.empty(count, np.float32)  # each block summed in float64, the taps' type
    rows = max(1, BLOCK_FRAMES // width)
    for first in range(min(up, count)):
        start = first * down + half_len
        outputs = range(first, count, up)
        ends = windows[start // up + 1::down][:len(outputs)]
        for row in range(0, len(outputs), rows):
            out[outputs[row:row + rows]] = ends[row:row + rows] @ phases[start % up]
    return out


# --- features ------------------------------------------------------------------------------

@dataclass(frozen=True)
class MelSettings:
    """WhisperFeatureExtractor's settings (preprocessor_config.json's keys)."""

    n_mels: int  # feature_size
    sampling_rate: int = SAMPLE_RATE
    hop_length: int = 160
    chunk_length: int = 30  # seconds a window lasts
    n_fft: int = 400
    n_samples: int = 480000  # chunk_length * sampling_rate
    nb_max_frames: int = 3000  # n_samples // hop_length
    padding_value: float = 0.0


def default_mel_settings(n_mels: int) -> MelSettings:
    """WhisperFeatureExtractor's defaults at `n_mels` (80, or 128 for large-v3)."""
    return MelSettings(n_mels=n_mels)


def _whole(config: dict[str, Any], key: str, default: int, where: str, low: int,
           high: int, rule: str = "") -> int:
    """config[key] (default where absent), a whole number from low to high; `rule` says
    where a key has one value only (the one the others make)."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        wanted = f"{low} ({rule})" if rule else f"a whole number from {low} to {high}"
        raise AudioError(f"{where}: {key}={value!r} should be {wanted}")
    return value


def mel_settings(config: Any, where: str) -> MelSettings:
    """MelSettings from preprocessor_config.json's object (WhisperFeatureExtractor's defaults
    for missing keys); what the zoo cannot compute is refused naming the key."""
    if not isinstance(config, dict):
        raise AudioError(f"{where}: should be a JSON object")
    kind = config.get("feature_extractor_type", FEATURE_EXTRACTOR)
    if kind != FEATURE_EXTRACTOR:
        raise AudioError(f"{where}: feature_extractor_type={kind!r} is not supported (the zoo "
                         f"computes {FEATURE_EXTRACTOR})")
    rate = config.get("sampling_rate", SAMPLE_RATE)
    if rate != SAMPLE_RATE or isinstance(rate, bool):
        raise AudioError(f"{where}: sampling_rate={rate!r} should be {SAMPLE_RATE}")
    if config.get("dither", 0.0) not in (0, 0.0) or isinstance(config.get("dither"), bool):
        raise AudioError(f"{where}: dither={config['dither']!r} should be 0 (random noise is "
                         "not reproducible)")
    n_mels = _whole(config, "feature_size", 80, where, 1, 512)
    n_fft = _whole(config, "n_fft", 400, where, 2, 8192)
    hop = _whole(config, "hop_length", 160, where, 1, n_fft)
    chunk = _whole(config, "chunk_length", 30, where, 1, 300)
    n_samples = _whole(config, "n_samples", chunk * rate, where, chunk * rate, chunk * rate,
                       "chunk_length x sampling_rate")
    frames = _whole(config, "nb_max_frames", n_samples // hop, where, n_samples // hop,
                    n_samples // hop, "n_samples // hop_length")
    padding = config.get("padding_value", 0.0)
    if isinstance(padding, bool) or not isinstance(padding, int | float) or not math.isfinite(
            padding):
        raise AudioError(f"{where}: padding_value={padding!r} should be a finite number")
    if n_mels > n_fft // 2 + 1:
        raise AudioError(f"{where}: feature_size={n_mels} is more than the n_fft // 2 + 1 = "
                         f"{n_fft // 2 + 1} frequencies a frame has")
    return MelSettings(n_mels, rate, hop, chunk, n_fft, n_samples, frames, float(padding))


def read_mel_settings(path: Path) -> MelSettings:
    return mel_settings(read_json(path, AudioError), display_path(path))


def export_mel_settings(folder: Path) -> MelSettings:
    """The settings an export's audio is featurized with (its preprocessor_config.json)."""
    path = Path(folder) / PREPROCESSOR_CONFIG
    if not path.is_file():
        raise AudioError(f"{display_path(folder)}: no {PREPROCESSOR_CONFIG} (a speech model's "
                         "export has one)")
    return read_mel_settings(path)


def preprocessor_config(settings: MelSettings) -> dict[str, Any]:
    """preprocessor_config.json's object as WhisperFeatureExtractor.save_pretrained writes it
    (transformers.js and Optimum read it)."""
    return {"chunk_length": settings.chunk_length, "dither": 0.0,
            "feature_extractor_type": FEATURE_EXTRACTOR, "feature_size": settings.n_mels,
            "hop_length": settings.hop_length, "n_fft": settings.n_fft,
            "n_samples": settings.n_samples, "nb_max_frames": settings.nb_max_frames,
            "padding_side": "right", "padding_value": settings.padding_value,
            "return_attention_mask": False, "sampling_rate": settings.sampling_rate}


def write_preprocessor_config(folder: Path, settings: MelSettings) -> Path:
    """Write `folder`/preprocessor_config.json atomically (sorted keys, two-space indent, as
    transformers' to_json_string)."""
    path = Path(folder) / PREPROCESSOR_CONFIG
    text = json.dumps(preprocessor_config(settings), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


@functools.lru_cache(maxsize=8)
def mel_filters(n_mels: int, n_fft: int, sampling_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Slaney-style mel filters (librosa's and Whisper's): (n_fft // 2 + 1, n_mels) triangles
    evenly spaced on the Slaney mel scale from 0 to 8 kHz, each scaled to unit area."""
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(MEL_MAX_HZ), n_mels + 2)
    edges = _mel_to_hz(mels)  # each filter's left, centre and right
    bins = np.linspace(0, sampling_rate // 2, n_fft // 2 + 1)
    slopes = edges[None, :] - bins[:, None]
    rising = -slopes[:, :-2] / np.diff(edges)[:-1]
    falling = slopes[:, 2:] / np.diff(edges)[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    filters *= 2.0 / (edges[2:] - edges[:-2])
    filters.flags.writeable = False
    return filters


# The Slaney mel scale: linear (3 mels per 200 Hz) below 1 kHz, logarithmic above.
_LOG_HZ, _LOG_MEL, _MELS_PER_LOG = 1000.0, 15.0, 27.0 / math.log(6.4)


def _hz_to_mel(hz: float) -> float:
    return 3.0 * hz / 200.0 if hz < _LOG_HZ else _LOG_MEL + math.log(hz / _LOG_HZ) * _MELS_PER_LOG


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    linear = 200.0 * mels / 3.0
    logarithmic = _LOG_HZ * np.exp((mels - _LOG_MEL) / _MELS_PER_LOG)
    return np.where(mels >= _LOG_MEL, logarithmic, linear)


def log_mel(samples: np.ndarray, settings: MelSettings) -> np.ndarray:
    """(n_mels, nb_max_frames) float32: the first n_samples samples (padded with
    padding_value), as WhisperFeatureExtractor's input_features."""
    samples = np.asarray(samples, dtype=np.float32)[:settings.n_samples]
    padded = np.full(settings.n_samples, settings.padding_value, dtype=np.float64)
    padded[:len(samples)] = samples
    half = settings.n_fft // 2
    centred = np.pad(padded, half, mode="reflect")  # torch.stft(center=True)
    frames = sliding_window_view(centred, settings.n_fft)[::settings.hop_length]
    frames = frames[:settings.nb_max_frames]  # Whisper drops the last frame
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(settings.n_fft) / settings.n_fft)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    mel = mel_filters(settings.n_mels, settings.n_fft, settings.sampling_rate).T @ power.T
    logs = np.log10(np.maximum(mel, 1e-10))
    logs = np.maximum(logs, logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).astype(np.float32)


def audio_windows(samples: np.ndarray, settings: MelSettings) -> list[np.ndarray]:
    """Whisper's sequential long form: consecutive chunk_length windows' features (the last
    one padded); at least one window, for audio of any length."""
    return [log_mel(samples[offset:offset + settings.n_samples], settings)
            for offset in range(0, max(len(samples), 1), settings.n_samples)]


def window_offsets(samples: np.ndarray, settings: MelSettings) -> list[float]:
    """Where each of audio_windows' windows starts, in seconds (to shift its timestamps)."""
    return [offset / settings.sampling_rate
            for offset in range(0, max(len(samples), 1), settings.n_samples)]
