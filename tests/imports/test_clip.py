"""CLIP (registry/maps/clip.yaml, registry/dual.py, cards clip-*): the counts against
transformers' CLIPModel on the meta device, and a tiny random CLIPModel folder (with a tiny
CLIP tokenizer and its CLIPImageProcessor) imported, computing transformers' image embeddings,
text embeddings (a batch with padding) and logits_per_image in PyTorch, then exported in the
clients' layout and computing them through ONNX Runtime (plain; --optimize is slow).
transformers is the reference: no download."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file, save_file

from export.families.dual import DualEncoderFamily
from registry.params import total_parameters
from runtime.exported import load
from tests.conftest import card
from tests.support.clip_folders import (
    END,
    TEXT,
    VISION,
    tiny_clip_folder,
    tiny_config,
    tiny_processor,
    tiny_tokenizer,
)
from tests.support.contract_doc import documented_contract
from tests.support.helpers import assert_error_after_progress, assert_one_line_error, zoo, zoo_ok
from tests.support.hf_decoders import assert_import_refused, changed_source
from tests.support.serve import KEY, Server
from zoo.assemble import build_model
from zoo.files.weights import load_built

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
ATOL = 1e-4


def test_counts_are_transformers() -> None:
    """openai/clip-vit-base-patch32's sizes are CLIPConfig's defaults."""
    with torch.device("meta"):
        reference = transformers.CLIPModel(transformers.CLIPConfig())
        model = build_model(card("clip-vit-base-patch32"), meta=True)
    published = 151_277_313  # openai/clip-vit-base-patch32
    assert sum(p.numel() for p in reference.parameters()) == published
    assert sum(p.numel() for p in model.parameters()) == published
    assert total_parameters(card("clip-vit-base-patch32").fields) == published


def test_tiny_card_count_is_transformers() -> None:
    with torch.device("meta"):
        reference = transformers.CLIPModel(tiny_config())
    assert total_parameters(card("clip-tiny").fields) == sum(
        p.numel() for p in reference.parameters())


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("clip") / "hf"
    model = tiny_clip_folder(folder)
    return folder, model


@pytest.fixture(scope="module")
def built(source: tuple[Path, torch.nn.Module]) -> Path:
    folder, _ = source
    out = folder.parent / "built"
    zoo_ok("import", folder, "-o", out)
    return out


def texts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three texts right-padded with the end token, as CLIP's tokenizer pads: the end token
    first at 4, 8 and 2. Rows 1 and 2 mask their padding; row 0 attends to all of it (a client
    that sends no mask), so its vector is at the first end token, not the last one attended."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, END - 1, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    for row, length in enumerate([5, 9, 3]):
        ids[row, length - 1:] = END
        mask[row, length:] = 0 if row else 1
    return ids, mask


def pixels(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(2))


def test_imported_embeddings_and_logits_are_transformers(
        source: tuple[Path, torch.nn.Module], built: Path) -> None:
    _, reference = source
    model, imported = load_built(built)
    assert imported["eos_token_id"] == END and imported["vision"]["d_model"] == 48
    ids, mask = texts()
    values = pixels(2)
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, pixel_values=values)
        text = reference.text_model(input_ids=ids, attention_mask=mask)
        image = reference.vision_model(pixel_values=values)
        # CLIPTextModelWithProjection's and CLIPVisionModelWithProjection's embeds
        text_embeds = reference.text_projection(text.pooler_output)
        image_embeds = reference.visual_projection(image.pooler_output)
        got = model(ids, mask, values)
        got_text, got_image = model.encode_text(ids, mask), model.encode_image(values)
    for name in ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"):
        torch.testing.assert_close(got[name], getattr(expected, name), atol=ATOL, rtol=0)
    torch.testing.assert_close(got_text["text_embeds"], text_embeds, atol=ATOL, rtol=0)
    real = mask.bool()  # the padded positions' states are not compared: nothing reads them
    torch.testing.assert_close(got_text["last_hidden_state"][real],
                               text.last_hidden_state[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(got_image["image_embeds"], image_embeds, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_image["last_hidden_state"], image.last_hidden_state,
                               atol=ATOL, rtol=0)


def test_an_openai_style_file_imports(source: tuple[Path, torch.nn.Module],
                                      tmp_path: Path) -> None:
    """openai's config.json says eos_token_id 2, which transformers reads as "pool at the
    highest id": the import pools at the vocabulary's last id, the end token there. Its
    weights carry the position_ids buffers older transformers saved: left out, and named."""
    config = tiny_config().to_dict()
    config["text_config"]["eos_token_id"] = 2
    folder = changed_source(source[0], {"text_config": config["text_config"]}, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["text_model.embeddings.position_ids"] = torch.arange(16)[None]
    tensors["vision_model.embeddings.position_ids"] = torch.arange(17)[None]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    zoo_ok("import", folder, "-o", tmp_path / "out")
    assert load_built(tmp_path / "out")[1]["eos_token_id"] == TEXT["vocab_size"] - 1
    record = json.loads((tmp_path / "out" / "source.json").read_text())
    assert record["ignored"] == ["text_model.embeddings.position_ids",
                                 "vision_model.embeddings.position_ids"]


def test_a_tower_alone_and_other_activations_are_refused(
        source: tuple[Path, torch.nn.Module], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = tiny_config().to_dict()
    config["vision_config"]["hidden_act"] = "relu6"
    changed_source(source[0], {"vision_config": config["vision_config"]}, tmp_path)
    assert_import_refused(tmp_path, "vision_config.hidden_act='relu6'", "not supported")
    (tmp_path / "src" / "config.json").unlink()
    transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**VISION)
                                               ).save_pretrained(tmp_path / "src")
    assert_import_refused(tmp_path, "CLIPVisionModelWithProjection", "not a known layout")


@pytest.fixture(scope="module")
def exports(built: Path) -> dict[str, Path]:
    made = {}
    for name, flags in (("plain", ()),):  # --optimize's: test_optimized_onnx_is_transformers
        made[name] = built.parent / name
        zoo_ok("export", built, "--onnx", "--out", made[name], *flags)
    return made


def test_export_is_in_the_clients_layout(exports: dict[str, Path]) -> None:
    folder = exports["plain"]
    reread = transformers.CLIPConfig.from_pretrained(folder)  # transformers reads it as CLIP
    assert reread.architectures == ["CLIPModel"] and reread.projection_dim == 24
    assert (reread.text_config.hidden_size, reread.vision_config.hidden_size) == (32, 48)
    assert reread.text_config.eos_token_id == END and reread.vision_config.patch_size == 8
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    assert processor["image_processor_type"] == "CLIPImageProcessor"
    assert (folder / "tokenizer.json").is_file()
    graphs = {name: onnx.load(str(folder / "onnx" / f"{name}.onnx")).graph
              for name in ("text_model", "vision_model", "model")}
    assert {f"onnx/{name}.onnx": ([i.name for i in g.input], [o.name for o in g.output])
            for name, g in graphs.items()} == documented_contract(load_built(folder)[1])
    axes = [d.dim_param for d in graphs["model"].output[0].type.tensor_type.shape.dim]
    assert axes == ["image_batch_size", "text_batch_size"]
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == [
        "model.onnx", "text_model.onnx", "vision_model.onnx"]  # each whole: no shared data


def onnx_matches_transformers(source: tuple[Path, torch.nn.Module], folder: Path) -> None:
    """Each graph's outputs on tokenized texts (padded) and processed images: transformers'."""
    hf_folder, reference = source
    encoded = tiny_tokenizer()(["a photo of a cat", "a dog", "dog"], padding=True,
                               return_tensors="np")
    rng = np.random.default_rng(4)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
              for h, w in ((40, 32), (32, 57))]
    values = tiny_processor()(images, return_tensors="np")["pixel_values"]
    ids, mask = encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)
    with torch.no_grad():
        expected = reference(input_ids=torch.from_numpy(ids),
                             attention_mask=torch.from_numpy(mask),
                             pixel_values=torch.from_numpy(values))
        text = reference.text_model(input_ids=torch.from_numpy(ids),
                                    attention_mask=torch.from_numpy(mask))
        text_embeds = reference.text_projection(text.pooler_output).numpy()
        image = reference.vision_model(pixel_values=torch.from_numpy(values))
        image_embeds = reference.visual_projection(image.pooler_output).numpy()
    runtime = load(folder).runtime
    joint = runtime.run("onnx/model.onnx", {"input_ids": ids, "attention_mask": mask,
                                            "pixel_values": values})
    for name in ("logits_per_image", "logits_per_text", "text_embeds", "image_embeds"):
        np.testing.assert_allclose(joint[name], getattr(expected, name).numpy(), atol=ATOL,
                                   rtol=0, err_msg=name)
    got = runtime.run("onnx/text_model.onnx", {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(got["text_embeds"], text_embeds, atol=ATOL, rtol=0)
    real = mask.astype(bool)
    np.testing.assert_allclose(got["last_hidden_state"][real],
                               text.last_hidden_state.numpy()[real], atol=ATOL, rtol=0)
    got = runtime.run("onnx/vision_model.onnx", {"pixel_values": values})
    np.testing.assert_allclose(got["image_embeds"], image_embeds, atol=ATOL, rtol=0)
    np.testing.assert_allclose(got["last_hidden_state"], image.last_hidden_state.numpy(),
                               atol=ATOL, rtol=0)


def test_onnx_is_transformers(source: tuple[Path, torch.nn.Module],
                              exports: dict[str, Path]) -> None:
    onnx_matches_transformers(source, exports["plain"])


@pytest.mark.slow  # an export of its own; the plain one is test_onnx_is_transformers
def test_optimized_onnx_is_transformers(source: tuple[Path, torch.nn.Module], built: Path,
                                        tmp_path: Path) -> None:
    zoo_ok("export", built, "--onnx", "--optimize", "--out", tmp_path / "optimized")
    onnx_matches_transformers(source, tmp_path / "optimized")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three images of other sizes and modes than the model's (the processor's resize, crop
    and RGB conversion all act), named so that name order is not creation order."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(5)
    for name, mode, (width, height) in (("b.png", "RGB", (40, 50)), ("a.jpg", "RGB", (64, 33)),
                                        ("c.png", "RGBA", (33, 33))):
        array = rng.integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
        Image.fromarray(array, mode).save(folder / name)
    (folder / "notes.txt").write_text("not an image")
    return folder


def transformers_vectors(reference: torch.nn.Module, texts: list[str], images: list[Path]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit text vectors, unit image vectors, logits_per_image) from transformers' tokenizer,
    processor and CLIPModel."""
    encoded = tiny_tokenizer()(texts, padding=True, return_tensors="pt")
    values = tiny_processor()([Image.open(path) for path in images],
                              return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = reference(**encoded, pixel_values=values)
    return out.text_embeds.numpy(), out.image_embeds.numpy(), out.logits_per_image.numpy()


def test_zoo_embed_images_and_texts_are_transformers(source: tuple[Path, torch.nn.Module],
                                                     exports: dict[str, Path],
                                                     image_folder: Path, tmp_path: Path
                                                     ) -> None:
    texts = ["a photo of a cat", "a dog", "dog dog dog"]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    zoo_ok("embed", exports["plain"], "--images", image_folder, "-o", tmp_path / "images.npy")
    zoo_ok("embed", exports["plain"], "--data", tmp_path / "texts.txt", "-o",
           tmp_path / "texts.npy")
    images = sorted(p for p in image_folder.iterdir() if p.suffix != ".txt")  # a, b, c
    text_vectors, image_vectors, _ = transformers_vectors(source[1], texts, images)
    np.testing.assert_allclose(np.load(tmp_path / "images.npy"), image_vectors, atol=ATOL,
                               rtol=0)
    np.testing.assert_allclose(np.load(tmp_path / "texts.npy"), text_vectors, atol=ATOL, rtol=0)


def test_zoo_run_zero_shot_prints_transformers_scores(source: tuple[Path, torch.nn.Module],
                                                      exports: dict[str, Path],
                                                      image_folder: Path) -> None:
    """Each image's labels: the softmax over the labels' texts (in the template) of
    transformers' logits_per_image, to the 3 decimals printed, most likely first."""
    labels = ["cat", "dog", "do cat"]
    images = [image_folder / "b.png", image_folder / "c.png"]
    output = zoo_ok("run", exports["plain"], *[a for p in images for a in ("--image", p)],
                    "--labels", ",".join(labels), "--template", "a {}.")
    _, _, logits = transformers_vectors(source[1], [f"a {x}." for x in labels],
                                        images)
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    printed = [line.strip() for line in output.splitlines() if line.startswith("    ")]
    assert len(printed) == 2
    for row, line in enumerate(printed):
        order = np.argsort(-probabilities[row], kind="stable")
        assert line == ", ".join(f"{labels[i]} {probabilities[row, i]:.3f}" for i in order)


def test_embed_and_zero_shot_refusals(exports: dict[str, Path], image_folder: Path,
                                      tmp_path: Path) -> None:
    folder = exports["plain"]
    assert_one_line_error(zoo("embed", folder, "-o", tmp_path / "x.npy"), "--data", "--images")
    assert_one_line_error(zoo("embed", folder, "--images", tmp_path, "-o", tmp_path / "x.npy"),
                          "no image files")
    assert_one_line_error(zoo("run", folder, "--text", "a dog", "--labels", "a,b"),
                          "--image FILE")
    image = str(image_folder / "b.png")
    assert_one_line_error(zoo("run", folder, "--image", image, "--labels", "a,a"),
                          "two or more different labels")
    assert_one_line_error(zoo("run", folder, "--image", image, "--labels", "a,b", "--template",
                              "no slot"), "{}")
    assert not (tmp_path / "x.npy").exists()


def test_serve_embeds_images_and_texts_as_jina_clip_inputs(
        source: tuple[Path, torch.nn.Module], exports: dict[str, Path], image_folder: Path,
        tmp_path: Path) -> None:
    """`zoo serve`'s /v1/embeddings takes Jina AI's multimodal input (strings, {"text"},
    {"image": base64 or a data URL}) for a dual encoder: every item's unit vector in order,
    transformers'; an image that is not one, a URL, bad base64: a 400 naming the input."""
    images = [image_folder / "b.png", image_folder / "a.jpg"]
    encoded = [base64.b64encode(path.read_bytes()).decode() for path in images]
    texts = ["a dog", "a photo of a cat"]
    text_vectors, image_vectors, _ = transformers_vectors(source[1], texts, images)
    server = Server([exports["plain"]], tmp_path / "serve.log", "--api-key", KEY)
    try:
        status, reply = server.request("/v1/embeddings", {"model": "plain", "input": [
            {"text": texts[0]}, {"image": encoded[0]}, texts[1],
            {"image": "data:image/jpeg;base64," + encoded[1]}]})
        assert status == 200, reply
        got = np.array([row["embedding"] for row in reply["data"]])
        expected = np.stack([text_vectors[0], image_vectors[0], text_vectors[1],
                             image_vectors[1]])
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
        for image, field, words in (
                (base64.b64encode(b"not an image").decode(), "input[0].image", "not an image"),
                ("https://example.com/cat.png", "input[0].image", "fetches no URL"),
                ("%%%", "input[0].image", "base64")):
            status, reply = server.request("/v1/embeddings", {"model": "plain",
                                                              "input": [{"image": image}]})
            assert status == 400 and field in reply["error"]["message"], reply
            assert words in reply["error"]["message"], reply
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(("flag", "words"), [
    (("--quantize", "int8-dynamic"), "--quantize int8-dynamic is not supported for a dual "
                                     "encoder; use --quantize int8 or int4"),
    (("--attentions",), "--attentions: a dual-encoder's graphs have no attention maps")])
def test_what_a_dual_export_cannot_do_is_refused_before_tracing(
        flag: tuple[str, ...], words: str, tmp_path: Path) -> None:
    line = assert_error_after_progress(zoo("export", "clip-tiny", "--onnx", *flag, "--out",
                                           tmp_path / "out"))
    assert words in line
    assert not (tmp_path / "out").exists()


class Reversed:
    """A candidate engine whose texts come out in reverse order: each image's likeliest text is
    another one (the agreement check must count it as disagreeing)."""

    def __init__(self, runtime: object) -> None:
        self.runtime, self.card = runtime, runtime.card

    def run(self, file: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.runtime.run(file, feeds)
        return {**out, "logits_per_image": out["logits_per_image"][:, ::-1]}


def test_the_quantization_check_counts_images_matched_to_other_texts(
        exports: dict[str, Path]) -> None:
    runtime = load(exports["plain"]).runtime
    family = DualEncoderFamily()
    same = family.agreement(runtime, runtime, 0, 0)
    assert same.positions == 32 and same.agreeing == same.within_top5 == 32
    assert same.max_logit_diff == 0
    reversed_texts = family.agreement(runtime, Reversed(runtime), 0, 0)
    assert reversed_texts.agreeing < 32 and reversed_texts.max_logit_diff > 0


@pytest.mark.slow  # an export of its own; the check's counting is the test above
def test_an_int8_export_gives_transformers_top_labels(source: tuple[Path, torch.nn.Module],
                                                      built: Path, image_folder: Path,
                                                      tmp_path: Path) -> None:
    zoo_ok("export", built, "--onnx", "--quantize", "int8", "--out", tmp_path / "int8")
    assert (tmp_path / "int8" / "onnx" / "model_int8.onnx").is_file()
    labels = ["cat", "dog", "do cat"]
    images = sorted(p for p in image_folder.iterdir() if p.suffix != ".txt")
    output = zoo_ok("run", tmp_path / "int8", *[a for p in images for a in ("--image", p)],
                    "--labels", ",".join(labels))
    _, _, logits = transformers_vectors(source[1], labels, images)
    best = [line.strip().split(", ")[0].rsplit(" ", 1)[0] for line in output.splitlines()
            if line.startswith("    ")]  # "do cat 0.412, dog 0.299, ...": the first label
    assert best == [labels[i] for i in logits.argmax(-1)]
