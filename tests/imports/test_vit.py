"""ViT (registry/maps/vit.yaml, registry/stems.py's patch stem, cards vit-*): the counts against
transformers' ViTForImageClassification on the meta device, and a tiny random
ViTForImageClassification folder (with its ViTImageProcessor) imported, exported plain and with
--optimize, computing transformers' logits in PyTorch, through ONNX Runtime and from image
files with `zoo run --image`. transformers is the reference: no download."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from registry.params import total_parameters
from runtime.classify import softmax
from runtime.exported import load
from tests.conftest import card
from tests.support.helpers import (
    assert_error_after_progress,
    assert_one_line_error,
    zoo,
    zoo_ok,
)
from tests.support.hf_decoders import randomise
from zoo.assemble import build_model
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

ATOL = 1e-4
LABELS = ["cat", "dog", "fish"]
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=32, patch_size=8, num_labels=3, id2label=dict(enumerate(LABELS)),
            label2id={label: i for i, label in enumerate(LABELS)})
PROCESSOR = dict(size={"height": 32, "width": 32}, do_convert_rgb=True, resample=3,
                 image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])


def test_counts_are_transformers() -> None:
    with torch.device("meta"):
        reference = transformers.ViTForImageClassification(
            transformers.ViTConfig(num_labels=1000))
        model = build_model(card("vit-base-patch16-224"), meta=True)
    published = 86_567_656  # google/vit-base-patch16-224
    assert sum(p.numel() for p in reference.parameters()) == published
    assert sum(p.numel() for p in model.parameters()) == published
    assert total_parameters(card("vit-base-patch16-224").fields) == published


def test_tiny_count_is_transformers() -> None:
    tiny = card("vit-tiny")
    config = transformers.ViTConfig(
        hidden_size=tiny["d_model"], num_hidden_layers=tiny["n_layers"],
        num_attention_heads=tiny["n_heads"], intermediate_size=tiny["d_ff"],
        image_size=tiny["image_size"], patch_size=tiny["patch_size"],
        num_labels=tiny["num_labels"])
    with torch.device("meta"):
        reference = transformers.ViTForImageClassification(config)
    assert total_parameters(tiny.fields) == sum(p.numel() for p in reference.parameters())


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A tiny random ViTForImageClassification saved with its processor."""
    torch.manual_seed(0)
    model = randomise(transformers.ViTForImageClassification(transformers.ViTConfig(**TINY)))
    model.eval()  # every tensor far from its init: a norm or bias mapped wrong shows
    folder = tmp_path_factory.mktemp("vit") / "hf"
    model.save_pretrained(folder)
    transformers.ViTImageProcessorPil(**PROCESSOR).save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def built(source: tuple[Path, torch.nn.Module]) -> Path:
    folder, _ = source
    zoo_ok("import", folder, "-o", folder.parent / "built")
    return folder.parent / "built"


@pytest.fixture(scope="module")
def exports(source: tuple[Path, torch.nn.Module], built: Path) -> dict[str, Path]:
    folder, _ = source
    made = {"built": built}
    for name, flags in (("plain", ()), ("optimize", ("--optimize",))):
        made[name] = folder.parent / name
        zoo_ok("export", built, "--onnx", "--out", made[name], *flags)
    return made


