"""LoRA and PEFT both ways beyond Llama (issue 46): on tiny random transformers models of Qwen3,
Gemma 3 (rows of tests/support/hf_decoders.py), BERT (BertForMaskedLM) and T5
(T5ForConditionalGeneration, encoder and decoder), `zoo import`ed. The adapter the zoo writes
(write_adapter, every linear the zoo's targets name) is read by `peft.PeftModel.from_pretrained`
over transformers' model and gives the zoo's outputs; an adapter PEFT made itself on every
linear ("all-linear"), `zoo import BASE --adapter`ed, gives PeftModel's. So each family's map
from the zoo's linear names to transformers' module names is exercised, one name each.
tests/imports/test_lora_peft.py has the Llama case, training and the refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.helpers import zoo_ok
from tests.support.hf_decoders import DECODERS, randomise, saved
from tests.support.t5_folder import t5_folder
from zoo.blocks.lora import TARGETS, add_adapters, targeted
from zoo.files.peft_adapter import write_adapter
from zoo.files.sources import load_source

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

BERT = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, vocab_size=100)
IDS = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(7))
DECODER_IDS = torch.randint(3, 90, (2, 5), generator=torch.Generator().manual_seed(8))


def _decoder(row_id: str) -> Callable[[Path], tuple[Path, Any]]:
    row = DECODERS[row_id]
    return lambda root: (saved(row, root / row_id)[0], getattr(transformers, row.model))


def _bert(root: Path) -> tuple[Path, Any]:
    model = transformers.BertForMaskedLM(transformers.BertConfig(**BERT))
    randomise(model, std=0.3, norm_mean=0.0).save_pretrained(root / "bert")
    return root / "bert", transformers.BertForMaskedLM


def _t5(root: Path) -> tuple[Path, Any]:
    return t5_folder(root)[0], transformers.T5ForConditionalGeneration


FAMILIES = {"qwen3": _decoder("qwen3"), "gemma3": _decoder("gemma3"), "bert": _bert,
            "t5": _t5}
TASK_TYPES = {"qwen3": "CAUSAL_LM", "gemma3": "CAUSAL_LM", "bert": None,  # PEFT's TaskType
              "t5": "SEQ_2_SEQ_LM"}


def _outputs(model: torch.nn.Module, seq2seq: bool, zoo_model: bool) -> torch.Tensor:
    """Logits of IDS: the LM's, BERT's MLM head's, T5's decoder's (teacher-forced)."""
    with torch.no_grad():
        if not zoo_model:
            kwargs = {"decoder_input_ids": DECODER_IDS} if seq2seq else {}
            return model(input_ids=IDS, **kwargs).logits
        out = model(IDS, DECODER_IDS) if seq2seq else model(IDS)
    if isinstance(out, dict):  # the encoder's outputs by name
        return out["logits"]
    return out[0] if isinstance(out, tuple) else out  # a decoder's (logits, cache)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Path, Any, Path, str | None]:
    """(the transformers folder, its class, its `zoo import`, PEFT's task type for it)."""
    root = tmp_path_factory.mktemp(f"peft-{request.param}")
    folder, model_class = FAMILIES[request.param](root)
    zoo_ok("import", folder, "-o", root / "imported")
    return folder, model_class, root / "imported", TASK_TYPES[request.param]


def _seq2seq(model_class: Any) -> bool:
    return model_class is transformers.T5ForConditionalGeneration


def _peft_outputs(hf: Path, model_class: Any, adapter: Path) -> tuple[torch.Tensor, ...]:
    """(PeftModel's outputs over transformers' model, the base's without the adapter, the
    names of the modules PEFT put an adapter on)."""
    wrapped = peft.PeftModel.from_pretrained(model_class.from_pretrained(hf).eval(), adapter)
    theirs = _outputs(wrapped.eval(), _seq2seq(model_class), zoo_model=False)
    with wrapped.disable_adapter():
        plain = _outputs(wrapped, _seq2seq(model_class), zoo_model=False)
    adapted = [name for name, _ in wrapped.named_modules() if name.endswith("lora_A.default")]
    return theirs, plain, adapted


def _randomise_b(model: torch.nn.Module) -> None:
    """B as though trained (its init is zero: the adapter would change nothing)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))


def test_the_zoos_adapter_reads_in_peft_with_the_zoos_outputs(
        family: tuple[Path, Any, Path, str | None], tmp_path: Path) -> None:
    hf, model_class, imported, task_type = family
    model, card = load_source(str(imported), merge=False)
    present = [target for target in TARGETS if targeted(model, [target])]
    names = add_adapters(model, present, rank=4, alpha=12)
    _randomise_b(model)
    config = write_adapter(model.eval(), card, tmp_path)
    theirs, plain, adapted = _peft_outputs(hf, model_class, tmp_path)
    ours = _outputs(model, _seq2seq(model_class), zoo_model=True)
    assert len(adapted) == len(names), config["target_modules"]  # each found its module
    assert config["task_type"] == task_type  # PEFT wraps T5 in PeftModelForSeq2SeqLM
    assert (theirs - plain).abs().max() > 1e-2  # the adapter moved the outputs
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_import_of_a_peft_adapter_on_every_linear_gives_peftmodels_outputs(
        family: tuple[Path, Any, Path, str | None], tmp_path: Path) -> None:
    hf, model_class, _, _ = family
    torch.manual_seed(0)
    wrapped = peft.get_peft_model(model_class.from_pretrained(hf), peft.LoraConfig(
        r=4, lora_alpha=12, target_modules="all-linear"))
    _randomise_b(wrapped)
    wrapped.save_pretrained(tmp_path / "adapter")
    zoo_ok("import", hf, "--adapter", tmp_path / "adapter", "-o", tmp_path / "out")
    theirs, plain, _ = _peft_outputs(hf, model_class, tmp_path / "adapter")
    assert (theirs - plain).abs().max() > 1e-2
    ours = _outputs(load_source(str(tmp_path / "out"))[0], _seq2seq(model_class), zoo_model=True)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
