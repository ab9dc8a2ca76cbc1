"""Whisper (registry/maps/whisper.yaml, registry/stems.py's mel stem, cards whisper-*): the counts
against transformers' WhisperForConditionalGeneration on the meta device, the stem's sinusoids
against transformers' formula, and a tiny random WhisperForConditionalGeneration folder
(tests/support/whisper_folder.py) imported: teacher-forced logits and greedy transcript tokens
(language and task forced, with and without timestamps) equal to transformers' in PyTorch, and
exported: the same logits through ONNX Runtime (plain; --optimize is slow), in the layout the
clients read, the decoder's steps never reading the audio's states.
transformers is the reference: no download."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from registry.params import total_parameters
from runtime.contract import LAYOUT_DECODER, LAYOUT_ENCODER
from runtime.exported import load
from runtime.files.audio import export_mel_settings, log_mel
from runtime.speech_rules import next_token
from runtime.speech_tokens import SpeechTokens, read_speech_tokens
from runtime.transcribe import TranscribeOptions, Transcriber
from tests.conftest import card
from tests.support.helpers import (
    assert_error_after_progress,
    assert_one_line_error,
    zoo,
    zoo_ok,
)
from tests.support.whisper_folder import N_MELS, SECONDS, whisper_folder
from zoo.assemble import build_model
from zoo.blocks.mel_frames import whisper_sinusoids
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.whisper.modeling_whisper")

ATOL = 1e-4
BASE = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)


@pytest.mark.parametrize(("name", "sizes", "published"), [
    ("whisper-tiny", {}, 37_760_640), ("whisper-base", BASE, 72_593_920)])
def test_counts_are_transformers(name: str, sizes: dict[str, int], published: int) -> None:
    """openai/whisper-tiny and -base (transformers' defaults are tiny's sizes)."""
    with torch.device("meta"):
        reference = transformers.WhisperForConditionalGeneration(
            transformers.WhisperConfig(**sizes))
        model = build_model(card(name), meta=True)
    assert sum(p.numel() for p in reference.parameters()) == published
    assert sum(p.numel() for p in model.parameters()) == published
    assert total_parameters(card(name).fields) == published


def test_the_test_card_counts_as_transformers(source: tuple[Path, torch.nn.Module]) -> None:
    _, reference = source
    assert total_parameters(card("whisper-tiny-test").fields) == sum(
        p.numel() for p in reference.parameters())


@pytest.mark.parametrize(("length", "channels"), [(1500, 384), (250, 64)])
def test_sinusoids_are_transformers(length: int, channels: int) -> None:
    """The stem's table is Whisper's (its timescales over channels/2 - 1, not Vaswani's);
    transformers computes its angles (up to 1500 radians) in float32, the stem in float64,
    hence 2e-4."""
    expected = modeling.sinusoids(length, channels)
    torch.testing.assert_close(whisper_sinusoids(length, channels), expected, atol=2e-4, rtol=0)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return whisper_folder(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def built(source: tuple[Path, torch.nn.Module]) -> Path:
    folder, _ = source
    out = folder.parent / "built"
    zoo_ok("import", folder, "-o", out)
    return out


@pytest.fixture(scope="module")
def exports(built: Path) -> dict[str, Path]:
    """The export of each variant, made when a test first asks for it."""

    class Exports(dict):
        def __missing__(self, variant: str) -> Path:
            flags = ("--optimize",) if variant == "optimize" else ()
            out = built.parent / variant
            zoo_ok("export", built, "--onnx", "--out", out, *flags)
            self[variant] = out
            return out

    return Exports()


def features(batch: int, seed: int = 0) -> torch.Tensor:
    """Log-mel-like frames of whisper-tiny-test's 5 s (transformers' encoder reads only that)."""
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal((batch, N_MELS, SECONDS * 100))
                            .astype(np.float32))


def test_imported_logits_are_transformers(source: tuple[Path, torch.nn.Module],
                                          built: Path) -> None:
    _, reference = source
    model, _ = load_built(built)
    values = features(2)
    targets = torch.tensor([[257, 258, 261, 265, 40, 41, 300], [257, 259, 260, 266, 90, 91, 92]])
    with torch.no_grad():
        expected = reference(input_features=values, decoder_input_ids=targets).logits
        got = model(values, targets)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_imported_sinusoids_are_the_formula(built: Path) -> None:
    """transformers saves the encoder's positions as a weight; the import reads it, and it is
    the stem's own formula."""
    model, _ = load_built(built)
    torch.testing.assert_close(model.source_embeddings.positions,
                               whisper_sinusoids(SECONDS * 50, 64), atol=1e-4, rtol=0)


