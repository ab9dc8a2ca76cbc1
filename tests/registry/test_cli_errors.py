"""Every bad input through the CLI: exit 2, one line naming the file and the field, no traceback,
and nothing written. Also the happy paths of `zoo list`, `zoo show` and `zoo build`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from registry.errors import ZooError
from tests.conftest import modules_loaded
from tests.support.helpers import assert_one_line_error, zoo

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["bert-base", "bert-tiny", "gpt-tiny", "gpt2-small", "llama-3.2-1b", "llama-tiny",
           "modernbert-base", "modernbert-large", "modernbert-tiny",
           "moe-tiny", "olmoe-1b-7b", "qwen2.5-0.5b", "qwen3-0.6b", "qwen3-30b-a3b",
           "smollm2-135m", "transformer-base", "transformer-big", "transformer-tiny"]
SHIPPED = sorted([*SHIPPED, "gemma-3-1b", "gemma-3-270m", "gemma-tiny",
                  "flan-t5-small", "t5-small", "t5-tiny", "vit-base-patch16-224", "vit-tiny",
                  "whisper-base", "whisper-tiny", "whisper-tiny-test"])
FAMILIES = {
    "bert-base": "encoder", "bert-tiny": "encoder",
    "vit-base-patch16-224": "encoder", "vit-tiny": "encoder",
    "modernbert-base": "encoder", "modernbert-large": "encoder", "modernbert-tiny": "encoder",
    "gpt-tiny": "decoder", "gpt2-small": "decoder", "llama-tiny": "decoder",
    "llama-3.2-1b": "decoder", "qwen2.5-0.5b": "decoder", "qwen3-0.6b": "decoder",
    "smollm2-135m": "decoder",
    "moe-tiny": "decoder", "olmoe-1b-7b": "decoder", "qwen3-30b-a3b": "decoder",
    "gemma-3-1b": "decoder", "gemma-3-270m": "decoder", "gemma-tiny": "decoder",
    "transformer-base": "encoder-decoder", "transformer-big": "encoder-decoder",
    "transformer-tiny": "encoder-decoder",
    "flan-t5-small": "encoder-decoder", "t5-small": "encoder-decoder",
    "t5-tiny": "encoder-decoder",
    "whisper-base": "encoder-decoder", "whisper-tiny": "encoder-decoder",
    "whisper-tiny-test": "encoder-decoder",
}
DUAL = {name: "dual-encoder" for name in ("clip-tiny", "clip-vit-base-patch32", "siglip-tiny",
                                          "siglip-base-patch16-224")}
SHIPPED, FAMILIES = sorted([*SHIPPED, *DUAL]), {**FAMILIES, **DUAL}


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every test in its own folder, with no card folders from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ZOO_PATH", raising=False)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder` (hidden ones too) with its bytes and mtime."""
    return {
        str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*")) if path.is_file()
    }


