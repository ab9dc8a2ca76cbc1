"""ModernBERT and T5 against Optimum, transformers and sentence-transformers, in one run
(issue #35).

    bash examples/optimum/setup.sh     # once: Optimum, sentence-transformers, transformers 4.57
    make .venv/.installed              # once: the zoo, whose CLI (.venv/bin/zoo) makes exports
    examples/optimum/.venv/bin/python benchmarks/modernbert.py --json modernbert.json
    ... --layers 22 --rounds 10 --lines 2000   # modernbert-base's full depth, more rounds

It runs in Optimum's environment (optimum-onnx needs transformers < 4.58), makes the zoo's
exports with the zoo's own CLI in a subprocess, and times every engine in this process,
interleaved (peers.py's `interleaved`), every ONNX graph in a plain session with the stated
thread count, PyTorch with the same.

1. modernbert-base's shape (the published config; random weights, seeded; --layers of its 22,
   3 by default: one global and two local layers, the pattern's period), MLM logits at batch
   1 and 8 x 512: the zoo's export (fp32, --optimize, --optimize --quantize int8-dynamic)
   against Optimum's fill-mask export of the same folder (fp32, and ORTQuantizer's dynamic
   int8 for this CPU) and transformers' PyTorch; fp32 logits' largest error against PyTorch,
   each int8 graph's top-1 agreement with its own fp32 graph.
2. A small ModernBERT-shaped embedder (sentence-transformers folder on ModernBertModel, mean
   pooling, Normalize; a byte-level BPE tokenizer trained here on the text): `zoo embed`
   (fp32 and int8-dynamic) against sentence-transformers' encode (PyTorch, ONNX, Optimum's
   int8) over --lines lines of the public-domain text, sentences/s, and the zoo's vectors'
   cosine to sentence-transformers'.
3. t5-small (when the zoo has the card; else "skipped: no t5 card"): greedy generation,
   source 64 tokens, 32 new tokens: the zoo's export against transformers' generate and
   Optimum's ORTModelForSeq2SeqLM.generate.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from peers import interleaved  # noqa: E402

from export.bench.machine import cpu_name  # noqa: E402
from export.cpu import cpu_flags, has_vnni  # noqa: E402

SEED = 0
ZOO = ROOT / ".venv" / "bin" / "zoo"
TEXT = ROOT / "zoo" / "training" / "datasets" / "tinyshakespeare.txt"
PACKAGES = ("torch", "transformers", "optimum", "optimum-onnx", "onnxruntime",
            "sentence-transformers")
# answerdotai/ModernBERT-base's config.json (149,655,232 parameters at 22 layers)
BASE = {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152,
        "num_hidden_layers": 22, "num_attention_heads": 12, "max_position_embeddings": 8192,
        "hidden_activation": "gelu", "norm_eps": 1e-5, "norm_bias": False,
        "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "local_attention": 128,
        "global_attn_every_n_layers": 3, "attention_bias": False, "mlp_bias": False,
        "classifier_activation": "gelu", "decoder_bias": True, "tie_word_embeddings": True,
        "pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282,
        "cls_token_id": 50281, "sep_token_id": 50282}
# The embedder: ModernBERT's layout at a MiniLM-like size, max 512 positions
EMBEDDER = {"hidden_size": 384, "intermediate_size": 576, "num_hidden_layers": 6,
            "num_attention_heads": 6, "max_position_embeddings": 512}
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def machine(threads: int) -> dict:
    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    return {"cpu": cpu_name(), "flags": cpu_flags(), "cores": os.cpu_count(),
            "threads": threads, "load_1min": os.getloadavg()[0],
            "versions": {name: installed(name) for name in PACKAGES}}


def quiet() -> contextlib.ExitStack:
    """Optimum's and transformers' warnings and progress off (an export prints pages)."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    logging.disable(logging.WARNING)
    stack.callback(logging.disable, logging.NOTSET)
    return stack


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def zoo_cli(cli: Path, *args: str) -> None:
    """The zoo's CLI, from the project's .venv (its export needs the newest torch stack)."""
    result = subprocess.run([str(cli), *args], capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"zoo {' '.join(args)}: {result.stdout}{result.stderr}")


