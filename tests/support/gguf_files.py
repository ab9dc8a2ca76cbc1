"""GGUF files written as llama.cpp's converter writes them, from tiny random transformers models,
and the tokenizers they hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.hf_decoders import randomise

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")


HEADS, KV_HEADS = 4, 2


QUANTIZED = "blk.1.ffn_up.weight"  # Q8_0 in the file (rows of 32); every other float32


def hf_model(tie: bool, vocab_size: int = 96) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=tie, bos_token_id=1,
        eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return randomise(model, bias_std=0.2, seed=None)


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rotary halves interleaved."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]) \
        .swapaxes(1, 2).reshape(weight.shape)


GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(name: str) -> str:
    if name.startswith("model.layers."):
        _, _, layer, rest = name.split(".", 3)
        module = rest.removesuffix(".weight")
        return f"blk.{layer}.{GGUF_NAMES[module]}.weight"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
            "output_norm.weight", "lm_head.weight": "output.weight"}[name]


def write_gguf(model: torch.nn.Module, path: Path, extra: dict | None = None,
               tokenizer: Any = None, chat_template: str | None = None,
               pieces: Any = None) -> None:
    """The file, and the model's weights set to what the file holds (Q8_0 dequantized);
    `tokenizer` (a byte-level BPE) as llama.cpp stores one: tokens, merges, token types;
    `pieces` (a SentencePieceProcessor) as llama.cpp's converter stores a Llama 2 tokenizer.model:
    pieces, scores and types, no merges."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    add_tokenizer(writer, tokenizer, pieces)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    for key, value in (extra or {}).items():
        writer.add_float32(key, value)
    state = model.state_dict()
    for name, tensor in state.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.numpy().astype(np.float32)
        target = gguf_name(name)
        if target.endswith("attn_q.weight"):
            array = llama_cpp_permute(array, HEADS)
        elif target.endswith("attn_k.weight"):
            array = llama_cpp_permute(array, KV_HEADS)
        if target == QUANTIZED:
            kind = gguf.GGMLQuantizationType.Q8_0
            data = gguf.quants.quantize(array, kind)
            writer.add_tensor(target, data, raw_shape=data.shape, raw_dtype=kind)
            with torch.no_grad():  # the reference runs on what the file holds
                state[name].copy_(torch.from_numpy(gguf.quants.dequantize(data, kind)))
        else:
            writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_tokenizer(writer: gguf.GGUFWriter, tokenizer: Any, pieces: Any) -> None:
    """A SentencePiece model's pieces, scores and types (llama.cpp's Llama 2 conversion), or a
    byte-level BPE's tokens, merges and types (its GPT-2 conversion), or neither."""
    if pieces is not None:
        writer.add_tokenizer_model("llama")
        ids = range(pieces.get_piece_size())
        writer.add_token_list([pieces.id_to_piece(i) for i in ids])
        writer.add_token_scores([pieces.get_score(i) for i in ids])
        writer.add_token_types([spm_type(pieces, i) for i in ids])
    if tokenizer is not None:
        spec = json.loads(tokenizer.to_str())
        vocab = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
        special = {token["content"] for token in spec["added_tokens"]}
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([token for token, _ in vocab])
        writer.add_token_merges([" ".join(merge) for merge in spec["model"]["merges"]])
        writer.add_token_types([3 if token in special else 1 for token, _ in vocab])


def byte_level_bpe(size: int) -> Any:
    """A byte-level BPE (GPT-2's kind) trained here on the shipped text, two special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from zoo.training.data import SHIPPED_TEXT

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["<|end|>", "<|start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SHIPPED_TEXT.read_text(encoding="utf-8").splitlines()[:3000],
                                  trainer)
    return tokenizer


def spm_type(pieces: Any, index: int) -> int:
    """llama.cpp's token type of a piece (gguf.TokenType), as its converter reads it."""
    for kind, test in ((2, pieces.is_unknown), (3, pieces.is_control), (6, pieces.is_byte),
                       (5, pieces.is_unused)):
        if test(index):
            return kind
    return 1


def spm_fields(pieces: Any) -> dict[str, Any]:
    """A SentencePiece model as gguf's reader gives its tokenizer keys (pieces, scores, types,
    BOS), for the conversion without a file."""
    ids = range(pieces.get_piece_size())
    return {"tokenizer.ggml.model": Field("llama"),
            "tokenizer.ggml.tokens": Field([pieces.id_to_piece(i) for i in ids]),
            "tokenizer.ggml.scores": Field([pieces.get_score(i) for i in ids]),
            "tokenizer.ggml.token_type": Field([spm_type(pieces, i) for i in ids]),
            "tokenizer.ggml.bos_token_id": Field(pieces.bos_id())}


def sentencepiece_bpe(size: int) -> Any:
    """A SentencePiece BPE trained here on the shipped text with Llama 2's settings (byte
    fallback, the text as it is, a space put before it; <unk> <s> </s> as ids 0-2)."""
    import io

    import sentencepiece

    from zoo.training.data import SHIPPED_TEXT

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SHIPPED_TEXT.read_text(encoding="utf-8").splitlines()[:3000]),
        model_writer=model, model_type="bpe", vocab_size=size, byte_fallback=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, character_coverage=1.0, minloglevel=2)
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())


SPM_TEXTS = ["First Citizen: Before we proceed", "café 東京 12345, naïve",
             "  two  spaces\tand a tab\n", "ROMEO: What, ho! apothecary!", " leading space"]


class Field:
    """What gguf's reader gives for one key, as far as the conversion reads it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def contents(self) -> Any:
        return self.value


def small_vocabulary() -> dict[str, Field]:
    """A SentencePiece vocabulary without byte pieces: <unk> <s> </s> ▁ a b ▁a ab."""
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab"]
    return {"tokenizer.ggml.model": Field("llama"), "tokenizer.ggml.tokens": Field(tokens),
            "tokenizer.ggml.scores": Field([0.0] * 6 + [-1.0, -2.0]),
            "tokenizer.ggml.token_type": Field([2, 3, 3, 1, 1, 1, 1, 1]),
            "tokenizer.ggml.bos_token_id": Field(1)}
