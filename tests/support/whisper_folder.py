"""A Whisper folder as the Hugging Face hub has them (config.json, generation_config.json,
model.safetensors, tokenizer.json, preprocessor_config.json), small enough for tests:
transformers' WhisperForConditionalGeneration at `whisper-tiny-test`'s sizes with random
weights, and a byte-level tokenizer made here offline: the 256 bytes (no merges), the special
tokens of two languages and 1501 timestamps, in Whisper's order. tests/imports/test_whisper.py
imports it and checks it against transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LANGUAGES = ("en", "fr")
SPECIAL = ("<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in LANGUAGES),
           "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
           "<|nospeech|>", "<|notimestamps|>")
TIMESTAMPS = 1501  # <|0.00|> to <|30.00|>
SECONDS = 5  # whisper-tiny-test's 250 encoder states: 500 frames of 10 ms
N_MELS = 16
TIMESTAMP_SCALE = 0.5


def whisper_tokenizer(folder: Path) -> Any:
    """WhisperTokenizerFast over a byte-level BPE with no merges, saved in `folder`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import WhisperTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL))
    backend.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS)])
    end = SPECIAL[0]
    tokenizer = WhisperTokenizerFast(tokenizer_object=backend, bos_token=end, eos_token=end,
                                     unk_token=end, pad_token=end)
    tokenizer.save_pretrained(folder)
    return tokenizer


def token_ids() -> dict[str, int]:
    return {token: 256 + index for index, token in enumerate(SPECIAL)}


def whisper_folder(root: Path, name: str = "whisper-hf", seed: int = 0
                   ) -> tuple[Path, Any]:
    """(root/NAME: a Whisper folder, its transformers model)."""
    import torch
    import transformers
    from transformers.models.whisper.modeling_whisper import sinusoids

    from tests.support.hf_decoders import randomise

    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    ids = token_ids()
    vocab_size = 256 + len(SPECIAL) + TIMESTAMPS
    config = transformers.WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=N_MELS, d_model=64, encoder_layers=2,
        decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=SECONDS * 50,
        max_target_positions=64, pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"], suppress_tokens=[],
        begin_suppress_tokens=[220, ids["<|endoftext|>"]])
    torch.manual_seed(seed)
    model = randomise(transformers.WhisperForConditionalGeneration(config), std=0.3, seed=seed)
    with torch.no_grad():  # tied as transformers ties them; the sinusoids as it makes them
        model.proj_out.weight = model.model.decoder.embed_tokens.weight
        model.model.encoder.embed_positions.weight.copy_(sinusoids(SECONDS * 50, 64))
        # the timestamps' rows small, so their (tied) logits are: text wins most steps, and
        # the 1501 timestamps together still win some (a random model otherwise says only
        # timestamps, and a transcript without them would be empty)
        model.model.decoder.embed_tokens.weight[ids["<|notimestamps|>"] + 1:] *= TIMESTAMP_SCALE
    model.save_pretrained(folder)
    generation = model.generation_config
    no_timestamps = ids["<|notimestamps|>"]
    settings = dict(
        lang_to_id={f"<|{code}|>": ids[f"<|{code}|>"] for code in LANGUAGES},
        task_to_id={"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]},
        no_timestamps_token_id=no_timestamps, is_multilingual=True,
        prev_sot_token_id=ids["<|startofprev|>"], max_initial_timestamp_index=50,
        suppress_tokens=[ids["<|startoflm|>"], ids["<|startofprev|>"], ids["<|nospeech|>"]],
        begin_suppress_tokens=[220, ids["<|endoftext|>"]], forced_decoder_ids=None,
        max_length=64)
    for key, value in settings.items():  # update() would skip the keys it does not know
        setattr(generation, key, value)
    generation.save_pretrained(folder)
    model.generation_config = generation
    whisper_tokenizer(folder)
    transformers.WhisperFeatureExtractor(feature_size=N_MELS, chunk_length=SECONDS
                                         ).save_pretrained(folder)
    return folder, model.eval()


def exported_with_clip(root: Path) -> tuple[Path, Any, Path, Any]:
    """(the folder, its transformers model, its export under root/whisper-onnx, transformers'
    features of root/clip.wav): a 3.5-s 500-Hz tone written as 16-bit PCM (what the clients'
    readers take), the features made from the samples as the file holds them."""
    import numpy as np
    import soundfile
    import transformers

    from tests.support.helpers import zoo_ok

    folder, reference = whisper_folder(root)
    zoo_ok("import", folder, "-o", root / "built")
    zoo_ok("export", root / "built", "--onnx", "--out", root / "whisper-onnx")
    time = np.arange(56000) / 16000
    soundfile.write(root / "clip.wav", (0.3 * np.sin(2 * np.pi * 500 * time)).astype(
        np.float32), 16000, subtype="PCM_16")
    samples, _ = soundfile.read(root / "clip.wav", dtype="float32")
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(folder)
    features = extractor(samples, sampling_rate=16000, return_tensors="pt").input_features
    return folder, reference, root / "whisper-onnx", features
