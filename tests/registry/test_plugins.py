"""A plugin outside the package: an installed-looking distribution (a package plus a dist-info
folder with an entry point in `zoo.plugins`) found on PYTHONPATH.

Plugins load once per process (registry/plugins.py caches them), so every check runs the CLI in
a fresh subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.helpers import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]

SCALENORM_REGISTER = """
    from pathlib import Path


    def register(api):
        api.add_block("norm", "scalenorm", "{package}.blocks:ScaleNorm",
                      param_count=lambda card: 1)
        api.add_cards(Path(__file__).parent / "cards")
"""

SCALENORM_BLOCKS = """
    import torch
    from torch import nn


    class ScaleNorm(nn.Module):
        \"\"\"Nguyen & Salazar 2019: one learned scalar gain over the L2-normalised vector.\"\"\"

        def __init__(self, d_model, eps):
            super().__init__()
            self.eps = eps
            self.g = nn.Parameter(torch.tensor(float(d_model) ** 0.5))

        def forward(self, x):
            return self.g * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)
"""

SCALENORM_CARD = """\
extends: gpt-tiny
description: gpt-tiny with the plugin's ScaleNorm
norm: scalenorm
"""


def make_plugin(
    site: Path,
    package: str,
    entry: str,
    register: str,
    blocks: str | None = None,
    cards: dict[str, str] | None = None,
) -> str:
    """Write package `package` and its dist-info into `site`; return the distribution name."""
    dist = package.replace("_", "-")
    pkg = site / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(register.format(package=package)).lstrip())
    if blocks is not None:
        (pkg / "blocks.py").write_text(textwrap.dedent(blocks).lstrip())
    if cards is not None:
        (pkg / "cards").mkdir()
        for name, text in cards.items():
            (pkg / "cards" / name).write_text(text)
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[zoo.plugins]\n{entry} = {package}:register\n")
    return dist


def scalenorm_plugin(site: Path) -> str:
    return make_plugin(site, "zoo_test_plugin", "scalenorm", SCALENORM_REGISTER,
                       SCALENORM_BLOCKS, {"scalenorm-gpt.yaml": SCALENORM_CARD})


def run(site: Path, cwd: Path, *args: str, script: str | None = None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    env.pop("ZOO_PATH", None)
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_plugin_card_listed_without_torch(tmp_path: Path) -> None:
    site = tmp_path / "site"
    scalenorm_plugin(site)
    script = textwrap.dedent("""
        import sys
        from cli import main
        main(["list"], standalone_mode=False)
        main(["show", "scalenorm-gpt"], standalone_mode=False)
        assert "torch" not in sys.modules, "listing a plugin card imported torch"
    """)
    done = run(site, tmp_path, script=script)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in done.stdout.splitlines()
            if line and not line.startswith((" ", "#"))}
    assert rows["scalenorm-gpt"] == ["decoder", "124.3K"]
    assert "gpt-tiny" in rows  # shipped cards are still there
    shown = {line.split()[0]: line for line in done.stdout.splitlines() if "  # " in line}
    assert shown["norm"].split()[1] == "scalenorm"
    assert shown["norm"].endswith("scalenorm-gpt.yaml")
    assert shown["d_model"].endswith("gpt-tiny.yaml")
    # gpt-tiny's 124,928 less five layernorms (2 * 64 each) plus five one-scalar ScaleNorms
    assert "parameters: 124,293" in done.stdout


def test_plugin_card_builds_with_plugin_block(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    site = tmp_path / "site"
    scalenorm_plugin(site)
    out = tmp_path / "out"
    done = run(site, tmp_path, "build", "scalenorm-gpt", "-o", str(out), "--seed", "2")
    assert done.returncode == 0, done.stderr
    assert "parameters: 124,293" in done.stdout
    tensors = load_file(str(out / "model.safetensors"))
    gains = {name: tensor for name, tensor in tensors.items() if name.endswith(".g")}
    assert sorted(gains) == [
        "final_norm.g",
        "layers.0.norms.0.g", "layers.0.norms.1.g",
        "layers.1.norms.0.g", "layers.1.norms.1.g",
    ]
    assert all(tensor.shape == () for tensor in gains.values())
    assert not any(name.startswith(("final_norm.weight", "final_norm.bias")) for name in tensors)
    assert not any(".norms." in name and not name.endswith(".g") for name in tensors)
    assert sum(tensor.numel() for tensor in tensors.values()) == 124_293
    assert "norm: scalenorm" in (out / "config.yaml").read_text()


def test_plugin_register_raises(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = make_plugin(site, "zoo_broken_plugin", "broken", """
        def register(api):
            raise RuntimeError("boom at register")
    """)
    for command in (["list"], ["show", "gpt-tiny"], ["build", "gpt-tiny", "-o", "out"]):
        done = run(site, tmp_path, *command)
        assert_one_line_error(done, "plugin 'broken'", f"({dist})", "failed to load",
                              "RuntimeError", "boom at register")
    assert not (tmp_path / "out").exists()


def test_plugin_that_cannot_be_imported(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_plugin(site, "zoo_unimportable_plugin", "unimportable", """
        import zoo_no_such_module_anywhere  # noqa: F401


        def register(api):
            pass
    """)
    assert_one_line_error(run(site, tmp_path, "list"), "plugin 'unimportable'", "failed to load",
                          "zoo_no_such_module_anywhere")


def test_plugin_block_name_clashes_with_builtin(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = make_plugin(site, "zoo_clash_plugin", "clash", """
        def register(api):
            api.add_block("norm", "layernorm", "{package}.blocks:Other")
    """)
    line = assert_one_line_error(run(site, tmp_path, "list"), "plugin 'clash'", f"({dist})",
                                 "norm block 'layernorm'", "already registered", "built-in")
    assert line.index("plugin 'clash'") < line.index("built-in")


def test_two_plugins_register_one_block_name(tmp_path: Path) -> None:
    site = tmp_path / "site"
    register = """
        def register(api):
            api.add_block("activation", "squared_relu", "{package}:Block")
    """
    first = make_plugin(site, "zoo_first_plugin", "first", register)
    second = make_plugin(site, "zoo_second_plugin", "second", register)
    # Plugins load in entry-point name order: "first", then "second" clashes with it.
    assert_one_line_error(run(site, tmp_path, "list"), "activation block 'squared_relu'",
                          f"plugin 'second' ({second})", f"plugin 'first' ({first})")
