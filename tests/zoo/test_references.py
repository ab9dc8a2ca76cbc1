"""Blocks and families against references written independently of the code under test:
formulas spelled out here, torch.nn's own modules, transformers' Llama."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import card, random_ids, renamed
from zoo.assemble import build_model
from zoo.blocks.feedforward import SwiGLUFeedForward
from zoo.blocks.norms import RMSNorm
from zoo.blocks.positions import RotaryPositions, apply_rotary


def test_rmsnorm_equals_torch_nn_rmsnorm() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 16, generator=generator) * 0.01  # small rows: eps matters
    ours = RMSNorm(16, eps=1e-3)
    reference = nn.RMSNorm(16, eps=1e-3)
    with torch.no_grad():
        weight = torch.randn(16, generator=generator)
        ours.weight.copy_(weight)
        reference.weight.copy_(weight)
        torch.testing.assert_close(ours(x), reference(x), atol=1e-6, rtol=1e-5)


def test_swiglu_is_down_of_silu_gate_times_up() -> None:
    torch.manual_seed(0)
    block = SwiGLUFeedForward(8, 12, dropout=0.0, bias=True).eval()
    x = torch.randn(2, 3, 8)
    gate = x @ block.gate.weight.T + block.gate.bias
    up = x @ block.up.weight.T + block.up.bias
    silu = gate / (1 + torch.exp(-gate))  # x * sigmoid(x), written out
    expected = (silu * up) @ block.down.weight.T + block.down.bias
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected, atol=1e-6, rtol=1e-5)


def test_rotary_rotates_each_pair_by_position_times_its_frequency() -> None:
    """RoFormer eq. 34 in the half-split pairing (GPT-NeoX, Llama): dimension i pairs with
    i + d/2 and the pair turns by the angle position * theta^(-2i/d)."""
    head_dim, theta = 8, 10000.0
    positions = torch.tensor([[0, 1, 5, 37]])
    x = torch.randn(1, 2, 4, head_dim, generator=torch.Generator().manual_seed(1))
    rotated = apply_rotary(x, RotaryPositions(16, 64, head_dim, theta).rotary(positions))
    half = head_dim // 2
    for t, position in enumerate(positions[0].tolist()):
        for i in range(half):
            angle = position * theta ** (-2 * i / head_dim)
            a, b = x[..., t, i], x[..., t, i + half]
            torch.testing.assert_close(rotated[..., t, i],
                                       a * math.cos(angle) - b * math.sin(angle))
            torch.testing.assert_close(rotated[..., t, i + half],
                                       a * math.sin(angle) + b * math.cos(angle))


def test_llama_style_decoder_equals_transformers_llama() -> None:
    """Rotary positions, RMSNorm and SwiGLU wired as a decoder: the logits of transformers'
    LlamaForCausalLM on the same weights."""
    transformers = pytest.importorskip("transformers")
    tiny = card("gpt-tiny", position="rotary", norm="rmsnorm", activation="swiglu", bias=False,
                norm_eps=1e-5, rope_theta=500.0, dropout=0.0)
    ours = build_model(tiny, seed=3).eval()
    config = transformers.LlamaConfig(
        vocab_size=tiny["vocab_size"], hidden_size=tiny["d_model"],
        intermediate_size=tiny["d_ff"], num_hidden_layers=tiny["n_layers"],
        num_attention_heads=tiny["n_heads"], num_key_value_heads=tiny["n_heads"],
        max_position_embeddings=tiny["max_positions"], rms_norm_eps=tiny["norm_eps"],
        rope_theta=tiny["rope_theta"], tie_word_embeddings=True, attention_bias=False,
        mlp_bias=False)
    reference = transformers.LlamaForCausalLM(config).eval()
    names = {"embeddings.token": "model.embed_tokens", "final_norm": "model.norm",
             "self_attention.query": "self_attn.q_proj", "self_attention.key": "self_attn.k_proj",
             "self_attention.value": "self_attn.v_proj", "self_attention.out": "self_attn.o_proj",
             "feed_forward.gate": "mlp.gate_proj", "feed_forward.up": "mlp.up_proj",
             "feed_forward.down": "mlp.down_proj", "norms.0": "input_layernorm",
             "norms.1": "post_attention_layernorm", "layers.": "model.layers."}
    missing, unexpected = reference.load_state_dict(renamed(ours.state_dict(), names),
                                                    strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    ids = random_ids(tiny, 2, 11)
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(ours(ids)[0], expected, atol=1e-5, rtol=1e-4)


def paper_sinusoids(length: int, d_model: int) -> torch.Tensor:
    table = torch.zeros(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(0, d_model, 2):
            table[pos, i] = math.sin(pos / 10000 ** (i / d_model))
            table[pos, i + 1] = math.cos(pos / 10000 ** (i / d_model))
    return table.float()


def torch_transformer_logits(model: nn.Module, fields: dict, source: torch.Tensor,
                             target: torch.Tensor) -> torch.Tensor:
    """The same weights through torch.nn.TransformerEncoder/Decoder (post-norm, ReLU), the
    paper's embedding (scaled by sqrt(d_model), plus sinusoids) and the tied output layer."""
    d, heads, layers = fields["d_model"], fields["n_heads"], fields["n_layers"]
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(
        d, heads, fields["d_ff"], dropout=0.0, layer_norm_eps=fields["norm_eps"],
        batch_first=True), layers, enable_nested_tensor=False)
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(
        d, heads, fields["d_ff"], dropout=0.0, layer_norm_eps=fields["norm_eps"],
        batch_first=True), layers)
    ours = model.state_dict()

    def attention(into: nn.MultiheadAttention, prefix: str) -> None:
        parts = ("query", "key", "value")
        into.in_proj_weight.copy_(torch.cat([ours[f"{prefix}.{p}.weight"] for p in parts]))
        into.in_proj_bias.copy_(torch.cat([ours[f"{prefix}.{p}.bias"] for p in parts]))
        into.out_proj.weight.copy_(ours[f"{prefix}.out.weight"])
        into.out_proj.bias.copy_(ours[f"{prefix}.out.bias"])

    def linear_and_norms(into: nn.Module, prefix: str, norms: int) -> None:
        for mine, theirs in (("up", into.linear1), ("down", into.linear2)):
            theirs.weight.copy_(ours[f"{prefix}.feed_forward.{mine}.weight"])
            theirs.bias.copy_(ours[f"{prefix}.feed_forward.{mine}.bias"])
        for index in range(norms):
            norm = getattr(into, f"norm{index + 1}")
            norm.weight.copy_(ours[f"{prefix}.norms.{index}.weight"])
            norm.bias.copy_(ours[f"{prefix}.norms.{index}.bias"])

    with torch.no_grad():
        for index, layer in enumerate(encoder.layers):
            attention(layer.self_attn, f"encoder_layers.{index}.self_attention")
            linear_and_norms(layer, f"encoder_layers.{index}", 2)
        for index, layer in enumerate(decoder.layers):
            attention(layer.self_attn, f"decoder_layers.{index}.self_attention")
            attention(layer.multihead_attn, f"decoder_layers.{index}.cross_attention")
            linear_and_norms(layer, f"decoder_layers.{index}", 3)
        embedding = ours["source_embeddings.token.weight"]
        table = paper_sinusoids(max(source.shape[1], target.shape[1]), d)

        def embed(ids: torch.Tensor) -> torch.Tensor:
            return embedding[ids] * math.sqrt(d) + table[: ids.shape[1]]

        causal = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        memory = encoder.eval()(embed(source))
        hidden = decoder.eval()(embed(target), memory, tgt_mask=causal)
        return hidden @ embedding.T


