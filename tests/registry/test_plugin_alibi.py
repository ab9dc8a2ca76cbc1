"""The plugin in examples/plugins/zoo-alibi, installed as a user would, adds an architecture
without a change to zoo/, export/ or registry/: the position kind `alibi` with its own card field
(`alibi_max_bias`), a card, a parameter count. Checked against the paper's formula in numpy and
transformers' BLOOM, trained a few steps and exported with its parity grid.

The plugin is installed by pip from its own pyproject (the entry point is the one pip writes)
into a folder of the test's own (`--target`), not into .venv: installed there, its card would
join every test's catalogue. pip works on a copy, since it builds in the source folder. Plugins
load once per process, so everything that needs the registration runs in a subprocess with that
folder on PYTHONPATH.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugins" / "zoo-alibi"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("alibi")
    source, target = where / "zoo-alibi", where / "site"
    shutil.copytree(PLUGIN, source)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "--target", str(target),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "zoo.plugins" in next(target.glob("zoo_alibi-*.dist-info")).joinpath(
        "entry_points.txt").read_text()
    return target


def zoo(site: Path, cwd: Path, *args: str, script: str | None = None
        ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    env.pop("ZOO_PATH", None)
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def reference_slopes(heads: int, max_bias: float) -> np.ndarray:
    """The paper's get_slopes (ofirpress/attention_with_linear_biases), with 8 as max_bias."""
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-max_bias / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(heads).is_integer():
        return np.array(power_of_two(heads))
    closest = 2 ** math.floor(math.log2(heads))
    return np.array(power_of_two(closest) + power_of_two(2 * closest)[0::2][: heads - closest])


def reference_bias(heads: int, max_bias: float, queries: int, keys: int) -> np.ndarray:
    """(heads, T, S): -m_h |i - j|, the T queries being the last T of the S positions."""
    i = np.arange(keys - queries, keys)[:, None]
    j = np.arange(keys)[None, :]
    return -reference_slopes(heads, max_bias)[:, None, None] * np.abs(i - j)


@pytest.mark.parametrize("heads", [1, 4, 6, 12, 16])
@pytest.mark.parametrize("max_bias", [8.0, 4.0])
def test_bias_is_the_papers(site: Path, monkeypatch: pytest.MonkeyPatch, heads: int,
                            max_bias: float) -> None:
    monkeypatch.syspath_prepend(str(site))
    from zoo_alibi.block import Alibi

    block = Alibi.from_card({"n_heads": heads, "alibi_max_bias": max_bias}, 0)
    for queries, keys in ((5, 5), (1, 7), (3, 9)):  # a prompt, a step, a chunk after a cache
        bias = block.attention_bias(queries, keys)
        assert bias.shape == (1, heads, queries, keys)
        np.testing.assert_allclose(bias[0].numpy(), reference_bias(heads, max_bias, queries, keys),
                                   rtol=1e-6, atol=1e-6)
    assert dict(block.named_parameters()) == {}
    assert "slopes" not in block.state_dict()  # a buffer, never saved


@pytest.mark.parametrize("heads", [4, 6, 12])
def test_bias_matches_bloom(site: Path, monkeypatch: pytest.MonkeyPatch, heads: int) -> None:
    """BLOOM's tensor is m_h * j (the key's position alone): on the keys a causal query sees it
    differs from ALiBi's -m_h (i - j) by m_h * i, the same for the whole row, which softmax
    ignores."""
    modeling_bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    monkeypatch.syspath_prepend(str(site))
    from zoo_alibi.block import Alibi

    length = 11
    bloom = modeling_bloom.build_alibi_tensor(torch.ones(1, length), heads, torch.float32)
    bloom = bloom.reshape(heads, length).numpy()  # (heads, S): m_h * j
    ours = Alibi.from_card({"n_heads": heads, "alibi_max_bias": 8.0}, 0).attention_bias(
        length, length)[0].numpy()
    for i in range(length):
        np.testing.assert_allclose(ours[:, i, : i + 1], bloom[:, : i + 1] - bloom[:, i : i + 1],
                                   rtol=1e-5, atol=1e-5)


