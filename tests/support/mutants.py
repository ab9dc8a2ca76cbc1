"""`make mutants`: plant small realistic bugs one at a time and check the suite kills each.

Every mutant is one textual change to one source file, with the tests that should notice it.
The tree is copied once (tracked and untracked, not ignored files); each mutant is applied to
the copy, its tests run there (`pytest -x`), and the file restored. A mutant survives when its
tests pass. First the same tests run unmutated: a kill only means something if they pass.

    python -m tests.support.mutants            # every mutant; exit 1 if any survives
    python -m tests.support.mutants --list     # the mutants and their tests
    python -m tests.support.mutants rotary-sign top-k-off   # some of them
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant("rotary-sign", "zoo/blocks/positions.py",
           "torch.cat([-second, first], dim=-1)", "torch.cat([second, -first], dim=-1)",
           ("tests/zoo/test_references.py",)),
    Mutant("sinusoid-base", "zoo/blocks/positions.py",
           "torch.pow(10000.0, two_i / d_model)", "torch.pow(1000.0, two_i / d_model)",
           ("tests/zoo/test_models.py::test_sinusoidal_positions_follow_the_paper",)),
    Mutant("rmsnorm-eps-outside-root", "zoo/blocks/norms.py",
           "return (wide / torch.sqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)",
           "return (wide / (torch.sqrt(wide.pow(2).mean(-1, keepdim=True)) + self.eps)",
           ("tests/zoo/test_references.py",)),
    Mutant("swiglu-gate-and-up-swapped", "zoo/blocks/feedforward.py",
           "self.gate_activation(self.gate(x)) * self.up(x)",
           "self.gate_activation(self.up(x)) * self.gate(x)",
           ("tests/zoo/test_references.py",)),
    Mutant("attention-scaled-by-d-model", "zoo/blocks/attention.py",
           "self.scale = 1.0 / math.sqrt(self.head_dim) if",
           "self.scale = 1.0 / math.sqrt(self.head_dim * self.n_heads) if",
           ("tests/zoo/test_references.py",)),
    Mutant("cross-attention-scale-back-on-the-query", "zoo/blocks/attention.py",
           "elif source is None and a.query_norm is None and type(a.query) is nn.Linear:",
           "elif False:",
           ("tests/export/test_forms.py::test_a_decoding_steps_cross_scores_run_with_alpha_one",)),
    Mutant("cross-attention-bias-left-unscaled", "zoo/blocks/attention.py",
           "else a.query.bias * scale", "else a.query.bias",
           ("tests/export/test_forms.py::test_cross_attention_with_the_scale_in_its_projection_is_the_papers_formula",)),
    Mutant("gelu-erf-scaled-by-2", "zoo/blocks/feedforward.py",
           "torch.erf(x / math.sqrt(2.0))", "torch.erf(x / 2.0)",
           ("tests/export/test_forms.py::test_gelu_block_equals_torch_exact_gelu",)),
    Mutant("additive-mask-inverted", "zoo/blocks/attention.py",
           "zero.masked_fill(~allowed,", "zero.masked_fill(allowed,",
           ("tests/export/test_forms.py::test_additive_mask_attention_equals_torch_sdpa_with_a_boolean_mask",)),
    Mutant("residual-add-left-for-skip-layer-norm", "export/onnx/forms.py",
           '            node.op_type = "Sum"', '            node.op_type = "Add"',
           ("tests/export/test_forms.py::test_a_default_session_runs_the_fast_forms",)),
    Mutant("gelu-tanh-cube-squared", "zoo/blocks/feedforward.py",
           "torch.pow(x, 3)", "torch.pow(x, 2)",
           ("tests/export/test_forms.py::test_gelu_tanh_equals_torch_tanh_gelu",)),
    Mutant("fused-projection-biases-reversed", "export/onnx/forms.py",
           "biases = [bias for *_, bias in members]",
           "biases = [bias for *_, bias in members][::-1]",
           ("tests/export/test_forms.py::test_fused_projections_give_the_same_outputs",)),
    Mutant("top-k-off", "runtime/sampling.py",
           "    if sampling.top_k:\n", "    if False:\n",
           ("tests/runtime/test_sampling.py",)),
    Mutant("top-p-keeps-one-token-too-few", "runtime/sampling.py",
           "np.cumsum(sorted_probs, axis=-1) - sorted_probs >= sampling.top_p",
           "np.cumsum(sorted_probs, axis=-1) >= sampling.top_p",
           ("tests/runtime/test_sampling.py",)),
    Mutant("temperature-ignored", "runtime/sampling.py",
           "scaled = shifted / sampling.temperature", "scaled = shifted",
           ("tests/runtime/test_sampling.py",)),
    Mutant("beam-finished-rows-pay-for-eos", "runtime/sampling.py",
           "log_probs[finished, eos] = 0.0", "log_probs[finished, eos] = -1.0",
           ("tests/runtime/test_sampling.py",)),
    Mutant("beam-keeps-second-best", "runtime/sampling.py",
           "winner = scores.argmax(axis=-1)", "winner = scores.argmin(axis=-1)",
           ("tests/runtime/test_sampling.py",)),
    Mutant("mlm-masks-70-percent", "zoo/training/data.py",
           "inputs[chosen & (roll < 0.8)]", "inputs[chosen & (roll < 0.7)]",
           ("tests/zoo/test_references.py",)),
    Mutant("label-smoothing-dropped", "zoo/training/tasks.py",
           "ignore_index=data.IGNORE,\n                               label_smoothing=self.options"
           ".label_smoothing)",
           "ignore_index=data.IGNORE,\n                               label_smoothing=0.0)",
           ("tests/zoo/test_references.py",)),
    Mutant("positions-count-padding", "zoo/blocks/attention.py",
           "(attention_mask.long().cumsum(dim=1) - 1)", "(attention_mask.long().cumsum(dim=1))",
           ("tests/zoo/test_models.py",)),
    Mutant("parity-compares-nothing", "export/checks/parity.py",
           "difference <= atol * scale + rtol * magnitude", "difference <= np.inf",
           ("tests/export/test_failing_paths.py",)),
    Mutant("loop-check-tokens-only", "export/checks/verify.py",
           "row.passed = row.passed and passed", "row.passed = True",
           ("tests/zoo/test_llama_family.py::test_the_exports_loop_check_compares_logits_not_only_tokens",)),
    Mutant("calibration-file-ignored", "export/onnx/variants.py",
           "calibration_batch(card, tokenizer, options.calibration_rows(), text)",
           "calibration_batch(card, tokenizer)",
           ("tests/export/test_calibration.py::test_an_int8_dynamic_export_calibrates_on_the_file_given",)),
    Mutant("quantization-gate-open", "export/checks/agreement.py",
           "return all(self.row_passed(row)", "return True or all(self.row_passed(row)",
           ("tests/export/test_failing_paths.py",)),
    Mutant("shared-graphs-keep-weights-inline", "export/onnx/files.py",
           "    if len(models) > 1:\n        _externalise(models, folder, SHARED_DATA, weights)\n"
           "    elif",
           "    if False:\n        pass\n    elif",
           ("tests/export/test_export.py::test_every_weight_is_stored_once_across_all_onnx_files",)),
    Mutant("shared-weights-written-per-graph", "export/onnx/files.py",
           "if key not in written:", "if True:",
           ("tests/export/test_export.py::test_every_weight_is_stored_once_across_all_onnx_files",)),
    Mutant("force-deletes-out-first", "zoo/training/train.py",
           "if rank == 0 and options.force and not options.resume and options.out.exists():",
           "if False:",
           ("tests/zoo/test_train.py::test_force_stages_the_new_run_and_a_failed_one_leaves_the_old_out",)),
    Mutant("resume-skips-optimizer-state", "zoo/training/checkpoints.py",
           "optimizer.load_state_dict({", "(lambda state: None)({",
           ("tests/zoo/test_train.py::test_interrupted_then_resumed_equals_uninterrupted",)),
    # Pinned to references outside the code (tests/runtime/test_pinned_outputs.py): numpy formulas,
    # torch.nn, the paper, a plain beam search.
    Mutant("mean-pooling-divides-by-padded-length", "zoo/blocks/heads.py",
           "pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)",
           "pooled = (x * weights).sum(dim=1) / x.shape[1]",
           ("tests/runtime/test_pinned_outputs.py::"
            "test_mean_pooling_is_the_sentence_transformers_formula_and_ignores_padding",)),
    Mutant("last-pooling-assumes-right-padding", "zoo/blocks/heads.py",
           'index = _real_token(mask, last=self.pooling == "last")',
           'index = (mask.long().sum(dim=1) - 1 if self.pooling == "last"\n'
           '                     else _real_token(mask, last=False))',
           ("tests/runtime/test_pinned_outputs.py::"
            "test_a_padded_batch_classifies_each_text_as_it_does_alone",)),
    Mutant("copy-label-smoothing-default-0", "zoo/training/tasks.py",
           "label_smoothing = 0.1  # copy:", "label_smoothing = 0.0  # copy:",
           ("tests/runtime/test_pinned_outputs.py::"
            "test_copy_and_reverse_train_with_the_papers_label_smoothing",)),
    Mutant("reverse-label-smoothing-default-0", "zoo/training/tasks.py",
           "label_smoothing = 0.1  # reverse:", "label_smoothing = 0.0  # reverse:",
           ("tests/runtime/test_pinned_outputs.py::"
            "test_copy_and_reverse_train_with_the_papers_label_smoothing",)),
    Mutant("gqa-heads-tiled-not-grouped", "zoo/blocks/attention.py",
           "x[:, :, None].expand(batch, heads, groups, length, size)",
           "x[:, None].expand(batch, groups, heads, length, size)",
           ("tests/zoo/test_llama_family.py",)),
    Mutant("llama3-rope-medium-frequencies-not-blended", "zoo/blocks/positions.py",
           "torch.where(medium, blended, scaled)", "torch.where(medium, scaled, scaled)",
           ("tests/zoo/test_llama_family.py",)),
    Mutant("gguf-query-key-rows-left-permuted", "zoo/files/gguf_import.py",
           "            array = _unpermute(array, heads)\n", "            array = array\n",
           ("tests/gguf/test_import_gguf.py",)),
    Mutant("quantization-gate-ignores-top5", "export/checks/agreement.py",
           "row.rate >= top1 and row.top5_rate >= top5", "row.rate >= top1",
           ("tests/runtime/test_pinned_outputs.py::test_the_quantization_gate_fails_on_top5_alone",)),
    Mutant("classify-batch-mask-covers-padding", "runtime/classify.py",
           "[1] * len(p) + [0] * (width - len(p))", "[1] * width",
           ("tests/runtime/test_pinned_outputs.py::"
            "test_classifier_probabilities_are_the_softmax_of_each_text_alone",)),
    Mutant("classify-softmax-over-the-batch", "runtime/classify.py",
           "return shifted / shifted.sum(axis=-1, keepdims=True)",
           "return shifted / shifted.sum(axis=0, keepdims=True)",
           ("tests/runtime/test_pinned_outputs.py::"
            "test_classifier_probabilities_are_the_softmax_of_each_text_alone",)),
    Mutant("cross-attention-sees-source-padding", "zoo/models/encoder_decoder.py",
           "cross_mask = build_mask(memory_mask,", "cross_mask = build_mask(None,",
           ("tests/runtime/test_pinned_outputs.py::"
            "test_a_padded_source_gives_the_decoder_logits_of_the_source_alone",)),
    Mutant("output-bias-dropped", "zoo/blocks/heads.py",
           "logits = F.linear(x, weight, self.bias)", "logits = F.linear(x, weight)",
           ("tests/runtime/test_pinned_outputs.py::test_output_bias_is_added_to_the_final_logits",)),
    Mutant("output-bias-not-built", "zoo/assemble.py",
           'bias=c["output_bias"], softcap=', "bias=False, softcap=",
           ("tests/runtime/test_pinned_outputs.py::test_output_bias_is_added_to_the_final_logits",)),
    Mutant("beams-start-identical", "runtime/sampling.py",
           "scores = np.full((batch, beams), -np.inf)", "scores = np.zeros((batch, beams))",
           ("tests/runtime/test_pinned_outputs.py::test_beam_search_is_the_textbook_beam_search",)),
    Mutant("beam-finished-flags-not-reordered", "runtime/sampling.py",
           "finished = finished[rows] |", "finished = finished |",
           ("tests/runtime/test_pinned_outputs.py::test_beam_search_is_the_textbook_beam_search",)),
    Mutant("cache-batch-axis-not-batch-size", "export/onnx/trace.py",
           "dims = {name: Dim(name) for name in TRACE_SIZES}",
           'dims = {name: Dim(name.replace("batch_size", "batch")) for name in TRACE_SIZES}',
           ("tests/export/test_hf_folder.py::test_the_graph_axes_carry_the_documented_names",)),
    Mutant("hf-config-claimed-without-round-trip", "zoo/files/hf_config.py",
           "    if architecture(read) != architecture(card):\n        return False\n", "",
           ("tests/export/test_hf_folder.py::test_a_card_no_transformers_layout_computes_gets_no_config",)),
    Mutant("hf-config-labels-reversed", "zoo/files/hf_config.py",
           "enumerate(labels)}\n        config[\"label2id\"]",
           "enumerate(labels[::-1])}\n        config[\"label2id\"]",
           ("tests/export/test_hf_folder.py::test_a_classifier_config_names_its_labels_and_only_a_class_that_computes_it",)),
    Mutant("manifest-misses-nested-files", "export/onnx/manifest.py",
           'for p in folder.rglob("*")', 'for p in folder.glob("*")',
           ("tests/export/test_hf_folder.py::test_the_manifest_covers_every_file_of_the_folder",)),
    Mutant("layout-first-step-cross-cache-reversed", "export/targets/seq2seq_layout.py",
           "dict(zip(cross_in, projected.values(), strict=True))",
           "dict(zip(cross_in, reversed(projected.values()), strict=True))",
           ("tests/export/test_seq2seq_cache.py::test_layout_first_step_projects_the_cross_cache_and_later_steps_return_none",)),
    Mutant("marian-tokenizer-json-without-end-token", "export/targets/marian_tokenizer.py",
           "    backend.post_processor = processors.TemplateProcessing(",
           "    _ = processors.TemplateProcessing(",
           ("tests/imports/test_marian.py::test_the_exports_tokenizer_json_gives_marian_tokenizers_ids",)),
    Mutant("tokenizer-json-wins-over-sentencepiece", "runtime/files/tokenizer.py",
           "        if (folder / SPM_FILES[0]).is_file():\n"
           "            return SentencePieceTokenizer",
           "        if False:\n            return SentencePieceTokenizer",
           ("tests/export/test_seq2seq_layout.py::test_a_translation_export_keeps_reading_its_sentencepiece_files",)),
    Mutant("quantized-q4-file-misnamed", "runtime/contract.py",
           '"q4": "_q4",', '"q4": "_4bit",',
           ("tests/clients/test_transformers_js.py::test_text_generation_gives_zoo_runs_greedy_tokens",)),
    Mutant("config-dtype-always-fp32", "export/targets/huggingface.py",
           'client = {"dtype": dtype}', 'client = {"dtype": "fp32"}',
           ("tests/clients/test_transformers_js.py::test_feature_extraction_gives_the_sentence_embedding",)),
    Mutant("runtime-keys-graphs-by-stored-file", "runtime/sessions.py",
           "for name, file in stored_files(manifest).items()}",
           "for name, file in {file: file for file in graphs}.items()}",
           ("tests/clients/test_node_quantized.py",)),
    Mutant("quantized-layout-keeps-fp32-names", "export/onnx/writer.py",
           "        if layout and (options.quantize or options.dtype != FP32):",
           "        if False:",
           ("tests/export/test_seq2seq_layout.py::test_the_variants_keep_the_layout",)),
    Mutant("quantized-op-search-skips-subgraphs", "export/onnx/variants.py",
           "_holds_quantized(attribute.g) for attribute", "False for attribute",
           ("tests/export/test_seq2seq_layout.py::test_the_variants_keep_the_layout",)),
    Mutant("runtime-opens-layout-by-contract-name", "runtime/sessions.py",
           "Graph(self.folder / self.layout_files[file]", "Graph(self.folder / file",
           ("tests/export/test_seq2seq_layout.py::test_the_variants_keep_the_layout",)),
    Mutant("genai-names-the-fp32-graph", "export/families/decoder.py",
           "stored_as.get(MODEL_GRAPH, MODEL_GRAPH))", "MODEL_GRAPH)",
           ("tests/clients/test_serving.py::test_genai_picks_the_greedy_tokens_of_zoo_run",)),
    Mutant("quality-gate-cosine-at-0.9", "export/checks/quality.py",
           "MIN_COSINE = 0.99", "MIN_COSINE = 0.9",
           ("tests/hostile/test_hostile_clients.py::test_the_sentence_cosine_alone_just_under_099_is_refused",)),
    Mutant("quality-gate-centered-cosine-at-0.9", "export/checks/quality.py",
           "MIN_CENTERED_COSINE = 0.95", "MIN_CENTERED_COSINE = 0.9",
           ("tests/hostile/test_hostile_clients.py::test_the_centered_cosine_alone_just_under_its_threshold_is_refused",)),
    Mutant("quality-gate-label-agreement-at-0.85", "export/checks/quality.py",
           "MIN_LABEL_AGREEMENT = 0.9", "MIN_LABEL_AGREEMENT = 0.85",
           ("tests/hostile/test_hostile_clients.py::test_label_agreement_alone_under_its_threshold_is_refused",)),
    Mutant("quality-gate-probability-change-at-0.1", "export/checks/quality.py",
           "MAX_PROBABILITY_CHANGE = 0.05", "MAX_PROBABILITY_CHANGE = 0.1",
           ("tests/hostile/test_hostile_clients.py::test_a_probability_change_alone_just_over_its_threshold_is_refused",)),
    Mutant("optimize-head-size-unchecked", "export/families/decoder.py",
           "        if not plan.runs:", "        if False:",
           ("tests/hostile/test_hostile_clients.py::test_optimize_with_a_head_size_gqa_refuses_exports_without_the_shared_cache_graph",)),
    Mutant("marian-decoder-keeps-the-trailing-space", "export/targets/marian_tokenizer.py",
           'EDGE_SPACES = r"(?<![\\s\\S]) +| +(?![\\s\\S])"', 'EDGE_SPACES = r"(?<![\\s\\S]) +"',
           ("tests/imports/test_marian.py::test_the_exports_tokenizer_json_decodes_marian_tokenizers_text",)),
    # issue 43: the hostile-server findings, each planted back
    Mutant("serve-seed-taken-as-sent", "runtime/sampling.py",
           "np.random.default_rng(self.seed % SEEDS)", "np.random.default_rng(self.seed)",
           ("tests/serve/test_serve_faults.py::test_seed_minus_one_is_a_seed_and_leaks_nothing",)),
    Mutant("serve-place-taken-before-the-job-is-made", "runtime/serve/models.py",
           "                  sampled.stream, emit, constraint, adapter=self.adapter)\n"
           "        self.admit()",
           "                  sampled.stream, emit if self.admit() is None else emit, "
           "constraint, adapter=self.adapter)",
           ("tests/serve/test_serve_faults.py::test_a_fault_at_any_stage_gives_everything_back",)),
    Mutant("sampling-divides-before-the-shift", "runtime/sampling.py",
           "scaled = shifted / sampling.temperature",
           "scaled = logits.astype(np.float64) / sampling.temperature",
           ("tests/serve/test_serve_limits.py::test_a_tiny_temperature_is_greedy_not_nan",)),
    Mutant("serve-key-stripped", "runtime/serve/app.py",
           "hmac.compare_digest(token, key.encode())",
           "hmac.compare_digest(token.strip(), key.encode())",
           ("tests/serve/test_serve_faults.py::test_the_key_must_match_exactly",)),
    Mutant("serve-stop-strings-unbounded", "runtime/serve/bodies.py",
           "if longest > MAX_STOP_CHARS:", "if False:",
           ("tests/serve/test_serve_faults.py::test_a_stop_string_past_the_limit_is_a_400_naming_it",)),
    Mutant("chat-template-rendered-in-process", "runtime/files/chat_worker.py",
           "    if not limited():", "    if True:",
           ("tests/hostile/test_hostile_templates.py::test_one_operation_that_makes_gigabytes_is_refused",)),
    # issue 45: the prefix cache serves a prompt's own keys/values, never its last token's
    Mutant("prefix-cache-block-keyed-without-its-last-token", "runtime/serve/prefix_cache.py",
           "tuple(prompt[start:start + self.block])",
           "tuple(prompt[start:start + self.block - 1])",
           ("tests/serve/test_prefix_cache.py::test_a_match_is_exact_on_token_ids_and_short_of_the_last_token",)),
    Mutant("prefix-cache-match-covers-the-last-token", "runtime/serve/prefix_cache.py",
           "(len(prompt) - 1) // self.block", "len(prompt) // self.block",
           ("tests/serve/test_prefix_cache.py::test_a_match_is_exact_on_token_ids_and_short_of_the_last_token",)),
    Mutant("prefix-cache-plain-row-read-from-its-padding", "runtime/decoding.py",
           "first = int(np.argmax(self.mask[row]))", "first = 0",
           ("tests/serve/test_prefix_cache.py::test_a_resumed_prefix_gives_the_logits_of_one_pass",)),
    # issue 49: the attention rules and rotary as transformers computes it
    Mutant("gqa-rotary-rule-admits-head-size-8", "export/onnx/gqa_rules.py",
           "ROTARY_HEAD_MULTIPLE = 16", "ROTARY_HEAD_MULTIPLE = 8",
           ("tests/export/test_gqa_rules.py::test_each_rule_is_what_onnx_runtime_does",)),
    Mutant("rotary-frequencies-in-float64", "zoo/blocks/positions.py",
           "torch.int64).float() / head_dim\n    return 1.0 / (theta ** exponent)",
           "torch.int64).double() / head_dim\n    return (1.0 / (theta ** exponent)).float()",
           ("tests/zoo/test_llama_family.py::test_logits_past_position_1000_are_transformers",)),
    Mutant("serve-echo-scores-shifted-by-one", "runtime/serve/logprobs.py",
           "out.append(scored(row, ids[position], top))",
           "out.append(scored(row, ids[position - 1], top))",
           ("tests/serve/test_serve_logprobs.py::test_an_echoed_completion_scores_its_prompt_and_answer",)),
    Mutant("serve-echo-first-token-scored", "runtime/serve/logprobs.py",
           "out: list[Scored | None] = [None]",
           "out: list[Scored | None] = [scored(np.zeros(engine.card['vocab_size']), ids[0], top)]",
           ("tests/serve/test_serve_logprobs.py::test_max_tokens_0_scores_the_prompt_alone",)),
    Mutant("serve-header-limit-only-h11s", "runtime/serve/http.py",
           "if isinstance(event, h11.Request) and header_bytes(event) > MAX_HEADER_BYTES:",
           "if False:",
           ("tests/serve/test_serve_limits.py::test_a_header_section_past_the_limit_in_one_read_is_a_json_431",)),
    Mutant("fp16-positions-in-float16", "export/onnx/precision.py",
           "structural = _position_nodes(graph, consumers)", "structural = []",
           ("tests/export/test_float16.py::test_rotary_angles_past_position_1000_stay_float32",)),
    Mutant("fp16-softmax-in-float16", "export/onnx/precision.py",
           "softmax.append(node.name)", "softmax.clear()",
           ("tests/export/test_float16.py::test_a_fully_masked_row_is_uniform_as_in_float32",)),
    Mutant("fp16-norms-in-float16", "export/onnx/precision.py",
           "Float16Plan(structural, softmax, _norm_islands(graph, producers, consumers))",
           "Float16Plan(structural, softmax, [])",
           ("tests/export/test_float16.py::test_an_rms_norm_of_large_activations_is_finite",)),
    Mutant("fp16-parity-never-fails", "export/checks/half.py",
           "and row.max_rel <= allowed_wide)", "or True)",
           ("tests/export/test_float16.py::test_a_float16_graph_off_by_a_few_steps_fails_parity",)),
    Mutant("fp16-weights-unchecked-before-tracing", "export/pipeline.py",
           "check_weights_fit(model, card.name)", "pass",
           ("tests/export/test_float16.py::test_an_overflowing_weight_refuses_the_export_and_writes_nothing",)),
    Mutant("runtime-float16-cache-upcast", "runtime/sessions.py",
           "and not name.startswith(CACHE_OUTPUT) else value", "else value",
           ("tests/export/test_float16.py::test_zoo_load_generates_with_the_float16_cache",)),
    Mutant("rotary-frequencies-halved-with-the-model", "zoo/blocks/positions.py",
           "self.inv_freq = frequencies.to(self.inv_freq.device)", "pass",
           ("tests/export/test_float16.py::test_a_half_copy_keeps_rotary_frequencies_float32",)),
    Mutant("compare-scale-per-chunk", "export/checks/parity.py",
           "scale = max(1.0, float(np.max([np.abs(expected[start:start + COMPARE_CHUNK]).max()",
           "scale = max(1.0, float(np.min([np.abs(expected[start:start + COMPARE_CHUNK]).max()",
           ("tests/export/test_big_exports.py::test_the_comparison_in_chunks_is_the_whole_tensors",)),
    Mutant("disk-weights-read-off-by-one", "export/onnx/weights.py",
           'offset = int(where.get("offset", 0))', 'offset = int(where.get("offset", 0)) + 4',
           ("tests/export/test_big_exports.py::test_weights_kept_on_disk_give_the_same_export",)),
    Mutant("disk-weights-spill-offset", "export/onnx/weights.py",
           "offset = stream.tell()", "offset = stream.tell() + 4",
           ("tests/export/test_big_exports.py::test_weights_kept_on_disk_give_the_same_export",)),
    Mutant("window-cases-always-two-rows", "export/checks/cases.py",
           "if 2 * (window + 2) * card[\"vocab_size\"] <= LOGITS_BUDGET:", "if True:",
           ("tests/export/test_big_exports.py::test_a_large_vocabulary_runs_the_window_cases_on_one_unpadded_row",)),
    Mutant("reference-weights-private", "zoo/files/weights.py",
           "path.chmod(0o666 & ~current_umask())", "pass",
           ("tests/export/test_big_exports.py::test_reference_weights_are_written_as_safetensors_saves_them",)),
    Mutant("hann-window-symmetric", "runtime/files/audio.py",
           "np.arange(settings.n_fft) / settings.n_fft)",
           "np.arange(settings.n_fft) / (settings.n_fft - 1))",
           ("tests/runtime/test_audio.py",)),
    Mutant("audio-channels-summed", "runtime/files/audio.py",
           "block.mean(axis=1, dtype=np.float32)", "block.sum(axis=1, dtype=np.float32)",
           ("tests/runtime/test_audio.py",)),
    Mutant("subtitle-milliseconds-two-digits", "runtime/transcript.py",
           "{decimal_mark}{milliseconds:03d}", "{decimal_mark}{milliseconds:02d}",
           ("tests/runtime/test_transcript.py",)),
    Mutant("transcription-upload-unbounded", "runtime/serve/transcriptions.py",
           "if received > limit:", "if received > limit * 1000:",
           ("tests/serve/test_transcription_form.py",)),
]


def copy_tree(target: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in listed.splitlines():
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           "-m", "not slow", *tests], cwd=tree, env=env, capture_output=True,
                          text=True)
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return done.returncode, failed[0] if failed else done.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    known = {mutant.name: mutant for mutant in MUTANTS}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        print(f"error: unknown mutant {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    chosen = [known[name] for name in args.names] or MUTANTS
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name:<36} {mutant.file:<32} {' '.join(mutant.tests)}")
        return 0
    for mutant in chosen:  # a stale mutant (its code moved) is an error, not a pass
        text = (ROOT / mutant.file).read_text()
        if text.count(mutant.old) != 1:
            print(f"error: {mutant.name}: {mutant.file} holds {mutant.old!r} "
                  f"{text.count(mutant.old)} times (expected once)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="zoo-mutants-") as folder:
        tree = Path(folder)
        copy_tree(tree)
        tests = tuple(dict.fromkeys(t for mutant in chosen for t in mutant.tests))
        print(f"unmutated: running {len(tests)} test selections ...", flush=True)
        code, line = run_tests(tree, tests)
        if code != 0:
            print(f"error: the tests fail without any mutant: {line}", file=sys.stderr)
            return 2
        survivors = []
        for index, mutant in enumerate(chosen, 1):
            path = tree / mutant.file
            original = path.read_text()
            path.write_text(original.replace(mutant.old, mutant.new))
            started = time.perf_counter()
            try:
                code, line = run_tests(tree, mutant.tests)
            finally:
                path.write_text(original)
            verdict = "killed" if code == 1 else "SURVIVED" if code == 0 else f"error {code}"
            if code != 1:
                survivors.append(mutant.name)
            print(f"[{index}/{len(chosen)}] {mutant.name:<36} {verdict:<9} "
                  f"{time.perf_counter() - started:5.0f} s  {line}", flush=True)
    killed = len(chosen) - len(survivors)
    print(f"mutants: {killed} of {len(chosen)} killed" +
          (f"; not killed: {', '.join(survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
