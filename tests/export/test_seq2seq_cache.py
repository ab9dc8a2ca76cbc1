"""The encoder-decoder's cross-attention cache (issue #12): encoder.onnx computes each decoder
layer's cross keys/values once, decoder.onnx takes them and never projects the source again,
and generation with both caches picks the tokens a model without any cache picks. The same of
the seq2seq layout the Hugging Face clients load (onnx/encoder_model.onnx and
onnx/decoder_model_merged.onnx): its first step projects the cross cache, once, and its loop
picks those tokens too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from export.opening import open_export, open_model
from export.pipeline import export_and_verify
from runtime.contract import LAYOUT_DECODER, LAYOUT_ENCODER
from runtime.decoding import LayoutSeq2SeqSession, empty_past
from runtime.generate import generate
from runtime.sampling import Sampling, decode
from tests.conftest import card
from zoo.assemble import build_model

NAME = "transformer-tiny"
UNTIED = {"tie_embeddings": False}  # a random tied head only repeats its input token
SOURCES = [[5, 9, 14, 20, 33, 41, 7], [12, 60, 3], [44, 45, 46, 47, 48, 49, 50, 51, 52]]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    tiny = card(NAME, **UNTIED)
    model = build_model(tiny, seed=3).eval()
    # Random weights this small barely look at the source (every row would decode alike):
    # sharpen the cross-attention so each source leads elsewhere.
    with torch.no_grad():
        for layer in model.decoder_layers:
            for part in ("query", "key", "value", "out"):
                getattr(layer.cross_attention, part).weight.mul_(6.0)
    folder = tmp_path_factory.mktemp("seq2seq-cache") / NAME
    export_and_verify(model, tiny, folder)  # includes the parity grid against PyTorch
    return folder, model


class NoCacheSession:
    """The reference: every step re-runs the whole model (encoder included) over the source and
    the target so far, through the teacher-forced forward. No cache of any kind."""

    def __init__(self, model: torch.nn.Module, bos: int) -> None:
        self.model, self.bos = model, bos

    def _logits(self) -> np.ndarray:
        with torch.no_grad():
            logits = self.model(torch.from_numpy(self.source), torch.from_numpy(self.target),
                                torch.from_numpy(self.mask))
        return logits[:, -1].numpy()

    def prefill(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.source, self.mask = ids.astype(np.int64), mask.astype(np.int64)
        self.target = np.full((len(ids), 1), self.bos, np.int64)
        return self._logits()

    def step(self, tokens: np.ndarray) -> np.ndarray:
        self.target = np.concatenate([self.target, tokens[:, None].astype(np.int64)], axis=1)
        return self._logits()

    def expand(self, beams: int) -> None:
        self.reorder(np.repeat(np.arange(len(self.source)), beams))

    def reorder(self, rows: np.ndarray) -> None:
        self.source, self.mask, self.target = self.source[rows], self.mask[rows], self.target[rows]


def right_padded(sources: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, sources))
    ids = np.full((len(sources), width), pad, np.int64)
    mask = np.zeros_like(ids)
    for row, source in enumerate(sources):
        ids[row, : len(source)], mask[row, : len(source)] = source, 1
    return ids, mask


def projected(model: torch.nn.Module, memory: np.ndarray, layer: int, kind: str) -> np.ndarray:
    """Decoder layer `layer`'s cross `kind` of the memory, worked out in numpy: x W^T + b, split
    into heads, (B, S, H, Dh) -> (B, H, S, Dh)."""
    tiny = card(NAME, **UNTIED)
    heads, head_dim = tiny["n_heads"], tiny["d_model"] // tiny["n_heads"]
    prefix = f"decoder_layers.{layer}.cross_attention.{kind}"
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    values = memory @ state[f"{prefix}.weight"].T + state[f"{prefix}.bias"]
    return values.reshape(*memory.shape[:2], heads, head_dim).transpose(0, 2, 1, 3)


def test_encoder_outputs_each_layers_cross_keys_and_values(export) -> None:
    folder, model = export
    tiny = card(NAME, **UNTIED)
    ids, mask = right_padded(SOURCES, tiny["pad_token_id"])
    outputs = open_export(folder).run("encoder.onnx", {"input_ids": ids, "attention_mask": mask})
    for layer in range(tiny["n_layers"]):
        for kind in ("key", "value"):
            np.testing.assert_allclose(outputs[f"present.{layer}.encoder.{kind}"],
                                       projected(model, outputs["last_hidden_state"], layer, kind),
                                       atol=1e-5, rtol=0)


def test_layout_first_step_projects_the_cross_cache_and_later_steps_return_none(export
                                                                                ) -> None:
    """decoder_model_merged.onnx with use_cache_branch false computes each layer's cross keys
    and values from encoder_hidden_states (what the clients keep for every later step); with
    true it takes them back and returns empty ones: the cache is projected once, not copied."""
    folder, model = export
    tiny = card(NAME, **UNTIED)
    runtime = open_export(folder)
    ids, mask = right_padded(SOURCES, tiny["pad_token_id"])
    memory = runtime.run(LAYOUT_ENCODER, {"input_ids": ids, "attention_mask": mask})
    assert list(memory) == ["last_hidden_state"]  # the clients read nothing else
    empty = empty_past(runtime, len(ids))
    names = [f"past_key_values.{i}.{side}.{kind}" for i in range(tiny["n_layers"])
             for side in ("decoder", "encoder") for kind in ("key", "value")]
    feeds = {"input_ids": np.full((len(ids), 1), tiny["bos_token_id"]),
             "encoder_attention_mask": mask,
             "encoder_hidden_states": memory["last_hidden_state"],
             "use_cache_branch": np.array([False]), **dict(zip(names, empty + empty, strict=True))}
    first = runtime.run(LAYOUT_DECODER, feeds)
    for layer in range(tiny["n_layers"]):
        for kind in ("key", "value"):
            np.testing.assert_allclose(first[f"present.{layer}.encoder.{kind}"],
                                       projected(model, memory["last_hidden_state"], layer, kind),
                                       atol=1e-5, rtol=0)
    feeds.update({name.replace("present", "past_key_values"): value
                  for name, value in first.items() if name.startswith("present.")},
                 use_cache_branch=np.array([True]), input_ids=np.full((len(ids), 1), 7))
    later = runtime.run(LAYOUT_DECODER, feeds)
    assert later["present.0.decoder.key"].shape[2] == 2
    assert all(later[name].size == 0 for name in later if ".encoder." in name)


def test_decoder_graph_never_touches_the_cross_key_value_weights(export) -> None:
    """What the encoder projected once, the decoder must not project again: no initializer of
    decoder.onnx holds a cross-attention key/value weight (in either orientation), while
    encoder.onnx does; and the decoder takes no encoder hidden states."""
    folder, model = export
    state = model.state_dict()
    cross_kv = [state[f"decoder_layers.{i}.cross_attention.{kind}.weight"].numpy()
                for i in range(card(NAME, **UNTIED)["n_layers"]) for kind in ("key", "value")]

    def blocks(array: np.ndarray, width: int) -> list[np.ndarray]:
        """The array, and its column blocks `width` wide: export/onnx/forms.py stores the
        projections of one tensor side by side, every layer's cross keys and values in one."""
        if array.ndim != 2 or array.shape[1] % width:
            return [array]
        return [array, *np.split(array, array.shape[1] // width, axis=1)]

    def holds(file: str) -> list[bool]:
        proto = onnx.load(str(folder / file))  # with the external weights
        arrays = [block for t in proto.graph.initializer
                  for block in blocks(numpy_helper.to_array(t), cross_kv[0].shape[0])]
        return [any(a.size == w.size and (np.array_equal(a.reshape(w.shape), w)
                                          or np.array_equal(a.reshape(w.shape), w.T))
                    for a in arrays) for w in cross_kv]

    assert all(holds("encoder.onnx"))
    assert not any(holds("decoder.onnx"))
    inputs = {i.name for i in onnx.load(str(folder / "decoder.onnx"),
                                        load_external_data=False).graph.input}
    assert "encoder_hidden_states" not in inputs and "past_key_values.0.encoder.key" in inputs


@pytest.mark.parametrize("beams", [1, 4])
def test_cached_decoding_picks_the_tokens_of_a_model_without_cache(export, beams: int) -> None:
    folder, model = export
    tiny = card(NAME, **UNTIED)
    ids, mask = right_padded(SOURCES, tiny["pad_token_id"])
    steps = 12
    expected = decode(NoCacheSession(model, tiny["bos_token_id"]), ids, mask, steps,
                      Sampling(beams=beams), None)
    # the reference is not degenerate: many tokens, and the rows differ
    assert len(set(expected.ravel().tolist())) > 5 and len({tuple(r) for r in expected}) == 3
    for engine in (open_export(folder), open_model(model, tiny)):
        got = generate(engine, ids, mask, steps, Sampling(beams=beams))
        np.testing.assert_array_equal(got, expected)
    layout = LayoutSeq2SeqSession(open_export(folder))  # the Hugging Face clients' loop
    np.testing.assert_array_equal(decode(layout, ids, mask, steps, Sampling(beams=beams), None),
                                  expected)


def test_padded_batch_rows_equal_each_source_alone(export) -> None:
    folder, _ = export
    runtime = open_export(folder)
    tiny = card(NAME, **UNTIED)
    ids, mask = right_padded(SOURCES, tiny["pad_token_id"])
    for sampling in (Sampling(), Sampling(beams=4), Sampling(temperature=0.0, top_k=5)):
        batched = generate(runtime, ids, mask, 10, sampling)
        for row, source in enumerate(SOURCES):
            alone = generate(runtime, np.array([source]), None, 10, sampling)
            np.testing.assert_array_equal(batched[row], alone[0])


def test_sources_that_end_leave_the_batch_with_their_cross_cache(export) -> None:
    """An eos that ends some rows early (random weights: a token greedy reaches) makes the
    session drop those rows, cross cache and source mask included; each row is still what
    its source gives alone."""
    folder, _ = export
    runtime = open_export(folder)
    ids, mask = right_padded(SOURCES, card(NAME, **UNTIED)["pad_token_id"])
    free = generate(runtime, ids, mask, 10).tolist()
    eos = next(t for t in free[0][:5] if any(t not in row for row in free[1:]))
    batched = generate(runtime, ids, mask, 10, eos=eos)
    assert (batched[0, -1] == eos) and any(eos not in row for row in batched.tolist())
    for row, source in enumerate(SOURCES):
        alone = generate(runtime, np.array([source]), None, 10, eos=eos)
        np.testing.assert_array_equal(batched[row], alone[0])