def pixels(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def test_imported_logits_are_transformers(source: tuple[Path, torch.nn.Module],
                                          exports: dict[str, Path]) -> None:
    _, reference = source
    model, built = load_built(exports["built"])
    assert built["labels"] == LABELS and built["image_size"] == 32
    values = torch.from_numpy(pixels(3))
    with torch.no_grad():
        expected = reference(pixel_values=values).logits
        got = model(values)["logits"]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", ["plain", "optimize"])
def test_onnx_logits_are_transformers(source: tuple[Path, torch.nn.Module],
                                      exports: dict[str, Path], variant: str) -> None:
    _, reference = source
    values = pixels(3, seed=1)
    with torch.no_grad():
        expected = reference(pixel_values=torch.from_numpy(values), output_hidden_states=True)
        # the pooled output: the class token's final state (after the final norm)
        final = reference.vit.layernorm(expected.hidden_states[-1])[:, 0].numpy()
    got = load(exports[variant]).runtime.run("onnx/model.onnx", {"pixel_values": values})
    np.testing.assert_allclose(got["logits"], expected.logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(got["sentence_embedding"], final, atol=ATOL, rtol=0)


def test_export_is_in_the_clients_layout(exports: dict[str, Path]) -> None:
    folder = exports["plain"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["ViTForImageClassification"]
    assert config["model_type"] == "vit" and config["id2label"] == {
        str(i): label for i, label in enumerate(LABELS)}
    reread = transformers.ViTConfig.from_pretrained(folder)  # transformers reads it as a ViT
    assert (reread.image_size, reread.patch_size, reread.hidden_size) == (32, 8, 32)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    assert processor["image_mean"] == PROCESSOR["image_mean"] and processor["resample"] == 3
    graph = onnx.load(str(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    assert [i.name for i in graph.input] == ["pixel_values"]
    assert [o.name for o in graph.output] == ["last_hidden_state", "sentence_embedding",
                                              "logits"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "preprocessor_config.json" in manifest["files"]


def test_zoo_run_image_prints_transformers_labels(source: tuple[Path, torch.nn.Module],
                                                  exports: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """From a file to the printed top labels: transformers' processor and model give the same
    labels and scores (to the 3 decimals printed)."""
    folder, reference = source
    rng = np.random.default_rng(3)
    paths = []
    for index, (mode, size) in enumerate([("RGB", (48, 40)), ("RGBA", (20, 33))]):
        channels = len(mode)
        array = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
        paths.append(tmp_path / f"{index}.png")
        Image.fromarray(array, mode).save(paths[-1])
    output = zoo_ok("run", exports["plain"], *[arg for p in paths for arg in ("--image", p)])
    processor = transformers.ViTImageProcessorPil.from_pretrained(folder)
    values = processor([Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        probabilities = softmax(reference(pixel_values=values).logits.numpy())
    printed = [line.strip() for line in output.splitlines() if line.startswith("    ")]
    for row, line in enumerate(printed):
        order = np.argsort(-probabilities[row], kind="stable")
        assert line == ", ".join(f"{LABELS[i]} {probabilities[row, i]:.3f}" for i in order)


def test_a_setting_the_blocks_do_not_compute_is_refused(source: tuple[Path, torch.nn.Module],
                                                        tmp_path: Path) -> None:
    folder, _ = source
    config = json.loads((folder / "config.json").read_text())
    changed = tmp_path / "hf"
    changed.mkdir()
    (changed / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (changed / "config.json").write_text(json.dumps({**config, "qkv_bias": False}))
    assert_one_line_error(zoo("import", changed, "-o", tmp_path / "out"), "qkv_bias=False")
    assert not (tmp_path / "out").exists()


def test_an_image_size_not_a_multiple_of_the_patch_is_refused(tmp_path: Path) -> None:
    line = assert_error_after_progress(zoo("export", "vit-tiny", "--onnx", "--set",
                                           "image_size=30", "--out", tmp_path / "out"))
    assert re.search(r"image_size=30 is not a multiple of patch_size=8", line)
    assert not (tmp_path / "out").exists()


def test_a_patch_stem_outside_an_encoder_is_refused() -> None:
    assert_one_line_error(zoo("show", "vit-tiny", "--set", "family=decoder", "--set",
                              "pooling=mean"),
                          "stem=patch_embedding applies only to family encoder, not decoder")


def test_text_for_an_image_model_is_refused(exports: dict[str, Path]) -> None:
    assert_one_line_error(zoo("run", exports["plain"], "--text", "hello"), "reads images")


def test_a_quantization_without_an_image_check_is_refused_before_tracing(tmp_path: Path
                                                                        ) -> None:
    line = assert_error_after_progress(zoo("export", "vit-tiny", "--onnx", "--quantize",
                                           "int8-dynamic", "--out", tmp_path / "out"))
    assert "--quantize int8-dynamic is not supported for an image encoder; use --quantize " \
        "int8 or int4" in line
    assert not (tmp_path / "out").exists()


def smooth_images(count: int, seed: int) -> list:
    """Colour fields with structure at the patches' scale (not the check's own images)."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)).resize(
        (50, 40), Image.Resampling.BILINEAR) for _ in range(count)]


# (top-1 agreement, largest logit error): the thresholds of the text families' weight-only
# agreement; the errors measured are 0.059 (int8) and 0.46 (int4) on logits up to 1.86
@pytest.mark.parametrize("quantize, top1, logit_error", [
    ("int8", 0.9, 0.1),
    pytest.param("int4", 0.5, 0.75, marks=pytest.mark.slow),  # int8's path, with 4 bits
])
def test_a_quantized_export_agrees_with_transformers_labels(
        source: tuple[Path, torch.nn.Module], built: Path, tmp_path: Path, quantize: str,
        top1: float, logit_error: float) -> None:
    """The export's own agreement check passed (written in its manifest), and on other images,
    through transformers' processor, its labels are transformers' ViTForImageClassification's
    and its logits within a stated error."""
    folder, reference = source
    out = tmp_path / quantize
    output = zoo_ok("export", built, "--onnx", "--quantize", quantize, "--optimize", "--out", out)
    assert f"agreement ({quantize} vs fp32" in output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["quantization"]["agreement"]["passed"]
    processor = transformers.ViTImageProcessorPil.from_pretrained(folder)
    values = processor(smooth_images(48, seed=7), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected = reference(pixel_values=values).logits.numpy()
    got = load(out).runtime.run("onnx/model.onnx", {"pixel_values": values.numpy()})
    agreeing = (got["logits"].argmax(-1) == expected.argmax(-1)).mean()
    error = np.abs(got["logits"] - expected).max()
    assert agreeing >= top1, (agreeing, error)
    assert error < logit_error, (agreeing, error)


def test_the_image_agreement_check_catches_swapped_labels() -> None:
    """A candidate whose logits are the reference's with two labels swapped fails the gate."""
    from export.checks.agreement import THRESHOLDS, AgreementReport, image_agreement
    from export.opening import open_model

    tiny = card("vit-tiny")
    reference = open_model(build_model(tiny, seed=0), tiny)

    class Swapped:
        def run(self, graph: str, feeds: dict) -> dict:
            logits = reference.run(graph, feeds)["logits"]
            order = np.argsort(-logits, axis=-1)
            rows = np.arange(len(logits))
            swapped = logits.copy()  # each image's best and second-best labels swapped
            swapped[rows, order[:, 0]] = logits[rows, order[:, 1]]
            swapped[rows, order[:, 1]] = logits[rows, order[:, 0]]
            return {"logits": swapped}

    row = image_agreement(reference, Swapped(), seed=0)
    assert (row.positions, row.agreeing, row.within_top5) == (32, 0, 32)
    assert not AgreementReport("int8", THRESHOLDS["int8"], [row]).passed


def class_token_maps(reference: torch.nn.Module, folder: Path, image: Path) -> np.ndarray:
    """transformers' attention probabilities, (layers, heads, tokens, tokens), of the image as
    its own processor prepares it."""
    processor = transformers.ViTImageProcessorPil.from_pretrained(folder)
    values = processor(Image.open(image), return_tensors="pt")["pixel_values"]
    reference.vit.set_attn_implementation("eager")  # the probabilities themselves
    with torch.no_grad():
        maps = reference.vit(pixel_values=values, output_attentions=True).attentions
    return np.stack([layer[0].double().numpy() for layer in maps])


def paper_rollout(maps: np.ndarray) -> np.ndarray:
    """Abnar & Zuidema (2020), eq. 1: A = 0.5 W_att + 0.5 I per layer (W_att: the heads'
    mean), and rollout(l_i) = A(l_i) rollout(l_(i-1)) from the first layer up."""
    tokens = maps.shape[-1]
    flow = np.eye(tokens)
    for layer in maps:
        flow = (0.5 * layer.mean(axis=0) + 0.5 * np.eye(tokens)) @ flow
    return flow


def test_attention_over_an_image_and_its_rollout_are_transformers(
        source: tuple[Path, torch.nn.Module], built: Path, tmp_path: Path) -> None:
    """`zoo attention --image`: the class token's row per head of the layer asked for, and the
    rollout across layers, on the patch grid (4 x 4: 32 pixels in patches of 8)."""
    folder, reference = source
    image = tmp_path / "cat.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (37, 45, 3), dtype=np.uint8)
                    ).save(image)
    numbers = tmp_path / "map.json"
    output = zoo_ok("attention", built, "--image", image, "--layer", "0", "-o",
                    tmp_path / "map.png", "--json", numbers)
    assert "5 panels" in output  # 4 heads and the rollout
    drawn = json.loads(numbers.read_text())
    maps = class_token_maps(reference, folder, image)
    assert drawn["grid"] == [4, 4] and [p["head"] for p in drawn["panels"]] == [0, 1, 2, 3]
    for panel in drawn["panels"]:
        np.testing.assert_allclose(panel["weights"], maps[0, panel["head"], 0, 1:].reshape(4, 4),
                                   atol=1e-5)
    np.testing.assert_allclose(drawn["rollout"], paper_rollout(maps)[0, 1:].reshape(4, 4),
                               atol=1e-5)
    assert Image.open(tmp_path / "map.png").size == (1200, 700)  # 3 x 2 panels


def test_attention_of_an_image_model_asks_for_an_image(built: Path, tmp_path: Path) -> None:
    png = tmp_path / "map.png"
    assert_one_line_error(zoo("attention", built, "--ids", "1,2", "-o", png),
                          "reads images: give --image FILE")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    assert_one_line_error(zoo("attention", built, "--image", broken, "-o", png), "broken.png")
    assert not png.exists()


@pytest.mark.slow  # the engines' shared path runs in the transformers test above (PyTorch)
def test_an_attentions_export_draws_the_same_image_maps(built: Path, tmp_path: Path) -> None:
    zoo_ok("export", built, "--onnx", "--attentions", "--out", tmp_path / "out")
    image = tmp_path / "a.png"
    Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(image)
    drawn = {}
    for engine, source in (("onnx", tmp_path / "out"), ("torch", built)):
        zoo_ok("attention", source, "--image", image, "-o", tmp_path / f"{engine}.png",
               "--json", tmp_path / f"{engine}.json")
        drawn[engine] = json.loads((tmp_path / f"{engine}.json").read_text())
    assert drawn["onnx"]["engine"] == "onnx"
    np.testing.assert_allclose(drawn["onnx"]["rollout"], drawn["torch"]["rollout"], atol=1e-5)
    for a, b in zip(drawn["onnx"]["panels"], drawn["torch"]["panels"], strict=True):
        np.testing.assert_allclose(a["weights"], b["weights"], atol=1e-5)


def test_an_import_at_another_image_size_interpolates_as_transformers(
        source: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    """Weights trained at 32 x 32 (a 4 x 4 patch grid) imported for 48 x 48 (6 x 6): the
    logits are transformers' with interpolate_pos_encoding=True on the same 48 x 48 pixels;
    the processor now resizes to 48."""
    folder, reference = source
    out = tmp_path / "at48"
    zoo_ok("import", folder, "-o", out, "--image-size", "48")
    model, built = load_built(out)
    assert built["image_size"] == 48 and model.embeddings.positions.shape == (1, 37, 32)
    values = torch.from_numpy(np.random.default_rng(4).standard_normal((2, 3, 48, 48))
                              .astype(np.float32))
    with torch.no_grad():
        expected = reference(pixel_values=values, interpolate_pos_encoding=True).logits
        got = model(values)["logits"]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 48, "width": 48}
    assert json.loads((out / "source.json").read_text())["positions"]["trained_at"] == 32


def test_an_image_size_the_patches_do_not_divide_is_refused(
        source: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    folder, _ = source
    assert_one_line_error(zoo("import", folder, "-o", tmp_path / "out", "--image-size", "50"),
                          "image_size=50 is not a multiple of patch_size=8")
    assert not (tmp_path / "out").exists()


def test_the_image_bench_times_torch_transformers_and_onnx_runtime(
        exports: dict[str, Path]) -> None:
    """Every figure present (no timing asserted): PyTorch, transformers' class and ONNX Runtime
    at batch 1 and 8, images per second the batch over the median. Given limits stand in for
    the machine's probes (the slow test below runs the whole command)."""
    from export.bench.context import Context
    from export.bench.image import bench_image, image_summary
    from export.opening import open_export

    model, built = load_built(exports["built"])
    limits = {"torch_flops_per_s": 1e9, "ort_flops_per_s": 1e9}
    context = Context(open_export(exports["plain"]), model.eval(), built, "cpu", 1, limits,
                      lambda message: None)
    measurements = bench_image(context)
    assert list(measurements) == ["forward_b1_32px", "forward_b8_32px"]
    for name, batch in zip(measurements, (1, 8), strict=True):
        assert set(measurements[name]) == {"torch", "transformers", "ort"}
        for figure in measurements[name].values():
            assert figure["images_per_s"] == pytest.approx(batch * 1000 / figure["median_ms"])
    assert {"forward_b8_32px_transformers_images_per_s", "forward_b8_32px_ort_images_per_s",
            "forward_b1_32px_ort_over_transformers_latency"} <= set(image_summary(measurements))


@pytest.mark.slow  # the machine's probes; the figures: the test above
def test_zoo_bench_on_a_vit_export_writes_its_figures(exports: dict[str, Path],
                                                      tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    output = zoo_ok("bench", exports["optimize"], "--repeats", "1", "--threads", "1", "--json",
                    out)
    assert "forward_b8_32px_ort_images_per_s" in output
    result = json.loads(out.read_text())
    assert set(result["measurements"]["forward_b8_32px"]) == {"torch", "transformers", "ort"}
