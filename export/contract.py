"""The ONNX contract (DESIGN.md): file names, input and output names per family.

Names follow ONNX Runtime GenAI and Hugging Face Optimum. Integer inputs are int64; batch,
sequence and past length are dynamic axes.
"""

from __future__ import annotations

from typing import Any

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def past_names(n_layers: int, prefix: str, infix: str = "") -> list[str]:
    """`past_key_values.{i}.key`, ... or with infix `.decoder` for the encoder-decoder."""
    return [f"{prefix}.{i}{infix}.{kind}" for i in range(n_layers) for kind in ("key", "value")]


def encoder_outputs(card: dict[str, Any]) -> list[str]:
    names = ["last_hidden_state"]
    if card["pooler"]:
        names.append("pooler_output")
    if card["mlm_head"]:
        names.append("logits")
    return names


def encoder_inputs(card: dict[str, Any]) -> list[str]:
    names = ["input_ids", "attention_mask"]
    if card["type_vocab_size"]:
        names.append("token_type_ids")
    return names


def files_for(card: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    """{file name: (input names, output names)} for the card's family."""
    n = card["n_layers"]
    family = card["family"]
    if family == "encoder":
        return {"model.onnx": (encoder_inputs(card), encoder_outputs(card))}
    if family == "decoder":
        inputs = ["input_ids", "attention_mask", "position_ids",
                  *past_names(n, "past_key_values")]
        return {"model.onnx": (inputs, ["logits", *past_names(n, "present")])}
    decoder_inputs = ["input_ids", "encoder_hidden_states", "encoder_attention_mask",
                      *past_names(n, "past_key_values", ".decoder")]
    return {
        "encoder.onnx": (["input_ids", "attention_mask"], ["last_hidden_state"]),
        "decoder.onnx": (decoder_inputs, ["logits", *past_names(n, "present", ".decoder")]),
    }