def test_special_tokens_are_read_from_generation_config(built: Path) -> None:
    tokens = read_speech_tokens(built, 1767)
    assert (tokens.start, tokens.end, tokens.no_timestamps) == (257, 256, 265)
    assert tokens.languages == {"en": 258, "fr": 259}
    assert tokens.tasks == {"translate": 260, "transcribe": 261}
    assert tokens.begin_suppress == (220, 256) and tokens.suppress == (262, 263, 264)
    assert tokens.prompt("fr", "translate", timestamps=False) == [257, 259, 260, 265]


def greedy(model: torch.nn.Module, values: torch.Tensor, tokens: SpeechTokens, prompt: list[int],
           timestamps: bool, max_length: int) -> list[int]:
    """The zoo's model step by step with both caches, under runtime/speech_rules.py."""
    with torch.no_grad():
        cross = model.cross_cache(model.encode(values))
        logits, past = model.decode(torch.tensor([prompt]), cross)
        generated: list[int] = []
        while len(prompt) + len(generated) < max_length:
            token = next_token(logits[0, -1].numpy(), generated, tokens, timestamps)
            generated.append(token)
            if token == tokens.end:
                break
            logits, past = model.decode(torch.tensor([[token]]), cross, None, past)
    return generated


@pytest.mark.parametrize(("language", "task", "timestamps"), [
    ("en", "transcribe", False), ("fr", "translate", False), ("en", "transcribe", True)])
def test_greedy_tokens_are_transformers_generate(source: tuple[Path, torch.nn.Module],
                                                 built: Path, language: str, task: str,
                                                 timestamps: bool) -> None:
    _, reference = source
    model, _ = load_built(built)
    tokens = read_speech_tokens(built, 1767)
    for seed in (len(language) + len(task) + timestamps,):  # one clip each, a different one
        values = features(1, seed=seed)
        with torch.no_grad():
            output = reference.generate(values, language=language, task=task,
                                        return_timestamps=timestamps,
                                        return_dict_in_generate=True)
        prompt = tokens.prompt(language, task, timestamps)
        got = greedy(model, values, tokens, prompt, timestamps, max_length=64)
        if not timestamps:
            returned = output["sequences"][0].tolist()
            assert returned[:len(prompt)] == prompt and got == returned[len(prompt):]
            continue
        # with timestamps transformers returns the text up to the last whole segment; the
        # tokens its one generate call chose are the segments' `result`
        raw = output["segments"][0][-1]["result"]["sequences"].tolist()
        assert raw[:len(prompt)] == prompt and got == raw[len(prompt):]
        returned = output["sequences"][0].tolist()
        assert got[:len(returned)] == returned
        assert sum(token > tokens.no_timestamps for token in got) >= 2


def test_a_setting_the_blocks_do_not_compute_is_refused(source: tuple[Path, torch.nn.Module],
                                                        tmp_path: Path) -> None:
    folder, _ = source
    config = json.loads((folder / "config.json").read_text())
    changed = tmp_path / "hf"
    changed.mkdir()
    for name in ("model.safetensors", "generation_config.json", "tokenizer.json"):
        (changed / name).write_bytes((folder / name).read_bytes())
    (changed / "config.json").write_text(json.dumps({**config, "scale_embedding": True}))
    assert_one_line_error(zoo("import", changed, "-o", tmp_path / "out"), "scale_embedding=True")
    assert not (tmp_path / "out").exists()


