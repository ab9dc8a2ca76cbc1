"""No refactoring changes an export by accident: the tiny cards' ONNX files, plain and
--optimize, are byte-identical to those of a pinned commit, built from that commit's own code
(git archive) with the same environment.

The pin moves when graphs change on purpose, with the reason here:
- issue #9 (the export redesign) changed none; issue #12 changed transformer-tiny's graphs
  (the cross-attention cache), so it is not compared;
- issue #14 changed every graph on purpose (the score scale on Q, one additive mask per
  forward, GELU in the form ONNX Runtime fuses, residual Sum before LayerNormalization;
  tests/export/test_forms.py proves the forms, the parity grid the values), so the pin is now the
  commit that made that change;
- issue #14's prefill work changed every graph again (GPT-2's GELU in the order ONNX
  Runtime's FastGeluFusion matches; the projections of one tensor, Q/K/V, as one MatMul and a
  Split: export/onnx/forms.py), so the pin moved to that commit;
- issue #23 (sizes derived once, the family resolved once, one ExportOptions) must change no
  graph: the pin is the commit before it, and every tiny card is compared in every variant
  (plain, --optimize, --quantize int8 and int4, --attentions); issue #24's card fields
  (n_kv_heads, head_dim, attention_bias, mlp_bias, qk_norm) change every graph's `zoo.card`
  metadata and nothing else, so a graph is hashed without that entry and the two cards are
  compared field by field;
- issue #26 changed transformer-tiny's decoder.onnx on purpose (the cross-attention's scale
  in its query projection, so the step's scores run with alpha 1: tests/export/test_forms.py
  proves the form, the parity grid the values), and issue #25 added the seq2seq layout in
  onnx/ (not compared here: made from these graphs, tests/export/test_seq2seq_layout.py), so
  the pin was the commit that made the change;
- eb2b816 (T5's tied head) stored the encoder-decoder's tied transposed embedding once in
  transformer-tiny's decoder.onnx (export/onnx/forms.py `tied_transposes`) on purpose and left
  the pin behind; issue #44 (the house: packages moved, no graph changed) found this test
  failing on transformer-tiny alone and moved the pin to that commit. Slow (30 exports):
  `make test-slow`. A clone without the pinned commit (shallow, squashed) skips.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import onnx
import pytest
import yaml

from registry.schema import FIELDS

ROOT = Path(__file__).resolve().parents[2]
PINNED = "eb2b81666fe6f9472118faab79b7c2c9b21f1614"  # a tied head stored once
CARDS = ("gpt-tiny", "bert-tiny", "transformer-tiny")
VARIANTS = {"plain": [], "optimize": ["--optimize"], "int8": ["--quantize", "int8"],
            "int4": ["--quantize", "int4"], "attentions": ["--attentions"]}


def _checkout(commit: str, where: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True)
    if archive.returncode:
        pytest.skip(f"commit {commit[:8]} is not in this clone (a shallow clone?)")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")


def _export(tree: Path, out: Path, card: str, options: list[str]) -> None:
    """`zoo export` run from `tree`'s own code (its folder comes first on sys.path)."""
    command = [sys.executable, "-c", "import sys, cli; sys.exit(cli.main())", "export", card,
               "--onnx", "-o", str(out), *options]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(tree)})
    assert result.returncode == 0, result.stderr[-2000:]


def _graph_files(folder: Path) -> tuple[dict[str, str], dict[str, dict]]:
    """({file: sha256}, {file: the card its metadata records}). A graph is hashed without its
    `zoo.card` entry, which grows whenever the schema gains a field (issue #24's), and the
    cards are compared apart: the old one's fields unchanged, every new field at its schema
    default."""
    hashes, cards = {}, {}
    for path in sorted(folder.iterdir()):
        if path.name.endswith(".onnx.data"):
            hashes[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.suffix == ".onnx":
            proto = onnx.load(str(path), load_external_data=False)
            kept = [entry for entry in proto.metadata_props if entry.key != "zoo.card"]
            cards[path.name] = yaml.safe_load(next(entry.value for entry in proto.metadata_props
                                                   if entry.key == "zoo.card"))
            del proto.metadata_props[:]
            proto.metadata_props.extend(kept)
            hashes[path.name] = hashlib.sha256(proto.SerializeToString()).hexdigest()
    return hashes, cards


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("card", CARDS)
def test_exports_are_byte_identical_to_the_pinned_commit(card: str, variant: str,
                                                           tmp_path: Path) -> None:
    old_tree = tmp_path / "before"
    _checkout(PINNED, old_tree)
    _export(old_tree, tmp_path / "old", card, VARIANTS[variant])
    _export(ROOT, tmp_path / "new", card, VARIANTS[variant])
    (old, old_cards), (new, new_cards) = (_graph_files(tmp_path / "old"),
                                          _graph_files(tmp_path / "new"))
    assert old.keys() == new.keys()
    assert [name for name in old if old[name] != new[name]] == []
    for name, old_card in old_cards.items():
        added = {key: value for key, value in new_cards[name].items() if key not in old_card}
        assert {key: new_cards[name][key] for key in old_card} == old_card
        assert {key: value for key, value in added.items()
                if value != FIELDS[key].default} == {}  # a new field at its default
