"""`zoo bench` and `zoo attention` on a family they have nothing registered for (a dual
encoder, a speech model): one line, exit 2, nothing written, before any model is built or
loaded, any export made or the machine measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.catalog import open_catalog
from runtime.contract import MANIFEST
from tests.support.helpers import assert_one_line_error, zoo
from zoo.files.weights import CONFIG, card_yaml

WORK = {  # what each command does before it measures or draws: none of it may run
    "bench": ["export.bench.run.load_source", "export.bench.run.load_built",
              "export.bench.run.export_and_verify", "export.bench.run.matmul_flops"],
    "attention": ["export.inspect.attention.load_source", "export.inspect.attention.load_built",
                  "export.inspect.attention.open_export"],
}
OUTPUTS = {"bench": ["--repeats", "1", "--json", "{tmp}/bench.json"],
           "attention": ["--ids", "1,2", "-o", "{tmp}/map.png", "--json", "{tmp}/map.json"]}


def export_like(folder: Path, name: str) -> Path:
    """What the commands read first from an export folder: its manifest's place and its card
    (a real export's config.yaml); the graphs are never reached."""
    folder.mkdir()
    (folder / MANIFEST).write_text("{}", encoding="utf-8")
    (folder / CONFIG).write_text(card_yaml(open_catalog().get(name)), encoding="utf-8")
    return folder


@pytest.mark.parametrize("command", ["bench", "attention"])
@pytest.mark.parametrize("name, kind", [("clip-tiny", "dual-encoder"),
                                        ("whisper-tiny-test", "speech")])
@pytest.mark.parametrize("as_folder", [False, True], ids=["card", "export"])
def test_a_family_without_an_entry_is_refused_before_any_work(
        command: str, name: str, kind: str, as_folder: bool, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def worked(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"zoo {command} worked before refusing {name}")

    for target in WORK[command]:
        monkeypatch.setattr(target, worked)
    source = str(export_like(tmp_path / "export", name)) if as_folder else name
    before = sorted(tmp_path.rglob("*"))
    result = zoo(command, source, *[arg.format(tmp=tmp_path) for arg in OUTPUTS[command]])
    assert_one_line_error(result, f"zoo {command}: nothing is registered for a {kind}")
    assert sorted(tmp_path.rglob("*")) == before