def test_a_folder_without_its_special_tokens_is_refused(source: tuple[Path, torch.nn.Module],
                                                        tmp_path: Path) -> None:
    folder, _ = source
    changed = tmp_path / "hf"
    changed.mkdir()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (changed / name).write_bytes((folder / name).read_bytes())
    generation = json.loads((folder / "generation_config.json").read_text())
    for change, message in (({"no_timestamps_token_id": 5000},
                             "no_timestamps_token_id=5000 should be a token id below"),
                            ({"forced_decoder_ids": [[1, None], [2, 9999]]},
                             "forced_decoder_ids=9999 should be a token id below"),
                            ({"task_to_id": {"transcribe": 261}}, "task_to_id has no translate"),
                            ({"lang_to_id": ["<|en|>"]}, "lang_to_id should map names")):
        (changed / "generation_config.json").write_text(json.dumps({**generation, **change}))
        assert_one_line_error(zoo("import", changed, "-o", tmp_path / "out"), message)
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", ["plain", pytest.param("optimize", marks=pytest.mark.slow)])
def test_onnx_logits_are_transformers(source: tuple[Path, torch.nn.Module],
                                      exports: dict[str, Path], variant: str) -> None:
    """encoder.onnx's memory and decoder.onnx's teacher-forced logits (over encoder.onnx's
    cross cache), and the clients' encoder_model.onnx's memory, against transformers'."""
    _, reference = source
    values = features(2, seed=3)
    targets = np.array([[257, 258, 261, 265, 40, 41], [257, 259, 260, 300, 90, 91]])
    with torch.no_grad():
        expected = reference(input_features=values, decoder_input_ids=torch.from_numpy(targets))
    runtime = load(exports[variant]).runtime
    encoded = runtime.run("encoder.onnx", {"input_features": values.numpy()})
    memory = expected.encoder_last_hidden_state.numpy()
    np.testing.assert_allclose(encoded["last_hidden_state"], memory, atol=ATOL, rtol=0)
    layout = runtime.run(LAYOUT_ENCODER, {"input_features": values.numpy()})
    np.testing.assert_allclose(layout["last_hidden_state"], memory, atol=ATOL, rtol=0)
    cross = {name.replace("present", "past_key_values"): value
             for name, value in encoded.items() if name.startswith("present")}
    empty = {f"past_key_values.{i}.decoder.{kind}": np.zeros((2, 4, 0, 16), np.float32)
             for i in range(2) for kind in ("key", "value")}
    logits = runtime.run("decoder.onnx", {"input_ids": targets, **cross, **empty})["logits"]
    np.testing.assert_allclose(logits, expected.logits.numpy(), atol=ATOL, rtol=0)


def test_export_is_in_the_clients_layout(exports: dict[str, Path]) -> None:
    """Optimum's and transformers.js's Whisper graphs: input_features alone into the encoder,
    no mask into the merged decoder; config.json a WhisperConfig, the generation tokens
    beside it."""
    folder = exports["plain"]
    names = {}
    for file in (LAYOUT_ENCODER, LAYOUT_DECODER):
        graph = onnx.load(str(folder / file), load_external_data=False).graph
        names[file] = ([i.name for i in graph.input], [o.name for o in graph.output])
    assert names[LAYOUT_ENCODER] == (["input_features"], ["last_hidden_state"])
    inputs, outputs = names[LAYOUT_DECODER]
    assert inputs[:2] == ["input_ids", "encoder_hidden_states"]
    assert inputs[-1] == "use_cache_branch" and "encoder_attention_mask" not in inputs
    assert outputs[:3] == ["logits", "present.0.decoder.key", "present.0.decoder.value"]
    config = transformers.WhisperConfig.from_pretrained(folder)
    assert (config.num_mel_bins, config.max_source_positions, config.d_model) == (N_MELS, 250, 64)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["lang_to_id"] == {"<|en|>": 258, "<|fr|>": 259}
    assert generation["no_timestamps_token_id"] == 265 and generation["decoder_start_token_id"] \
        == 257
    assert json.loads((folder / "preprocessor_config.json").read_text())["feature_size"] == N_MELS