def test_encoder_decoder_equals_torch_nn_transformer_layers() -> None:
    tiny = card("transformer-tiny", dropout=0.0)
    model = build_model(tiny, seed=4).eval()
    source, target = random_ids(tiny, 2, 9), random_ids(tiny, 2, 6, seed=1)
    expected = torch_transformer_logits(model, tiny.fields, source, target)
    with torch.no_grad():
        torch.testing.assert_close(model(source, target), expected, atol=1e-5, rtol=1e-4)


def smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, epsilon: float,
                           ignore: int) -> torch.Tensor:
    """Szegedy et al. 2016: (1 - e) * -log p(y) + e * mean over classes of -log p(c), averaged
    over the positions that have a label."""
    log_probs = logits.double().log_softmax(-1)
    keep = labels != ignore
    picked = log_probs[keep].gather(-1, labels[keep][:, None])[:, 0]
    per_token = -(1 - epsilon) * picked - epsilon * log_probs[keep].mean(-1)
    return per_token.mean().float()


@pytest.mark.parametrize("task, epsilon", [("lm", 0.1), ("mlm", 0.2), ("lm", 0.0)])
def test_training_loss_is_the_label_smoothed_cross_entropy(task: str, epsilon: float) -> None:
    from zoo.training import data
    from zoo.training.train import Task, TrainOptions

    tiny = card("gpt-tiny" if task == "lm" else "bert-tiny")
    options = TrainOptions(task=task, out=Path("unused"), steps=1, label_smoothing=epsilon,
                           block_size=16, batch_size=3).resolved(tiny)
    runner = Task(tiny, options)
    batch = runner.batch(step=0, rank=0)
    logits = torch.randn(3, 16, tiny["vocab_size"], generator=torch.Generator().manual_seed(2))

    def model(ids: torch.Tensor) -> tuple | dict:
        return (logits,) if task == "lm" else {"logits": logits}

    expected = smoothed_cross_entropy(logits, batch.labels, epsilon, data.IGNORE)
    torch.testing.assert_close(runner.loss(model, batch), expected, atol=1e-5, rtol=1e-5)


def test_mlm_masks_15_percent_then_80_10_10() -> None:
    from zoo.training import data

    vocab, mask_token = 1000, 999
    ids = torch.randint(0, 998, (200_000,), generator=torch.Generator().manual_seed(0))
    batch = data.mlm_batch(ids, 64, 512, torch.Generator().manual_seed(1), mask_token, vocab)
    original = torch.where(batch.labels != data.IGNORE, batch.labels, batch.inputs["input_ids"])
    chosen = batch.labels != data.IGNORE
    inputs = batch.inputs["input_ids"]
    n = chosen.numel()
    # Binomial counts within 5 standard deviations of their expectation.
    assert abs(chosen.sum().item() - 0.15 * n) < 5 * math.sqrt(n * 0.15 * 0.85)
    picked = chosen.sum().item()
    masked = (inputs[chosen] == mask_token).sum().item()
    kept = (inputs[chosen] == original[chosen]).sum().item()
    replaced = picked - masked - kept
    # A random replacement equals the original with probability 1/vocab: counted as kept.
    for count, share in ((masked, 0.8), (replaced, 0.1 * (1 - 1 / vocab)),
                         (kept, 0.1 + 0.1 / vocab)):
        assert abs(count - share * picked) < 5 * math.sqrt(picked * share * (1 - share))
    assert torch.equal(inputs[~chosen], original[~chosen])  # unpicked tokens never change
    assert (inputs[chosen & (inputs != mask_token)] < vocab).all()