def write_cards(folder: Path, cards: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in cards.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


# --- cards that do not validate --------------------------------------------------------------

BAD_CARDS = {
    "malformed-yaml": ({"bad.yaml": "family: [decoder\nd_model: 64\n"}, "bad",
                       ["bad.yaml", "malformed YAML"]),
    "not-a-mapping": ({"bad.yaml": "- family\n- decoder\n"}, "bad",
                      ["bad.yaml", "mapping"]),
    "unknown-field": ({"bad.yaml": "extends: gpt-tiny\nn_head: 4\n"}, "bad",
                      ["bad.yaml", "unknown field 'n_head'", "n_heads"]),
    "wrong-type": ({"bad.yaml": "extends: gpt-tiny\nd_model: big\n"}, "bad",
                   ["bad.yaml", "d_model='big'", "int"]),
    "dropout-range": ({"bad.yaml": "extends: gpt-tiny\ndropout: 1.5\n"}, "bad",
                      ["bad.yaml", "dropout=1.5"]),
    "zero-layers": ({"bad.yaml": "extends: gpt-tiny\nn_layers: 0\n"}, "bad",
                    ["bad.yaml", "n_layers=0", ">= 1"]),
    "heads-divide": ({"bad.yaml": "extends: gpt-tiny\nn_heads: 5\n"}, "bad",
                     ["bad.yaml: n_heads=5 does not divide d_model=64"]),
    "unknown-block": ({"bad.yaml": "extends: gpt-tiny\nactivation: relux\n"}, "bad",
                      ["bad.yaml", "activation='relux'", "'relu'"]),
    "missing-required": ({"bad.yaml": "family: decoder\n"}, "bad",
                         ["bad.yaml", "missing required field 'vocab_size'"]),
    "token-beyond-vocab": ({"bad.yaml": "extends: gpt-tiny\npad_token_id: 300\n"}, "bad",
                           ["bad.yaml", "pad_token_id=300", "vocab_size=260"]),
    "encoder-only-field": ({"bad.yaml": "extends: gpt-tiny\npooler: true\n"}, "bad",
                           ["bad.yaml", "pooler", "encoder"]),
    "rotary-odd-head": ({"bad.yaml": "extends: gpt-tiny\nposition: rotary\nn_heads: 64\n"}, "bad",
                        ["bad.yaml", "position=rotary"]),
    "error-in-parent": ({"parent.yaml": "extends: gpt-tiny\ndropout: 1.5\n",
                         "child.yaml": "extends: parent\n"}, "child",
                        ["parent.yaml", "dropout=1.5"]),
    "extends-cycle": ({"a.yaml": "extends: b\n", "b.yaml": "extends: a\n"}, "a",
                      ["b.yaml", "extends cycle", "a -> b -> a"]),
    "self-extends": ({"a.yaml": "extends: a\n"}, "a", ["a.yaml", "extends cycle", "a -> a"]),
    "extends-unknown": ({"a.yaml": "extends: gpt-tinyy\n"}, "a",
                        ["a.yaml", "unknown card 'gpt-tinyy'", "gpt-tiny"]),
    "extends-not-a-name": ({"a.yaml": "extends: [gpt-tiny]\n"}, "a", ["a.yaml", "extends"]),
}


@pytest.mark.parametrize("case", list(BAD_CARDS))
@pytest.mark.parametrize("command", ["show", "build"])
def test_bad_card(tmp_path: Path, case: str, command: str) -> None:
    cards, name, parts = BAD_CARDS[case]
    folder = write_cards(tmp_path / "mycards", cards)
    before = snapshot(tmp_path)
    args = [command, name, "--registry", str(folder)]
    if command == "build":
        args += ["-o", str(tmp_path / "out")]
    assert_one_line_error(zoo(*args), *parts)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "out").exists()


def test_bad_card_through_zoo_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_cards(tmp_path / "mycards", {"bad.yaml": "extends: gpt-tiny\nn_heads: 5\n"})
    monkeypatch.setenv("ZOO_PATH", str(folder))
    assert_one_line_error(zoo("show", "bad"), "bad.yaml: n_heads=5 does not divide d_model=64")


def test_bad_card_breaks_list(tmp_path: Path) -> None:
    folder = write_cards(tmp_path / "mycards", {"bad.yaml": "family: [decoder\n"})
    assert_one_line_error(zoo("list", "--registry", str(folder)), "bad.yaml", "malformed YAML")


@pytest.mark.parametrize("command", ["show", "build"])
def test_unknown_card_suggests_close_name(tmp_path: Path, command: str) -> None:
    line = assert_one_line_error(zoo(command, "gpt-tinny"), "unknown card 'gpt-tinny'",
                                 "did you mean")
    assert "gpt-tiny" in line.split("did you mean", 1)[1]
    assert list(tmp_path.iterdir()) == []


def test_unknown_card_without_close_name() -> None:
    line = assert_one_line_error(zoo("show", "qqqqqqqqqqqq"), "unknown card 'qqqqqqqqqqqq'")
    assert "did you mean" not in line


def test_list_pattern_matching_nothing() -> None:
    assert_one_line_error(zoo("list", "nomatch*"), "no card matches", "nomatch*")


def test_missing_registry_folder(tmp_path: Path) -> None:
    assert_one_line_error(zoo("list", "--registry", str(tmp_path / "nowhere")),
                          "--registry", "nowhere", "does not exist")