def zoo_exports(cli: Path, source: Path, work: Path, name: str,
                kinds: tuple[str, ...] = ("fp32", "optimize", "int8-dynamic")
                ) -> dict[str, Path]:
    """`zoo import` of an HF folder, then `zoo export` of each kind: fp32, --optimize,
    --optimize --quantize int8-dynamic (each parity-checked or gated by the zoo); made once."""
    built = work / f"zoo-{name}"
    if not (built / "model.safetensors").exists():
        zoo_cli(cli, "import", str(source), "-o", str(built), "--force")
    outs = {}
    for kind, flags in (("fp32", ()), ("optimize", ("--optimize",)),
                        ("int8-dynamic", ("--optimize", "--quantize", "int8-dynamic"))):
        if kind not in kinds:
            continue
        out = outs[kind] = work / f"zoo-{name}-{kind}"
        if not (out / "manifest.json").exists():
            zoo_cli(cli, "export", str(built), "--onnx", "-o", str(out), "--force", *flags)
    return outs


def model_graph(folder: Path) -> Path:
    """An export's model graph (a quantized one's stored name from its manifest)."""
    from runtime.contract import MODEL_GRAPH, stored_files
    from runtime.manifest import read_manifest

    return folder / stored_files(read_manifest(folder))[MODEL_GRAPH]


def optimum_export(source: Path, out: Path, task: str) -> Path:
    """Optimum's exporter with its defaults, as `optimum-cli export onnx --task TASK`."""
    from optimum.exporters.onnx import main_export

    if not (out / "config.json").exists():
        with quiet():
            main_export(str(source), out, task=task)
    return out


def optimum_int8(folder: Path, out: Path, file_name: str = "model.onnx") -> Path:
    """ORTQuantizer's dynamic int8, per channel, the configuration for this CPU."""
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    quantized = out / file_name.replace(".onnx", "_quantized.onnx")
    if not quantized.exists():
        maker = AutoQuantizationConfig.avx512_vnni if has_vnni() else AutoQuantizationConfig.avx2
        with quiet():
            ORTQuantizer.from_pretrained(folder, file_name=file_name).quantize(
                maker(is_static=False, per_channel=True), out)
    return quantized


def mlm_folder(work: Path, layers: int) -> Path:
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    folder = work / f"hf-modernbert-base-{layers}l"
    if not (folder / "model.safetensors").exists():
        torch.manual_seed(SEED)
        model = ModernBertForMaskedLM(ModernBertConfig(**{**BASE, "num_hidden_layers": layers}))
        model.eval().save_pretrained(folder, safe_serialization=True)
    return folder


def mlm_rows(cli: Path, work: Path, layers: int, rounds: int, threads: int) -> list[dict]:
    from transformers import ModernBertForMaskedLM

    source = mlm_folder(work, layers)
    zoo = zoo_exports(cli, source, work, f"modernbert-base-{layers}l")
    optimum = optimum_export(source, work / f"optimum-modernbert-base-{layers}l", "fill-mask")
    graphs = {"zoo fp32": zoo["fp32"] / "onnx" / "model.onnx",
              "zoo --optimize": zoo["optimize"] / "onnx" / "model.onnx",
              "zoo int8-dynamic": model_graph(zoo["int8-dynamic"]),
              "optimum fp32": optimum / "model.onnx",
              "optimum int8": optimum_int8(optimum, work / f"optimum-modernbert-base-{layers}l"
                                           "-int8")}
    sessions = {name: session(path, threads) for name, path in graphs.items()}
    hf = ModernBertForMaskedLM.from_pretrained(source).eval()
    rows = []
    for batch in (1, 8):
        ids = np.random.default_rng(batch).integers(1000, 50000, (batch, 512)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}

        def pytorch(tensors: dict[str, torch.Tensor] = tensors) -> np.ndarray:
            with torch.no_grad():
                return hf(**tensors).logits.numpy()

        reference = pytorch()
        runs = {"transformers pytorch": pytorch}
        logits = {}
        for name, graph in sessions.items():
            fed = {k: v for k, v in feeds.items() if k in {i.name for i in graph.get_inputs()}}
            logits[name] = graph.run(["logits"], fed)[0]
            runs[name] = lambda s=graph, f=fed: s.run(["logits"], f)
        timings = interleaved(runs, rounds, warm_up=False)  # each ran once just now
        ms = {name: round(t["median"] * 1000, 1) for name, t in timings.items()}
        top1 = {name: value.argmax(-1) for name, value in logits.items()}
        rows.append({
            "work": f"modernbert-base shape ({layers} layers) MLM logits, batch {batch} x 512",
            "ms_median": ms, "seconds": timings,
            "pytorch_attention": hf.config._attn_implementation,
            "ratios": {"zoo --optimize / optimum fp32": ms["zoo --optimize"] / ms["optimum fp32"],
                       "zoo int8 / optimum int8": ms["zoo int8-dynamic"] / ms["optimum int8"],
                       "zoo --optimize / pytorch": ms["zoo --optimize"]
                       / ms["transformers pytorch"]},
            "max_abs_logit_error_vs_pytorch": {
                name: float(np.abs(logits[name] - reference).max())
                for name in ("zoo fp32", "zoo --optimize", "optimum fp32")},
            "int8_top1_agreement_with_own_fp32": {
                "zoo int8-dynamic": float((top1["zoo int8-dynamic"]
                                           == top1["zoo --optimize"]).mean()),
                "optimum int8": float((top1["optimum int8"] == top1["optimum fp32"]).mean())},
        })
    return rows