LISTED = textwrap.dedent("""
    import sys
    from cli import main
    main(["list", "gpt-tiny*"], standalone_mode=False)
    main(["show", "gpt-tiny-alibi"], standalone_mode=False)
    assert "torch" not in sys.modules, "listing a plugin card imported torch"
""")


def test_listed_and_shown_without_torch(site: Path, tmp_path: Path) -> None:
    done = zoo(site, tmp_path, script=LISTED)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in done.stdout.splitlines()
            if line and not line.startswith((" ", "#"))}
    assert rows["gpt-tiny-alibi"] == ["decoder", "116.7K"]
    shown = {line.split()[0]: line for line in done.stdout.splitlines() if "  # " in line}
    assert shown["position"].split()[1] == "alibi"
    assert shown["alibi_max_bias"].split()[1] == "8.0"
    assert shown["alibi_max_bias"].endswith("gpt-tiny-alibi.yaml")
    # gpt-tiny's 124,928 less its learned table of 128 positions x 64
    assert "parameters: 116,736" in done.stdout


@pytest.mark.parametrize(("card", "expected"), [
    ("extends: gpt-tiny-alibi\nalibi_max_bias: 0\n",
     ["bad.yaml", "alibi_max_bias=0.0", "should be > 0.0"]),
    ("extends: gpt-tiny-alibi\nalibi_max_bias: steep\n",
     ["bad.yaml", "alibi_max_bias='steep'", "should be float"]),
    ("extends: gpt-tiny\nalibi_max_bias: 4\n",
     ["bad.yaml", "alibi_max_bias applies only to position alibi, not learned"]),
    ("extends: gpt-tiny-alibi\nalibi_max_bais: 4\n",
     ["bad.yaml", "unknown field 'alibi_max_bais'", "did you mean 'alibi_max_bias'"]),
])
def test_field_is_validated_like_the_schemas(site: Path, tmp_path: Path, card: str,
                                             expected: list[str]) -> None:
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "bad.yaml").write_text(card)
    done = zoo(site, tmp_path, "show", "bad", "--registry", str(tmp_path / "cards"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"


WIRED = textwrap.dedent("""
    import sys
    import numpy as np, torch
    from registry.catalog import open_catalog
    from zoo.assemble import build_model
    from zoo.blocks.attention import recorded_attentions

    card = open_catalog().get("gpt-tiny-alibi", {"n_heads": 8, "alibi_max_bias": 4.0})
    model = build_model(card, seed=1)
    attention = model.layers[1].self_attention
    seen = {}
    attention.register_forward_pre_hook(lambda module, args: seen.update(h=args[0]))
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    with torch.no_grad(), recorded_attentions(model.attention_groups()) as records:
        model(ids, mask)
    np.savez(sys.argv[1], h=seen["h"].numpy(), mask=mask.numpy(),
             probabilities=records["attentions"][1][0].numpy(),
             wq=attention.query.weight.detach().numpy(), bq=attention.query.bias.detach().numpy(),
             wk=attention.key.weight.detach().numpy(), bk=attention.key.bias.detach().numpy())
""")


def test_scores_carry_the_bias_in_the_model(site: Path, tmp_path: Path) -> None:
    """Layer 1's attention probabilities in a built model, left-padded, against softmax of
    (Q K^T / sqrt(hd) + the reference bias) computed here from the layer's own projections."""
    done = zoo(site, tmp_path, script=WIRED.replace("sys.argv[1]", repr(str(tmp_path / "a.npz"))))
    assert done.returncode == 0, done.stderr
    run = np.load(tmp_path / "a.npz")
    heads, length = 8, 9
    h = run["h"].astype(np.float64)

    def split(x: np.ndarray) -> np.ndarray:  # (B, T, d) -> (B, heads, T, hd)
        return x.reshape(2, length, heads, -1).transpose(0, 2, 1, 3)

    q, k = split(h @ run["wq"].T + run["bq"]), split(h @ run["wk"].T + run["bk"])
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    scores = scores + reference_bias(heads, 4.0, length, length)[None]
    allowed = np.tril(np.ones((length, length), bool))[None, None] & (run["mask"][:, None, None]
                                                                       > 0)
    scores = np.where(allowed, scores, -1e30)  # finite: a padding query row stays a number
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    real = run["mask"] > 0  # a padding query attends to nothing real: its row is not compared
    np.testing.assert_allclose(run["probabilities"].transpose(0, 2, 1, 3)[real],
                               expected.transpose(0, 2, 1, 3)[real], atol=1e-5)


FAMILIES = textwrap.dedent("""
    import torch
    from registry.catalog import open_catalog
    from zoo.assemble import build_model

    catalog = open_catalog()
    torch.manual_seed(0)
    ids = torch.randint(4, 60, (1, 7))  # within transformer-tiny's 64
    # Encoder: a row padded on the left or the right gives what it gives alone (the bias
    # depends on distances only).
    bert = build_model(catalog.get("bert-tiny", {"position": "alibi"}), seed=1)
    alone = bert(ids)["last_hidden_state"]
    pad = torch.zeros(1, 3, dtype=torch.long)
    for padded, mask, real in ((torch.cat([pad, ids], 1), [0] * 3 + [1] * 7, slice(3, None)),
                               (torch.cat([ids, pad], 1), [1] * 7 + [0] * 3, slice(0, 7))):
        out = bert(padded, torch.tensor([mask]))["last_hidden_state"]
        assert torch.allclose(out[:, real], alone, atol=1e-5), "encoder padding"
    # The same weights (ALiBi has none) under other slopes: the bias is applied.
    flatter = build_model(catalog.get("bert-tiny", {"position": "alibi", "alibi_max_bias": 1}),
                          seed=1)
    assert not torch.allclose(flatter(ids)["last_hidden_state"], alone, atol=1e-3), "encoder"
    # Encoder-decoder: decoding step by step over the cache gives the whole sequence's logits.
    seq2seq = build_model(catalog.get("transformer-tiny", {"position": "alibi"}), seed=1)
    cross = seq2seq.cross_cache(seq2seq.encode(ids))
    whole, _ = seq2seq.decode(ids[:, :5], cross)
    past, steps = None, []
    for t in range(5):
        logits, past = seq2seq.decode(ids[:, t : t + 1], cross, past_key_values=past)
        steps.append(logits)
    assert torch.allclose(torch.cat(steps, 1), whole, atol=1e-5), "decoder cache"
    flatter = build_model(catalog.get("transformer-tiny", {"position": "alibi",
                                                           "alibi_max_bias": 1}), seed=1)
    assert not torch.allclose(flatter.decode(ids[:, :5], cross)[0], whole, atol=1e-3), "decoder"
    print("ok")
""")


def test_every_family_takes_the_bias(site: Path, tmp_path: Path) -> None:
    """The bias reaches the encoder (a padded row as it is alone, unlike learned positions)
    and the encoder-decoder's decoder (its cache steps as the whole sequence)."""
    done = zoo(site, tmp_path, script=FAMILIES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_trains_and_exports_with_parity(site: Path, tmp_path: Path) -> None:
    trained, exported = tmp_path / "trained", tmp_path / "onnx"
    done = zoo(site, tmp_path, "train", "gpt-tiny-alibi", "--task", "lm", "--steps", "30",
               "--batch-size", "8", "--block-size", "64", "--checkpoint-every", "30",
               "-o", str(trained))
    assert done.returncode == 0, done.stderr
    losses = [json.loads(line)["loss"]
              for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - 0.2, losses
    assert "alibi_max_bias: 8.0" in (trained / "config.yaml").read_text()
    done = zoo(site, tmp_path, "export", str(trained), "--onnx", "-o", str(exported))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "parity: PASSED" in done.stdout
    assert "greedy tokens (batch 2, left-padded, 32 steps): identical" in done.stdout
    assert (exported / "onnx" / "model.onnx").is_file()
