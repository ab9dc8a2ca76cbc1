"""A mixture of experts exported (moe-tiny): --optimize's shared-cache graph generates the
PyTorch model's tokens on a left-padded batch, and --quantize int4/int8 reaches every expert's
weights (the plain export's parity grid runs in tests/export/test_export.py, as for every tiny
card)."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
from onnx import helper

from export.opening import open_model
from runtime.contract import MODEL_GRAPH, quantized_name
from runtime.generate import generate, left_padded
from tests.conftest import SharedExport, card, on_shared
from zoo.assemble import build_model

pytestmark = on_shared("moe-tiny")
PROMPTS = [[11, 52, 7, 80, 33, 19, 64], [40, 9, 71, 23]]
STEPS = 12


def test_the_shared_cache_graph_runs_onnx_runtimes_moe_and_gives_pytorchs_tokens(
        shared_export: SharedExport) -> None:
    from export.onnx.shared_cache import KV_FILE
    from zoo import GenerateOptions, load

    folder, _ = shared_export("moe-tiny", "optimize")  # its parity grid passed to get here
    graph = onnx.load(str(folder / KV_FILE), load_external_data=False)
    # ONNX Runtime's own operators: attention, and each sparse layer's experts (top k only)
    assert [n.op_type for n in graph.graph.node if n.op_type in ("GroupQueryAttention", "MoE")
            ] == ["GroupQueryAttention", "MoE"] * 2
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["generation"]["experts"] == "com.microsoft.MoE"
    tiny = card("moe-tiny")
    ids, mask = left_padded(PROMPTS, tiny["pad_token_id"])
    expected = generate(open_model(build_model(tiny, seed=1), tiny), ids, mask, STEPS)
    got = load(folder).generate(PROMPTS, GenerateOptions(max_new_tokens=STEPS))
    assert [row.ids for row in got] == expected.tolist()


def test_genai_runs_the_shared_cache_graph_with_its_moe(shared_export: SharedExport) -> None:
    """GenAI's own loop on --optimize's graph (MoE operator inside) gives the zoo's tokens."""
    pytest.importorskip("onnxruntime_genai")
    from tests.support.genai import genai_greedy
    from zoo import GenerateOptions, load

    folder, _ = shared_export("moe-tiny", "optimize")
    prompts = [[40, 41, 42, 43], [7, 8]]
    zoo = [row.ids for row in load(folder).generate(prompts, GenerateOptions(max_new_tokens=6))]
    assert genai_greedy(folder, prompts, 6) == zoo


@pytest.mark.parametrize("variant", ["int4", pytest.param("int8", marks=pytest.mark.slow)])
def test_quantizing_reaches_every_experts_weights(variant: str,
                                                  shared_export: SharedExport) -> None:
    """Every MatMulNBits is (K, N) of the model's linear weights, fused or not: together they
    hold every nn.Linear weight of the model, the router and all experts included, and no
    MatMul on a constant weight is left."""
    folder, _ = shared_export("moe-tiny", variant)  # its agreement check passed to get here
    file = folder / quantized_name(MODEL_GRAPH, variant)  # model_q4.onnx, model_int8.onnx
    graph = onnx.load(str(file), load_external_data=False).graph
    constants = {tensor.name for tensor in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in constants]
    quantized = [{a.name: helper.get_attribute_value(a) for a in n.attribute}
                 for n in graph.node if n.op_type == "MatMulNBits"]
    assert all(q["bits"] == int(variant[3:]) for q in quantized)
    model = build_model(card("moe-tiny"), seed=1)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear += model.head.weight.numel()  # the untied LM head, a matrix of its own
    experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    assert experts > linear / 2  # most of the model: a quantizer that skipped them would show
    assert sum(q["K"] * q["N"] for q in quantized) == linear
