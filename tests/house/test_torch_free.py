"""Running an export needs neither torch nor the exporter (issue #33): `zoo run`, `zoo embed`,
`zoo classify`, `zoo evaluate --text` and `zoo.load()` in a fresh interpreter load no torch
and nothing of export/onnx; `import zoo` loads nothing but itself; and a virtual environment
without torch runs an export. Expected tokens come from PyTorch (tests/runtime/test_api.py's greedy
loop over the whole sequence); expected probabilities from the classifier's own `zoo classify`
file read back, against numpy's formula of the sentence vectors' cosine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime.files.tokenizer import BYTE_TOKENIZER, ByteTokenizer
from runtime.sessions import IDENTITY_PROBE
from tests.conftest import ON_CLASSIFIER, on_shared
from tests.support.greedy import torch_greedy

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "onnx", "onnxscript", "safetensors", "export.onnx", "export.families",
         "export.checks", "zoo.assemble", "zoo.blocks")
ROWS = ["a first text", "another one, longer than the first", "third"]


def loaded_after(script: str, cwd: Path) -> tuple[list[str], dict]:
    """Run `script` in a fresh interpreter that defines `results` (a dict it fills); return
    the heavy modules loaded by the end and the results. A command that fails early would
    load little, so each one's exit code is part of the results."""
    wrapped = (f"import json, sys\nresults = {{}}\n{script}\n"
               f"heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') "
               f"for h in {HEAVY!r}))\n"
               "print(json.dumps({'heavy': heavy, 'results': results}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ZOO_PATH", None)
    done = subprocess.run([sys.executable, "-c", wrapped], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    return found["heavy"], found["results"]


def cli_calls(calls: dict[str, list[str]]) -> str:
    """Script lines running each `zoo` command line, recording its exit code and output."""
    return (f"import contextlib, io\nfrom cli import main\nfor name, args in {calls!r}.items():\n"
            "    out = io.StringIO()\n"
            "    with contextlib.redirect_stdout(out):\n"
            "        code = main(args, standalone_mode=False)\n"
            "    results[name] = [code or 0, out.getvalue()]\n")


def test_import_zoo_loads_nothing_but_the_facade(tmp_path: Path) -> None:
    script = ("import zoo\nresults['loaded'] = sorted(m for m in sys.modules if m.split('.')[0]"
              " in ('zoo', 'runtime', 'export', 'registry', 'numpy', 'onnxruntime'))")
    heavy, results = loaded_after(script, tmp_path)
    assert (heavy, results["loaded"]) == ([], ["zoo"])


@on_shared("gpt-tiny")
def test_a_decoder_runs_without_torch(shared_export, tmp_path: Path) -> None:
    folder = tmp_path / "gpt-tiny-onnx"  # with the byte tokenizer a trained model has
    shutil.copytree(shared_export("gpt-tiny")[0], folder)
    (folder / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json(), encoding="utf-8")
    text = tmp_path / "text.txt"
    text.write_text("ROMEO: the night is long and the day is short.\n" * 4, encoding="utf-8")
    calls = {"run": ["run", str(folder), "--ids", "1,2,3", "--max-new-tokens", "4"],
             "evaluate": ["evaluate", str(folder), "--text", str(text)]}
    script = cli_calls(calls) + (
        f"import zoo\nresults['load'] = zoo.load({str(folder)!r}).generate([[1, 2, 3]], "
        "zoo.GenerateOptions(max_new_tokens=4))[0].ids\n")
    heavy, results = loaded_after(script, tmp_path)
    expected = torch_greedy(folder, [1, 2, 3], 4)
    assert heavy == []
    assert results["run"] == [0, ",".join(map(str, expected)) + "\n"]
    assert results["evaluate"][0] == 0 and "perplexity" in results["evaluate"][1]
    assert results["load"] == expected


@ON_CLASSIFIER
def test_a_classifier_runs_without_torch(classifier_export: Path, tmp_path: Path) -> None:
    folder = tmp_path / "classifier-onnx"  # with the byte tokenizer its vocabulary is
    shutil.copytree(classifier_export, folder)
    (folder / BYTE_TOKENIZER).write_text(ByteTokenizer().to_json(), encoding="utf-8")
    data = tmp_path / "rows.txt"
    data.write_text("\n".join(ROWS) + "\n", encoding="utf-8")
    calls = {"embed": ["embed", str(folder), "--data", str(data), "-o",
                       str(tmp_path / "vectors.npy")],
             "classify": ["classify", str(folder), "--data", str(data), "-o",
                          str(tmp_path / "labels.jsonl")],
             "run": ["run", str(folder), "--text", ROWS[0], "--text", ROWS[1]]}
    script = cli_calls(calls) + (
        f"import zoo\nresults['load'] = zoo.load({str(folder)!r}).classify("
        f"{ROWS[0]!r})[0]\n")
    heavy, results = loaded_after(script, tmp_path)
    assert heavy == []
    assert [results[name][0] for name in calls] == [0, 0, 0]
    vectors = np.load(tmp_path / "vectors.npy")
    rows = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    assert vectors.shape[0] == len(rows) == len(ROWS)
    assert results["load"] == pytest.approx(rows[0]["probabilities"], abs=1e-6)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert f"{unit[0] @ unit[1]:+.4f}" in results["run"][1]  # the cosine `zoo run` prints


def test_the_cuda_probe_is_the_one_node_identity_graph() -> None:
    """runtime/sessions.py's probe bytes, made without onnx, are what onnx makes."""
    from export.bench.machine import one_node_model

    made = one_node_model("Identity", {"x": [1]}, {"y": [1]}).SerializeToString()
    assert IDENTITY_PROBE == made


def runtime_libraries() -> list[Path]:
    """The site-packages entries that importing the runtime's libraries loads, here."""
    script = ("import os, sys\nimport onnxruntime, numpy, tokenizers, yaml, click, jinja2\n"
              "site = os.path.dirname(os.path.dirname(numpy.__file__))\n"
              "tops = {os.path.relpath(m.__file__, site).split(os.sep)[0] for m in "
              "list(sys.modules.values()) if (getattr(m, '__file__', None) or '')"
              ".startswith(site + os.sep)}\n"
              "tops |= {name for name in os.listdir(site) if name == 'numpy.libs'}\n"
              "print(site); print(*sorted(tops), sep='\\n')")
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    site = Path(lines[0])
    return [site / name for name in lines[1:] if not name.startswith(("__editable__", "_dist"))]


@on_shared("gpt-tiny")
def test_a_venv_without_torch_runs_an_export(shared_export, tmp_path: Path) -> None:
    """A fresh venv holding only the runtime's libraries (linked from this one: offline) and
    the checkout: `zoo run` gives PyTorch's greedy tokens; torch cannot be imported there."""
    folder, _ = shared_export("gpt-tiny")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    libraries = runtime_libraries()
    assert {"onnxruntime", "numpy", "tokenizers"} <= {p.name for p in libraries}
    assert not {"torch", "onnx"} & {p.name for p in libraries}
    for library in libraries:
        (site / library.name).symlink_to(library)
    (site / "zoo-checkout.pth").write_text(f"{ROOT}\n", encoding="utf-8")
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "ZOO_PATH", "VIRTUAL_ENV")}
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True,
                              env=env, cwd=tmp_path)
    assert "No module named 'torch'" in no_torch.stderr
    run = subprocess.run([python, "-c", "from cli import main; main()", "run", str(folder),
                          "--ids", "1,2,3", "--max-new-tokens", "4"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ",".join(map(str, torch_greedy(folder, [1, 2, 3], 4))) + "\n"
    # a command that needs torch says which extra installs it, in one line
    build = subprocess.run([python, "-c", "from cli import main; main()", "build", "gpt-tiny",
                            "-o", str(tmp_path / "built")],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert (build.returncode, build.stdout) == (2, ""), build.stderr
    assert build.stderr.splitlines() == [build.stderr.strip()]
    assert "needs torch" in build.stderr and "'.[export]'" in build.stderr
    assert "Traceback" not in build.stderr and not (tmp_path / "built").exists()


def test_an_image_model_runs_without_torch(tmp_path: Path) -> None:
    """`zoo run --image` decodes, preprocesses (Pillow, numpy) and classifies with no torch;
    its probabilities are PyTorch's on the same pixels (the export's model.safetensors, run
    here in the test's own process)."""
    from PIL import Image

    from tests.support.helpers import zoo_ok

    folder = tmp_path / "vit"
    zoo_ok("export", "vit-tiny", "--onnx", "--out", folder)
    image = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8),
                    "RGB").save(image)
    calls = {"run": ["run", str(folder), "--image", str(image), "--json"]}
    heavy, results = loaded_after(cli_calls(calls), tmp_path)
    assert heavy == [] and results["run"][0] == 0
    got = json.loads(results["run"][1])["probabilities"][0]

    import torch

    from runtime.files.images import export_processor, load_pixels
    from runtime.manifest import manifest_card, read_manifest
    from zoo.files.weights import load_built

    model, card = load_built(folder)
    pixels = load_pixels([image], export_processor(folder, manifest_card(
        folder, read_manifest(folder))))
    with torch.no_grad():
        expected = torch.softmax(model(torch.from_numpy(pixels))["logits"].double(), -1)[0]
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)
