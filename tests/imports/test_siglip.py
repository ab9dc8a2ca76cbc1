"""SigLIP (registry/maps/siglip.yaml, cards siglip-*): the counts against transformers'
SiglipModel on the meta device, and a tiny random SiglipModel folder imported, computing
transformers' image embeddings (no class token, the attention probe), text embeddings (the last
position, the text head) and logits (plus logit_bias) in PyTorch; exported, through ONNX
Runtime, and its zero-shot scores a sigmoid of each pair (slow: the export is CLIP's family,
whose default check is tests/imports/test_clip.py's). transformers is the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from registry.params import total_parameters
from runtime.dual import zero_shot
from runtime.exported import load
from tests.conftest import card
from tests.support.contract_doc import documented_contract
from tests.support.helpers import zoo_ok
from tests.support.hf_decoders import randomise
from zoo.assemble import build_model
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")

ATOL = 1e-4
TEXT = dict(vocab_size=99, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
            intermediate_size=64, max_position_embeddings=16, projection_size=48)
VISION = dict(hidden_size=48, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96,
              image_size=32, patch_size=8)


def tiny_config() -> transformers.SiglipConfig:
    return transformers.SiglipConfig(text_config=TEXT, vision_config=VISION)


def test_counts_are_transformers() -> None:
    """google/siglip-base-patch16-224's sizes are SiglipConfig's defaults."""
    with torch.device("meta"):
        reference = transformers.SiglipModel(transformers.SiglipConfig())
        model = build_model(card("siglip-base-patch16-224"), meta=True)
    published = 203_155_970  # google/siglip-base-patch16-224
    assert sum(p.numel() for p in reference.parameters()) == published
    assert sum(p.numel() for p in model.parameters()) == published
    assert total_parameters(card("siglip-base-patch16-224").fields) == published
    with torch.device("meta"):
        tiny = transformers.SiglipModel(tiny_config())
    assert total_parameters(card("siglip-tiny").fields) == sum(
        p.numel() for p in tiny.parameters())


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A tiny random SiglipModel, every tensor far from its init, the logit scale and bias
    kept where the logits stay in range."""
    torch.manual_seed(0)
    model = randomise(transformers.SiglipModel(tiny_config()))
    with torch.no_grad():
        model.logit_scale.fill_(1.5)
        model.logit_bias.fill_(-0.7)
    folder = tmp_path_factory.mktemp("siglip") / "hf"
    model.save_pretrained(folder)
    out = folder.parent / "built"
    zoo_ok("import", folder, "-o", out)
    return out, model


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Three texts padded to the model's 16 positions with its pad token (1), as SigLIP's
    processor pads, and attended whole (it gives no mask); two images."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 99, (3, 16), generator=generator)
    for row, length in enumerate([5, 16, 9]):
        ids[row, length:] = 1
    return ids, torch.randn(2, 3, 32, 32, generator=generator)


def test_imported_embeddings_and_logits_are_transformers(
        source: tuple[Path, torch.nn.Module]) -> None:
    built, reference = source
    model, imported = load_built(built)
    assert imported["vision"]["class_token"] is False and imported["logit_bias"] is not None
    ids, values = inputs()
    with torch.no_grad():
        expected = reference(input_ids=ids, pixel_values=values)
        got = model(ids, torch.ones_like(ids), values)
        text = reference.text_model(input_ids=ids)
        image = reference.vision_model(pixel_values=values)
        got_text, got_image = model.encode_text(ids), model.encode_image(values)
    for name in ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"):
        torch.testing.assert_close(got[name], getattr(expected, name), atol=ATOL, rtol=0)
    torch.testing.assert_close(got_text["text_embeds"], text.pooler_output, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_image["image_embeds"], image.pooler_output, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_image["last_hidden_state"], image.last_hidden_state,
                               atol=ATOL, rtol=0)


@pytest.mark.slow  # an export: the dual encoder's default export check is CLIP's
def test_onnx_and_sigmoid_zero_shot_are_transformers(source: tuple[Path, torch.nn.Module],
                                                     tmp_path: Path) -> None:
    built, reference = source
    zoo_ok("export", built, "--onnx", "--out", tmp_path / "export")
    ids, values = inputs()
    with torch.no_grad():
        expected = reference(input_ids=ids, pixel_values=values)
    runtime = load(tmp_path / "export").runtime
    graphs = {file: (onnx.load(str(tmp_path / "export" / file)).graph, file)
              for file in documented_contract(card("siglip-tiny"))}
    assert {file: ([i.name for i in g.input], [o.name for o in g.output])
            for file, (g, _) in graphs.items()} == documented_contract(card("siglip-tiny"))
    joint = runtime.run("onnx/model.onnx", {"input_ids": ids.numpy(),  # no mask: SigLIP's
                                            "pixel_values": values.numpy()})
    np.testing.assert_allclose(joint["logits_per_image"], expected.logits_per_image.numpy(),
                               atol=ATOL, rtol=0)
    lengths = [5, 16, 9]  # each label's ids; the runtime pads them to 16 with the pad token
    scores = zero_shot(runtime, values.numpy(), [ids[row, :n].tolist()
                                                 for row, n in enumerate(lengths)])
    np.testing.assert_allclose(scores, torch.sigmoid(expected.logits_per_image).numpy(),
                               atol=ATOL, rtol=0)
