"""The GPT-style decoder: one graph (model.onnx) that serves the first step and every later one;
with --optimize also model_kv.onnx, whose cache is updated in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from torch import nn

from export.checks.agreement import Agreement, generation_agreement
from export.checks.cases import decoder_cases
from export.families.sequence import SequenceDecoderFamily
from export.family import Case, Extras, Family, GraphIO, Input
from export.onnx.experts import OPERATOR as EXPERTS_OPERATOR
from export.onnx.experts import experts_operator
from export.onnx.files import set_metadata, strip_debug
from export.onnx.gqa_rules import AttentionPlan, attention_plan
from export.onnx.shared_cache import KV_FILE, kv_names, kv_trace, shared_cache_attention
from export.onnx.trace import export_graph
from export.onnx.wrappers import DecoderGraph
from export.targets.genai import GenAIFiles, decoder_genai
from registry.blocks import ROTARY
from registry.catalog import Card
from registry.families import DECODER
from registry.sizes import attention_sizes
from runtime.contract import MODEL_GRAPH
from runtime.generate import open_session
from zoo.blocks.heads import LMHead

AGREEMENT_PROMPT = 8
PLAIN_ATTENTION = "MatMul and Softmax on the cache passed in and out (the contract graph)"
KV_FILE_PATH = Path(KV_FILE)
SEQUENCE = SequenceDecoderFamily()  # a decoder card with a pooling (export/families/sequence.py)


class DecoderFamily(Family):
    spec = DECODER
    optimizer_model_type = "gpt2"
    attention_fusion_note = f"generation uses {KV_FILE} (GroupQueryAttention) instead"

    def variant(self, card: Any) -> Family:
        return SEQUENCE if card["pooling"] is not None else self

    def graphs(self, card: Card) -> dict[str, GraphIO]:
        inputs = (Input("input_ids", ("batch_size", "sequence_length"), "ids"),
                  Input("attention_mask", ("batch_size", "total_sequence_length"), "ones"),
                  Input("position_ids", ("batch_size", "sequence_length"), "positions"))
        return {MODEL_GRAPH: GraphIO(inputs, (LMHead.graph_output,), DecoderGraph,
                                      cache_infix="", attention_groups=("attentions",))}

    def parity_cases(self, reference: Any, rng: np.random.Generator) -> list[Case]:
        return decoder_cases(reference, rng)

    def agreement(self, reference: Any, candidate: Any, steps: int, seed: int) -> Agreement:
        steps = min(steps, reference.card["max_positions"] - AGREEMENT_PROMPT)
        capacity = AGREEMENT_PROMPT + steps
        return generation_agreement(open_session(reference, capacity, True),
                                    open_session(candidate, capacity, True),
                                    reference.card, AGREEMENT_PROMPT, steps, seed)

    @staticmethod
    def attention_plan(card: Card) -> AttentionPlan:
        return attention_plan(attention_sizes(card).head_dim, card["position"] == ROTARY)

    def optimized_extras(self, model: nn.Module, card: Card, opset: int,
                         metadata: dict[str, str], progress: Any) -> Extras:
        plan = self.attention_plan(card)
        if not plan.runs:  # the fusions still apply to the contract graph; it generates
            progress(f"no {KV_FILE}: {plan.why}")
            return Extras({}, {"attention": {MODEL_GRAPH: PLAIN_ATTENTION, KV_FILE:
                                             f"not made: {plan.why}"}})
        progress(f"exporting {KV_FILE} (key/value cache updated in place)...")
        graph, args, shapes = kv_trace(model, card, plan.rotary_in_kernel)
        names = kv_names(card["n_layers"])
        with shared_cache_attention(model, card, plan.rotary_in_kernel), \
                experts_operator(model) as experts:
            proto = export_graph(graph, args, shapes, names, opset, KV_FILE_PATH)
        strip_debug(proto)
        set_metadata(proto, metadata)
        attention = {MODEL_GRAPH: PLAIN_ATTENTION, KV_FILE: f"GroupQueryAttention, {plan.why}"}
        return Extras({KV_FILE: proto}, {"attention": attention, "generation": {
            "file": KV_FILE,
            "attention": "com.microsoft.GroupQueryAttention",
            **({"experts": EXPERTS_OPERATOR} if experts else {}),
            "inputs": names[0],
            "outputs": names[1],
            "cache": "(batch, n_heads, capacity, head_dim) buffers; bind each present.* "
                     "output to its past_key_values.* input",
        }})

    def genai(self, card: Card, graphs: dict[str, onnx.ModelProto],
              stored_as: dict[str, str]) -> GenAIFiles:
        return decoder_genai(card, graphs, KV_FILE, stored_as.get(MODEL_GRAPH, MODEL_GRAPH))
