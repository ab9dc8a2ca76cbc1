"""LoRA and PEFT both ways on a tiny LlamaForCausalLM (seeded, saved with save_pretrained,
`zoo import`ed): the adapter `zoo train --lora` writes is read by
`peft.PeftModel.from_pretrained` over transformers' model and gives the zoo's logits; an
adapter PEFT itself trained and saved, `zoo import BASE --adapter`ed, gives PeftModel's logits;
other PEFT types and adapters that fit no linear are refused in one line, nothing written.
Not a row of tests/support/hf_decoders.py: the adapter is the subject, not the architecture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.decoder_folders import llama_folder
from tests.support.helpers import assert_one_line_error, zoo, zoo_ok
from zoo.files.sources import load_source

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

TARGETS = "query,key,value,out,gate,up,down"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the transformers folder, its `zoo import`)."""
    root = tmp_path_factory.mktemp("lora-base")
    folder = llama_folder(root)
    zoo_ok("import", folder, "-o", root / "imported")
    return folder, root / "imported"


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(7))


def _zoo_logits(folder: Path) -> torch.Tensor:
    model, _ = load_source(str(folder))
    with torch.no_grad():
        return model(_ids())[0]


def _peft_logits(hf: Path, adapter: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(PeftModel's logits over transformers' model, the base's without the adapter)."""
    model = transformers.LlamaForCausalLM.from_pretrained(hf).eval()
    wrapped = peft.PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        theirs = wrapped(input_ids=_ids()).logits
        with wrapped.disable_adapter():
            plain = wrapped(input_ids=_ids()).logits
    return theirs, plain


@pytest.mark.parametrize("extra", [[], ["--rslora", "--lora-alpha", "3"]],
                         ids=["alpha-over-r", "rslora"])
def test_zoo_trained_adapter_reads_in_peft_with_the_zoos_logits(
        base: tuple[Path, Path], tmp_path: Path, extra: list[str]) -> None:
    hf, imported = base
    out = tmp_path / "out"
    zoo_ok("train", imported, "--task", "lm", "--steps", "4", "--batch-size", "2",
           "--block-size", "16", "--lr", "2e-2", "--warmup", "1", "--lora", "4",
           "--lora-targets", TARGETS, "-o", out, *extra)
    theirs, plain = _peft_logits(hf, out)
    ours = _zoo_logits(out)
    assert (theirs - plain).abs().max() > 1e-2  # the adapter moved the logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def _peft_adapter(hf: Path, out: Path, **config: object) -> Path:
    """An adapter PEFT makes and saves itself over transformers' model, its B random (as
    though trained), A PEFT's init."""
    model = transformers.LlamaForCausalLM.from_pretrained(hf)
    torch.manual_seed(0)
    settings = {"r": 4, "lora_alpha": 12, "task_type": "CAUSAL_LM",
                "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"], **config}
    wrapped = peft.get_peft_model(model, peft.LoraConfig(**settings))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    wrapped.save_pretrained(out)
    return out


@pytest.mark.parametrize("config", [{}, {"use_rslora": True}], ids=["alpha-over-r", "rslora"])
def test_import_of_a_peft_adapter_gives_peftmodels_logits(
        base: tuple[Path, Path], tmp_path: Path, config: dict[str, object]) -> None:
    hf, _ = base
    adapter = _peft_adapter(hf, tmp_path / "adapter", **config)
    printed = zoo_ok("import", hf, "--adapter", adapter, "-o", tmp_path / "out")
    assert "LoRA adapter from" in printed
    theirs, plain = _peft_logits(hf, adapter)
    assert (theirs - plain).abs().max() > 1e-2
    torch.testing.assert_close(_zoo_logits(tmp_path / "out"), theirs, atol=1e-4, rtol=0)


def test_other_peft_types_and_misfit_adapters_are_refused(base: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    hf, _ = base
    adapter = _peft_adapter(hf, tmp_path / "adapter")
    ia3 = shutil.copytree(adapter, tmp_path / "ia3")
    config = json.loads((ia3 / "adapter_config.json").read_text())
    (ia3 / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    assert_one_line_error(zoo("import", hf, "--adapter", ia3, "-o", tmp_path / "a"),
                          "ia3/adapter_config.json: peft_type: 'IA3'", "only LORA")
    wide = shutil.copytree(adapter, tmp_path / "wide")
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 8}))
    assert_one_line_error(zoo("import", hf, "--adapter", wide, "-o", tmp_path / "b"),
                          "wide/adapter_model.safetensors: base_model.model.model.layers.0."
                          "mlp.down_proj.lora_A.weight: shape (4, 48), expected (8, 48)")
    head = _peft_adapter(hf, tmp_path / "head", target_modules=["q_proj", "lm_head"])
    assert_one_line_error(zoo("import", hf, "--adapter", head, "-o", tmp_path / "c"),
                          "head/adapter_model.safetensors: base_model.model.lm_head.",
                          "names no linear")
    outside = shutil.copytree(adapter, tmp_path / "outside")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "adapter_config.json").symlink_to(outside / "adapter_config.json")
    shutil.copy(adapter / "adapter_model.safetensors", linked)
    result = zoo("import", hf, "--adapter", linked, "-o", tmp_path / "d")
    assert result.exit_code == 2 and "adapter_config.json" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "head", "ia3", "linked",
                                                          "outside", "wide"]