@pytest.mark.parametrize("source", ["--registry", "ZOO_PATH"])
def test_duplicate_card_names_both_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    folder = write_cards(tmp_path / "mycards", {"gpt-tiny.yaml": "extends: gpt2-small\n"})
    args = ["list"]
    if source == "ZOO_PATH":
        monkeypatch.setenv("ZOO_PATH", str(folder))
    else:
        args += ["--registry", str(folder)]
    line = assert_one_line_error(zoo(*args), "duplicate card name 'gpt-tiny'")
    assert str(Path("registry") / "cards" / "gpt-tiny.yaml") in line
    assert str(Path("mycards") / "gpt-tiny.yaml") in line


# --- zoo build: existing output, --set ------------------------------------------------------


def test_build_refuses_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine", encoding="utf-8")
    before = snapshot(tmp_path)
    assert_one_line_error(zoo("build", "gpt-tiny", "-o", str(out)), "out", "already exists",
                          "--force")
    assert snapshot(tmp_path) == before


def test_build_force_overwrites_and_plain_rebuild_does_not(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert zoo("build", "gpt-tiny", "-o", str(out), "--seed", "3").exit_code == 0
    first = snapshot(out)
    assert set(first) == {"model.safetensors", "config.yaml"}

    assert_one_line_error(zoo("build", "gpt-tiny", "-o", str(out), "--seed", "4"), "already exists")
    assert snapshot(out) == first

    result = zoo("build", "gpt-tiny", "-o", str(out), "--seed", "4", "--force")
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").read_bytes() != first["model.safetensors"][0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left


@pytest.mark.parametrize(
    ("sets", "parts"),
    [
        (["n_heads=5"], ["--set", "n_heads=5 does not divide d_model=64"]),
        (["garbage"], ["--set 'garbage'", "field=value"]),
        (["=5"], ["--set '=5'", "field=value"]),
        (["n_head=4"], ["--set", "unknown field 'n_head'", "n_heads"]),
        (["dropout=1.5"], ["--set", "dropout=1.5"]),
        (["d_model=big"], ["--set", "d_model='big'", "int"]),
        (["activation=relux"], ["--set", "activation='relux'", "'relu'"]),
    ],
)
def test_build_bad_set_writes_nothing(tmp_path: Path, sets: list[str], parts: list[str]) -> None:
    args = ["build", "gpt-tiny", "-o", str(tmp_path / "out")]
    for pair in sets:
        args += ["--set", pair]
    assert_one_line_error(zoo(*args), *parts)
    assert list(tmp_path.iterdir()) == []


def test_build_set_value_not_yaml(tmp_path: Path) -> None:
    result = zoo("build", "gpt-tiny", "-o", str(tmp_path / "out"), "--set", "n_layers=[1")
    line = assert_one_line_error(result, "--set 'n_layers=[1': value is not valid YAML")
    assert line.startswith("error: --set 'n_layers=[1': value is not valid YAML")
    assert list(tmp_path.iterdir()) == []


def test_build_bad_set_with_force_leaves_existing_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert zoo("build", "gpt-tiny", "-o", str(out)).exit_code == 0
    before = snapshot(tmp_path)
    assert_one_line_error(zoo("build", "gpt-tiny", "-o", str(out), "--force", "--set", "n_heads=5"),
                      "n_heads=5 does not divide d_model=64")
    assert snapshot(tmp_path) == before


# --- loading weights ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("built") / "gpt-tiny"
    result = CliRunner().invoke(cli.main, ["build", "gpt-tiny", "-o", str(out), "--seed", "1"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def built(built_once: Path, tmp_path: Path) -> Path:
    """A private copy of a built gpt-tiny, free to damage."""
    return Path(shutil.copytree(built_once, tmp_path / "model"))


def load_error(folder: Path) -> str:
    from zoo.files.weights import WeightsError, load_built

    with pytest.raises(WeightsError) as info:
        load_built(folder)
    message = str(info.value)
    assert "\n" not in message
    assert "model.safetensors" in message
    return message


def read_weights(folder: Path) -> dict:
    # From bytes, not load_file: load_file maps the file, and rewriting a mapped file in place
    # crashes the process (SIGBUS) when the old tensors are touched.
    from safetensors.torch import load

    return load((folder / "model.safetensors").read_bytes())


def write_weights(folder: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / "model.safetensors"))


def test_load_built_round_trip(built: Path) -> None:
    import torch

    from zoo.files.weights import load_built

    model, card = load_built(built)
    assert card["d_model"] == 64
    saved = read_weights(built)
    state = model.state_dict()
    assert set(state) == set(saved)
    assert all(torch.equal(state[name], saved[name]) for name in saved)


def test_load_missing_weights(built: Path) -> None:
    (built / "model.safetensors").unlink()
    assert "no such file" in load_error(built)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"this is not a safetensors file at all",
        lambda data: data[: len(data) // 2],
        lambda data: data[:100],
        lambda data: b"",
    ],
    ids=["garbage", "truncated-half", "truncated-header", "empty"],
)
def test_load_corrupt_weights(built: Path, damage) -> None:
    path = built / "model.safetensors"
    path.write_bytes(damage(path.read_bytes()))
    assert "not a readable safetensors file" in load_error(built)


def test_load_misshaped_tensor(built: Path) -> None:
    import torch

    tensors = read_weights(built)
    tensors["embeddings.token.weight"] = torch.zeros(10, 64)
    write_weights(built, tensors)
    message = load_error(built)
    assert "mis-shaped" in message
    assert "embeddings.token.weight (10, 64) != (260, 64)" in message
    assert "missing" not in message and "unexpected" not in message


def test_load_missing_and_unexpected_tensors(built: Path) -> None:
    import torch

    tensors = read_weights(built)
    del tensors["final_norm.weight"]
    del tensors["layers.1.self_attention.key.bias"]
    tensors["extra.bias"] = torch.zeros(3)
    write_weights(built, tensors)
    message = load_error(built)
    assert "missing: final_norm.weight, layers.1.self_attention.key.bias" in message
    assert "unexpected: extra.bias" in message


def test_load_folder_without_config(built: Path) -> None:
    from zoo.files.weights import load_built

    (built / "config.yaml").unlink()
    with pytest.raises(ZooError, match="not a built model"):
        load_built(built)


# --- happy paths ----------------------------------------------------------------------------


def table(output: str) -> dict[str, list[str]]:
    """`zoo list` rows by name: [family, params]."""
    lines = output.splitlines()
    assert lines[0].split()[:3] == ["NAME", "FAMILY", "PARAMS"]
    return {line.split()[0]: line.split()[1:3] for line in lines[1:]}


def test_list_shows_every_shipped_card() -> None:
    result = zoo("list")
    assert result.exit_code == 0, result.output
    rows = table(result.stdout)
    assert sorted(rows) == SHIPPED
    assert {name: row[0] for name, row in rows.items()} == FAMILIES
    assert all(row[1] != "?" for row in rows.values())
    assert rows["gpt-tiny"][1] == "124.9K"
    assert rows["gpt2-small"][1] == "124.4M"  # GPT-2 small: 124,439,808
    assert rows["bert-base"][1] == "110.1M"
    assert rows["modernbert-base"][1] == "149.7M"  # ModernBertForMaskedLM: 149,655,232
    assert rows["vit-base-patch16-224"][1] == "86.6M"  # ViTForImageClassification: 86,567,656
    assert rows["clip-vit-base-patch32"][1] == "151.3M"  # CLIPModel: 151,277,313
    assert rows["siglip-base-patch16-224"][1] == "203.2M"  # SiglipModel: 203,155,970
    assert rows["whisper-tiny"][1] == "37.8M"  # WhisperForConditionalGeneration: 37,760,640


def test_list_pattern() -> None:
    result = zoo("list", "gpt*")
    assert result.exit_code == 0, result.output
    assert sorted(table(result.stdout)) == ["gpt-tiny", "gpt2-small"]


def test_show_origins_and_count() -> None:
    result = zoo("show", "gpt-tiny")
    assert result.exit_code == 0, result.output
    fields = {line.split()[0]: line for line in result.stdout.splitlines()[1:]
              if "#" in line}
    assert fields["activation"].split()[1] == "gelu_tanh"
    assert fields["activation"].endswith("gpt2-small.yaml")
    assert fields["d_model"].split()[1] == "64"
    assert fields["d_model"].endswith("gpt-tiny.yaml")
    assert fields["rope_theta"].endswith("# default")
    assert "parameters: 124,928" in result.stdout.splitlines()


@pytest.mark.parametrize("args", [["list"], ["show", "gpt-tiny"], ["list", "--help"],
                                  ["show", "bert-base", "--set", "mlm_head=false"]])
def test_list_and_show_do_not_import_torch(args: list[str]) -> None:
    assert modules_loaded([args], ("torch",)) == []


def test_build_is_deterministic(tmp_path: Path) -> None:
    """One seed, one set of bytes: in this process and in a fresh one (other hash seeds)."""
    for folder, seed in (("a", "3"), ("c", "4")):
        result = zoo("build", "gpt-tiny", "-o", str(tmp_path / folder), "--seed", seed)
        assert result.exit_code == 0, result.output
        assert "parameters: 124,928" in result.stdout
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"}
    env.pop("ZOO_PATH", None)
    command = ["build", "gpt-tiny", "-o", str(tmp_path / "b"), "--seed", "3"]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *command],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    weights = {folder: (tmp_path / folder / "model.safetensors").read_bytes() for folder in "abc"}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]
    configs = [(tmp_path / folder / "config.yaml").read_bytes() for folder in "ab"]
    assert configs[0] == configs[1]