def trained_tokenizer(texts: list[str], folder: Path) -> int:
    """A byte-level BPE tokenizer trained on the text, [CLS] a [SEP] as BERT's, written as
    tokenizer.json with the files transformers' AutoTokenizer reads; its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=4096, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.save(str(folder / "tokenizer.json"))
    names = dict(zip(("unk_token", "cls_token", "sep_token", "pad_token", "mask_token"),
                     SPECIALS, strict=True))
    (folder / "tokenizer_config.json").write_text(json.dumps(  # no token_type_ids: ModernBERT's
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
         "model_input_names": ["input_ids", "attention_mask"], **names}))
    (folder / "special_tokens_map.json").write_text(json.dumps(names))
    return tokenizer.get_vocab_size()


def embedder_folder(work: Path, texts: list[str]) -> Path:
    """A sentence-transformers folder: ModernBertModel (random, seeded), mean pooling,
    Normalize."""
    from transformers import ModernBertConfig, ModernBertModel

    folder = work / "st-modernbert-embedder"
    if (folder / "modules.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    size = trained_tokenizer(texts, folder)
    ids = {f"{name}_token_id": SPECIALS.index(token) for name, token in
           (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"), ("bos", "[CLS]"),
            ("eos", "[SEP]"))}
    config = ModernBertConfig(**{**BASE, **EMBEDDER, **ids, "vocab_size": -(-size // 64) * 64})
    torch.manual_seed(SEED)
    ModernBertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (folder / "1_Pooling").mkdir()
    (folder / "2_Normalize").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": EMBEDDER["hidden_size"], "pooling_mode_mean_tokens": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def embed_rows(cli: Path, work: Path, texts: list[str], rounds: int, threads: int
               ) -> list[dict]:
    from encoders import st_models

    from commands.corpus import CorpusRequest, embed_command

    source = embedder_folder(work, texts)
    zoo = zoo_exports(cli, source, work, "modernbert-embedder")
    with quiet():
        torch_model, onnx_model, int8_model, _ = st_models(source)
    data = work / f"lines-{len(texts)}.txt"
    data.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    vectors: dict[str, np.ndarray] = {}

    def zoo_embed(name: str, kind: str) -> None:
        out = work / f"embed-{kind}.npy"
        embed_command(CorpusRequest(zoo[kind], data=data, out=out, force=True, threads=threads))
        vectors[name] = np.load(out)

    def st_encode(name: str, model: object) -> None:
        vectors[name] = model.encode(texts, convert_to_numpy=True)

    runs = {"zoo embed --optimize": lambda: zoo_embed("zoo embed --optimize", "optimize"),
            "zoo embed int8-dynamic": lambda: zoo_embed("zoo embed int8-dynamic",
                                                        "int8-dynamic"),
            "st encode (pytorch)": lambda: st_encode("st encode (pytorch)", torch_model),
            "st encode (onnx fp32)": lambda: st_encode("st encode (onnx fp32)", onnx_model),
            "st encode (onnx optimum int8)": lambda: st_encode("st encode (onnx optimum int8)",
                                                               int8_model)}
    with quiet():
        timings = interleaved(runs, rounds)
    rate = {name: round(len(texts) / t["median"], 1) for name, t in timings.items()}
    return [{
        "work": f"ModernBERT-shaped embedder ({EMBEDDER['num_hidden_layers']} x "
                f"{EMBEDDER['hidden_size']}) over {len(texts)} lines",
        "sentences_per_s": rate, "seconds": timings,
        "ratios": {"zoo --optimize / st pytorch": rate["zoo embed --optimize"]
                   / rate["st encode (pytorch)"],
                   "zoo --optimize / st onnx fp32": rate["zoo embed --optimize"]
                   / rate["st encode (onnx fp32)"],
                   "zoo int8 / st onnx int8": rate["zoo embed int8-dynamic"]
                   / rate["st encode (onnx optimum int8)"]},
        "zoo_fp32_cosine_to_st_pytorch_min": float(cosine(
            vectors["zoo embed --optimize"], vectors["st encode (pytorch)"]).min()),
        "int8_cosine_to_fp32_min": {
            "zoo int8-dynamic": float(cosine(vectors["zoo embed int8-dynamic"],
                                             vectors["zoo embed --optimize"]).min()),
            "optimum int8": float(cosine(vectors["st encode (onnx optimum int8)"],
                                         vectors["st encode (onnx fp32)"]).min())},
    }]


# t5-small's config.json (60,506,624 parameters)
T5_SMALL = {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
            "num_heads": 8, "relative_attention_num_buckets": 32,
            "relative_attention_max_distance": 128, "feed_forward_proj": "relu",
            "tie_word_embeddings": True, "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6,
            "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}


def t5_rows(cli: Path, work: Path, rounds: int, threads: int, source_length: int = 64,
            new_tokens: int = 32) -> list[dict]:
    """Greedy generation: the zoo's --optimize export (its generate), transformers' generate,
    Optimum's ORTModelForSeq2SeqLM.generate on its own export of the same folder."""
    if not (ROOT / "registry" / "cards" / "t5-small.yaml").exists():
        print("t5-small: skipped: no t5 card", flush=True)
        return [{"work": "t5-small greedy", "skipped": "no t5 card"}]
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from transformers import T5Config, T5ForConditionalGeneration

    from runtime.exported import GenerateOptions, load

    source = work / "hf-t5-small"
    if not (source / "model.safetensors").exists():
        torch.manual_seed(SEED)
        T5ForConditionalGeneration(T5Config(**T5_SMALL)).eval().save_pretrained(source)
    zoo = load(zoo_exports(cli, source, work, "t5-small", ("optimize",))["optimize"],
               threads=threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    with quiet():
        folder = optimum_export(source, work / "optimum-t5-small",
                                "text2text-generation-with-past")
        optimum = ORTModelForSeq2SeqLM.from_pretrained(folder, session_options=options)
    hf = T5ForConditionalGeneration.from_pretrained(source).eval()
    prompt = [int(i) for i in np.random.default_rng(0).integers(3, 32000, source_length)]
    prompt[-1] = T5_SMALL["eos_token_id"]  # a source ends with </s>, as T5's tokenizer adds
    ids = torch.tensor([prompt])
    greedy = {"max_new_tokens": new_tokens, "do_sample": False, "num_beams": 1}

    def hf_generate(model: object) -> list[int]:
        with torch.no_grad(), quiet():
            return model.generate(input_ids=ids, **greedy)[0, 1:].tolist()

    runs = {"zoo generate (--optimize)": lambda: zoo.generate(
                [prompt], GenerateOptions(max_new_tokens=new_tokens))[0].ids,
            "transformers generate": lambda: hf_generate(hf),
            "optimum ORTModelForSeq2SeqLM.generate": lambda: hf_generate(optimum)}
    tokens = {name: list(run()) for name, run in runs.items()}
    timings = interleaved(runs, rounds, warm_up=False)
    return [{"work": f"t5-small shape greedy, source {source_length}, {new_tokens} new tokens",
             "ms_median": {name: round(t["median"] * 1000, 1) for name, t in timings.items()},
             "tokens_per_s": {name: round(new_tokens / t["median"], 1)
                              for name, t in timings.items()},
             "seconds": timings,
             "same_tokens_as_transformers": {
                 name: seq == tokens["transformers generate"] for name, seq in tokens.items()}}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work",
                        help="where the weights and exports are made (and reused)")
    parser.add_argument("--layers", type=int, default=3,
                        help="modernbert-base's layers to build (22: the published depth)")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per engine")
    parser.add_argument("--lines", type=int, default=300,
                        help="the first N non-empty lines of --text for the embedders")
    parser.add_argument("--text", type=Path, default=TEXT)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="ONNX Runtime intra-op and PyTorch threads [all cores]")
    parser.add_argument("--zoo", type=Path, default=ZOO,
                        help="the zoo's CLI that makes the exports [.venv/bin/zoo]")
    parser.add_argument("--only", choices=("mlm", "embed", "t5"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    report = {"before": machine(args.threads), "rows": []}
    print(json.dumps(report["before"]), flush=True)
    start = time.perf_counter()
    texts = [line for line in args.text.read_text(encoding="utf-8").splitlines()
             if line.strip()][:args.lines]
    parts = {"mlm": lambda: mlm_rows(args.zoo, args.work, args.layers, args.rounds,
                                     args.threads),
             "embed": lambda: embed_rows(args.zoo, args.work, texts, args.rounds, args.threads),
             "t5": lambda: t5_rows(args.zoo, args.work, args.rounds, args.threads)}
    for name, part in parts.items():
        if args.only in (None, name):
            for row in part():
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    report["after"] = machine(args.threads)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps({"load_1min_after": report["after"]["load_1min"],
                      "seconds": report["seconds"]}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