def test_the_decoder_steps_never_read_the_audio_states(exports: dict[str, Path]) -> None:
    """Why a step's time is flat in the audio's length: decoder.onnx takes the cross keys and
    values as inputs (computed once, by encoder.onnx) and has no input of the encoder's states;
    the merged decoder's later steps (use_cache_branch true) have no node that reads
    encoder_hidden_states (its first step projects them, once)."""
    folder = exports["plain"]
    decoder = onnx.load(str(folder / "decoder.onnx"), load_external_data=False).graph
    inputs = [i.name for i in decoder.input]
    assert "encoder_hidden_states" not in inputs
    assert sum(name.endswith(".encoder.key") for name in inputs) == 2
    merged = onnx.load(str(folder / LAYOUT_DECODER), load_external_data=False).graph
    switch = next(node for node in merged.node if node.op_type == "If")
    branches = {a.name: a.g for a in switch.attribute}
    readers = {name: sum("encoder_hidden_states" in node.input for node in branch.node)
               for name, branch in branches.items()}
    assert readers["then_branch"] == 0 and readers["else_branch"] > 0


def test_dynamic_quantization_of_a_speech_model_is_refused_before_tracing(tmp_path: Path
                                                                          ) -> None:
    line = assert_error_after_progress(zoo("export", "whisper-tiny-test", "--onnx", "--quantize",
                                           "int8-dynamic", "--out", tmp_path / "out"))
    assert "--quantize int8-dynamic is not supported for a speech model" in line
    line = assert_error_after_progress(zoo("export", "whisper-tiny-test", "--onnx", "--dtype",
                                           "fp16", "--out", tmp_path / "out"))
    assert "--dtype fp16 is not supported for a speech model" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_int8_export_agrees_and_transcribes(built: Path, tmp_path: Path) -> None:
    """--quantize int8 (MatMulNBits) passes the greedy agreement over frames, its clients'
    graphs stored under transformers.js's int8 names, and `zoo run --audio` reads it."""
    soundfile = pytest.importorskip("soundfile")
    out = tmp_path / "int8"
    zoo_ok("export", built, "--onnx", "--quantize", "int8", "--out", out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quantization"]["agreement"]["passed"]
    assert (out / "onnx" / "decoder_model_merged_int8.onnx").is_file()
    soundfile.write(tmp_path / "clip.wav", tone(2.0, seed=3), 16000)
    printed = zoo_ok("run", out, "--audio", tmp_path / "clip.wav", "--language", "en",
                     "--format", "json")
    assert "text" in json.loads(printed.strip().splitlines()[-1])


def tone(seconds: float, seed: int) -> np.ndarray:
    """16-kHz samples: a tone in noise (what a random model hears matters less than that both
    hear the same)."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * (300 + 100 * seed) * time)
            + 0.05 * rng.standard_normal(len(time))).astype(np.float32)


@pytest.mark.parametrize(("language", "timestamps"), [("fr", False), ("en", True),
                                                      (None, False)])
def test_transcribed_tokens_are_transformers_generate(source: tuple[Path, torch.nn.Module],
                                                      exports: dict[str, Path],
                                                      language: str | None,
                                                      timestamps: bool) -> None:
    """From samples to tokens through ONNX Runtime (the export's graphs, the audio module's
    features, runtime/speech_rules.py) against transformers' feature extractor and generate;
    without a language both detect the same one."""
    folder, reference = source
    audio = tone(3.5, seed=len(language or "") + timestamps)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    values = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        output = reference.generate(values, language=language, task="transcribe",
                                    return_timestamps=timestamps, return_dict_in_generate=True)
    expected = (output["segments"][0][-1]["result"]["sequences"] if timestamps
                else output["sequences"][0]).tolist()
    exported = load(exports["plain"])
    transcriber = Transcriber(exported.runtime, exports["plain"], exported.tokenizer,
                              TranscribeOptions(language=language, timestamps=timestamps))
    features = log_mel(audio, export_mel_settings(exports["plain"]))
    detected, rows = transcriber.decode(features[None], [0.0], language)
    prompt = transcriber.tokens.prompt(detected, "transcribe", timestamps)
    assert expected[:len(prompt)] == prompt
    assert rows[0].generated == expected[len(prompt):]


def test_zoo_run_audio_prints_the_transcript(source: tuple[Path, torch.nn.Module],
                                             exports: dict[str, Path], tmp_path: Path) -> None:
    """A 12-s WAV (three of the test model's 5-s windows): `--format json`'s text is each
    window's transformers transcript, in order; verbose_json's segments lie in their
    windows, shifted by each window's start."""
    soundfile = pytest.importorskip("soundfile")
    folder, reference = source
    audio = tone(12.0, seed=2)
    soundfile.write(tmp_path / "clip.wav", audio, 16000)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    tokenizer = transformers.WhisperTokenizerFast.from_pretrained(folder)
    texts = []
    for start in range(0, len(audio), SECONDS * 16000):
        values = extractor(audio[start:start + SECONDS * 16000], sampling_rate=16000,
                           return_tensors="pt").input_features
        with torch.no_grad():
            ids = reference.generate(values, language="en", task="transcribe")[0].tolist()
        texts.append(tokenizer.decode([i for i in ids if i < 256], skip_special_tokens=True))
    printed = zoo_ok("run", exports["plain"], "--audio", tmp_path / "clip.wav", "--language",
                     "en", "--format", "json")
    assert json.loads(printed.strip().splitlines()[-1])["text"] == "".join(texts).strip()
    verbose = json.loads(zoo_ok("run", exports["plain"], "--audio", tmp_path / "clip.wav",
                                "--language", "en", "--format", "verbose_json"
                                ).strip().splitlines()[-1])
    assert verbose["duration"] == 12.0 and verbose["language"] == "english"
    windows = {segment["seek"] for segment in verbose["segments"]}
    assert windows == {0, 500, 1000}
    for segment in verbose["segments"]:
        start = segment["seek"] / 100
        assert start <= segment["start"] <= segment["end"] <= min(12.0, start + SECONDS)


def test_audio_that_is_not_audio_is_one_line(exports: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "clip.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    assert_one_line_error(zoo("run", exports["plain"], "--audio", tmp_path / "clip.wav"),
                          "clip.wav: not audio")
    assert_one_line_error(zoo("run", exports["plain"], "--audio", tmp_path / "clip.wav",
                              "--language", "de"), "language 'de' is not one of the model's")


def served_client(export: Path) -> Any:
    """The `openai` client talking to zoo serve's app over the export, in process (no port)."""
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx2")  # the openai client's HTTP library
    from runtime.serve.app import make_app
    from runtime.serve.models import Served

    app = make_app({"whisper": Served("whisper", load(export), max_queue=2)}, None)
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="key", max_retries=0,
                              http_client=httpx.AsyncClient(
                                  transport=httpx.ASGITransport(app=app)))


@pytest.mark.parametrize("response_format", ["json", "text", "verbose_json", "srt", "vtt"])
def test_serve_transcribes_for_the_openai_client(exports: dict[str, Path], tmp_path: Path,
                                                 response_format: str) -> None:
    """`POST /v1/audio/transcriptions` (zoo serve's app, in process) answers the `openai`
    client's `audio.transcriptions.create` in every response_format with what `zoo run
    --audio` prints for the same file."""
    soundfile = pytest.importorskip("soundfile")
    pytest.importorskip("python_multipart")
    soundfile.write(tmp_path / "clip.wav", tone(7.0, seed=4), 16000)
    client = served_client(exports["plain"])

    async def call() -> Any:
        with (tmp_path / "clip.wav").open("rb") as audio:
            return await client.audio.transcriptions.create(
                model="whisper", file=audio, language="en", response_format=response_format)

    answer = asyncio.run(call())
    printed = zoo_ok("run", exports["plain"], "--audio", tmp_path / "clip.wav", "--language",
                     "en", "--format", response_format)
    if response_format in ("json", "verbose_json"):
        expected = json.loads(printed.strip().splitlines()[-1])
        assert answer.text == expected["text"]
        if response_format == "verbose_json":
            got = [(s.start, s.end, s.text) for s in answer.segments]
            assert got == [(s["start"], s["end"], s["text"]) for s in expected["segments"]]
            assert len(got) >= 2
    else:
        assert answer.strip() == printed.strip()


def test_serve_refuses_a_file_that_is_not_audio(exports: dict[str, Path]) -> None:
    openai = pytest.importorskip("openai")
    pytest.importorskip("python_multipart")
    client = served_client(exports["plain"])

    async def call() -> Any:
        return await client.audio.transcriptions.create(
            model="whisper", file=("clip.wav", b"RIFF....WAVEjunk"))

    with pytest.raises(openai.BadRequestError) as refused:
        asyncio.run(call())
    assert refused.value.body["param"] == "file"
    assert "clip.wav: not audio" in refused.value.body["message"]


@pytest.mark.parametrize(("settings", "message"), [
    (("n_heads=7", "d_model=56"), None),
    (("n_heads=7", "d_model=63"), "needs an even d_model of 4 or more"),
    (("position=sinusoidal",), "the decoder's positions should be learned, not sinusoidal"),
    (("n_mels=0",), "n_mels"),
    (("scale_embeddings=true",), "scale_embeddings=True applies only to stem token_embedding"),
    (("family=decoder",), "stem=mel_frames applies only to family encoder-decoder")])
def test_a_mel_card_that_cannot_be_built_is_refused(settings: tuple[str, ...],
                                                    message: str | None) -> None:
    """Each a line naming the field; d_model 56 over 7 heads is fine (even), 63 is not."""
    result = zoo("show", "whisper-tiny-test", *[arg for s in settings for arg in ("--set", s)])
    if message is None:
        assert result.exit_code == 0, result.output
        return
    assert_one_line_error(result, message)


def test_transcribing_loads_no_torch(exports: dict[str, Path], tmp_path: Path) -> None:
    """`zoo run --audio` in a fresh interpreter: the transcript, and neither torch nor the
    exporter loaded (tests/house/test_torch_free.py's check)."""
    soundfile = pytest.importorskip("soundfile")
    from tests.house.test_torch_free import cli_calls, loaded_after

    soundfile.write(tmp_path / "clip.wav", tone(2.0, seed=1), 16000)
    calls = {"run": ["run", str(exports["plain"]), "--audio", str(tmp_path / "clip.wav"),
                     "--language", "en", "--format", "json"]}
    heavy, results = loaded_after(cli_calls(calls), tmp_path)
    code, output = results["run"]
    assert code == 0 and "text" in json.loads(output.strip().splitlines()[-1])
    assert heavy == []


def test_text_for_a_speech_model_is_refused(exports: dict[str, Path]) -> None:
    """`zoo run --text`, and a chat request to `zoo serve`, name where audio goes instead."""
    assert_one_line_error(zoo("run", exports["plain"], "--text", "hello"),
                          "a speech model reads audio, not --text")
    openai = pytest.importorskip("openai")
    client = served_client(exports["plain"])

    async def call() -> Any:
        return await client.chat.completions.create(
            model="whisper", messages=[{"role": "user", "content": "hi"}])

    with pytest.raises(openai.BadRequestError) as refused:
        asyncio.run(call())
    assert "POST /v1/audio/transcriptions" in refused.value.body["message"]


def test_training_a_speech_model_is_refused(tmp_path: Path) -> None:
    assert_one_line_error(zoo("train", "whisper-tiny-test", "--task", "copy", "--steps", "1",
                              "-o", tmp_path / "out"), "`zoo train` has no task for a speech")
    assert not (tmp_path / "out").exists()