def test_build_default_output_folder_is_card_name(tmp_path: Path) -> None:
    result = zoo("build", "gpt-tiny")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "gpt-tiny").iterdir()) == [
        "config.yaml", "model.safetensors"]


def test_help_on_every_command() -> None:
    assert cli.main.commands, "no commands registered"
    top = zoo("--help")
    assert top.exit_code == 0
    for name, command in cli.main.commands.items():
        assert name in top.stdout
        for flag in ("--help", "-h"):
            result = zoo(name, flag)
            assert result.exit_code == 0, (name, result.output)
            assert result.stdout.startswith("Usage: "), result.stdout
            assert f" {name} " in result.stdout.splitlines()[0]
            first_words = " ".join((command.help or "").split()[:3])
            assert first_words and first_words in " ".join(result.stdout.split())


# --- zoo show --set, zoo run options ----------------------------------------------------------


def test_show_set_overrides_the_card_and_its_count() -> None:
    result = zoo("show", "bert-base", "--set", "mlm_head=false")
    assert result.exit_code == 0, result.output
    fields = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if "#" in line}
    assert fields["mlm_head"].split()[1] == "false"
    assert fields["mlm_head"].endswith("# --set")
    assert fields["d_model"].endswith("bert-base.yaml")
    # Hugging Face BertModel (bert-base-uncased, no MLM head): 109,482,240 parameters.
    assert "parameters: 109,482,240" in result.stdout.splitlines()


@pytest.mark.parametrize(
    ("pair", "parts"),
    [
        ("mlm_head=[1", ["--set 'mlm_head=[1': value is not valid YAML"]),
        ("mlm_head=maybe", ["--set", "mlm_head='maybe'", "bool"]),
        ("n_head=4", ["--set", "unknown field 'n_head'", "n_heads"]),
        ("garbage", ["--set 'garbage'", "field=value"]),
    ],
)
def test_show_bad_set_is_one_line(pair: str, parts: list[str]) -> None:
    assert_one_line_error(zoo("show", "bert-base", "--set", pair), *parts)


@pytest.mark.parametrize("count", ["-3", "0"])
def test_run_refuses_max_new_tokens_below_one_before_opening_the_folder(
        tmp_path: Path, count: str) -> None:
    # The folder does not exist: the option is checked before any work, so no export is needed.
    result = zoo("run", str(tmp_path / "no-export"), "--ids", "1,2", "--max-new-tokens", count)
    assert_one_line_error(result, f"--max-new-tokens {count}: should be >= 1")
    assert list(tmp_path.iterdir()) == []
