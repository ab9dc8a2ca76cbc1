"""The graph names docs/onnx-contract.md promises, read from its tables: an expectation that does
not come from the writer (export/family.py names the graphs; a test comparing them with
`family.contract(card)` could never see a wrong name).

Section 3's tables list, per graph file, the inputs and then (`→`) the outputs; a row may hold
per-layer names (`{i}`, a second name shortened to its suffix: `.encoder.value`) or apply only
to some cards (**only when `card.FIELD`**, `card.FIELD > 0`, or `card.FIELD == VALUE`).
Per-layer rows that follow one another interleave per layer, as the graphs order them. The
attention-maps table adds `--attentions`' outputs after every other output, group by group."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "onnx-contract.md"
LAYOUT = "layout"  # the encoder-decoder's seq2seq layout, apart from the contract graphs
FAMILY_HEADINGS = {"### encoder (": "encoder", "### decoder (": "decoder",
                   "### encoder-decoder (": "encoder-decoder", "### dual-encoder (": "dual-encoder",
                   "### encoder-decoder in the seq2seq layout": LAYOUT}
CONDITION = re.compile(r"\*\*only when `card\.(\w+)( > 0| == \w+)?`\*\*")
NAME = re.compile(r"`([^`]+)`")


def _sections(text: str) -> dict[tuple[str, str], list[str]]:
    """{(family, file): the name cells of its table rows}, from section 3's tables."""
    tables: dict[tuple[str, str], list[str]] = {}
    family = file = None
    for line in text.split("## 3.", 1)[1].split("\n## ", 1)[0].splitlines():
        heading = next((f for start, f in FAMILY_HEADINGS.items() if line.startswith(start)),
                       None)
        if heading is not None:
            family, files = heading, NAME.findall(line.split(":", 1)[-1])
            file = files[0] if len(files) == 1 else None
        elif line.startswith("### "):
            family = None
        elif family and re.match(r"^`[\w./]+\.onnx`", line):
            file = NAME.match(line).group(1)
        elif family and file and line.startswith(("| `", "| → `")):
            condition = CONDITION.search(line)  # in the meaning column: kept with the name
            tables.setdefault((family, file), []).append(
                line.split("|")[1].strip() + (f" {condition.group(0)}" if condition else ""))
    return tables


def _applies(cell: str, card: Any) -> bool:
    found = CONDITION.search(cell)
    if found is not None and (found.group(2) or "").startswith(" == "):  # a field's one value
        return str(card[found.group(1)]) == found.group(2).removeprefix(" == ")
    return found is None or bool(card[found.group(1)])


def _names(cell: str) -> list[str]:
    names = NAME.findall(cell.split("**")[0])
    first = names[0]
    return [first] + [first.split("{i}")[0] + "{i}" + name if name.startswith(".") else name
                      for name in names[1:]]


def _expand(cells: list[str], card: Any) -> tuple[list[str], list[str]]:
    """(inputs, outputs) of one table for `card`."""
    found: dict[bool, list[str]] = {False: [], True: []}
    layered: list[list[str]] = []
    for cell in [*cells, ""]:
        is_layered = "{i}" in cell
        if layered and (not is_layered or cell.startswith("→") != layered[0][0].startswith("→")):
            side = layered[0][0].startswith("→")
            found[side] += [name.format(i=i) for i in range(card["n_layers"])
                            for names in layered for name in names[1:]]
            layered = []
        if not cell or not _applies(cell, card):
            continue
        if is_layered:
            layered.append([cell, *_names(cell)])
        else:
            found[cell.startswith("→")] += _names(cell)
    return found[False], found[True]


def _attention_outputs(text: str, family: str, file: str, layers: int) -> list[str]:
    table = text.split("### Attention maps", 1)[1].split("\n\n", 3)[2]
    for row in table.splitlines()[2:]:
        graph, outputs = (cell.strip() for cell in row.split("|")[1:3])
        if f"`{file}`" in graph and (family in graph.split(":")[0]
                                     or family == "encoder-decoder"):
            groups = [name.removesuffix(".{i}") for name in NAME.findall(outputs)]
            return [f"{group}.{i}" for group in groups for i in range(layers)]
    raise KeyError((family, file))


def documented_contract(card: Any, attentions: bool = False
                        ) -> dict[str, tuple[list[str], list[str]]]:
    """{file: (input names, output names)} as the contract document gives them for `card`
    (one of the families' plain graphs: no pooling)."""
    text = DOC.read_text(encoding="utf-8")
    contract = {}
    for (family, file), cells in _sections(text).items():
        if family != card["family"]:
            continue
        inputs, outputs = _expand(cells, card)
        if attentions:
            outputs += _attention_outputs(text, family, file, card["n_layers"])
        contract[file] = (inputs, outputs)
    return contract


def documented_layout(card: Any) -> dict[str, tuple[list[str], list[str]]]:
    """{file: (input names, output names)} of the encoder-decoder's seq2seq layout, from its
    tables in section 3."""
    return {file: _expand(cells, card) for (family, file), cells in
            _sections(DOC.read_text(encoding="utf-8")).items() if family == LAYOUT}


def documented_axes() -> dict[str, str]:
    """{symbol: the dynamic axis name}, from section 2's sentence "Dynamic axes carry these
    names in the ONNX files (Optimum's): `batch_size` (B), ..."."""
    text = DOC.read_text(encoding="utf-8")
    sentence = text.split("Dynamic axes carry these names", 1)[1].split("Everything else", 1)[0]
    return {symbol.split(":")[0]: name
            for name, symbol in re.findall(r"`([\w +]+)` \(([^)]+)\)", sentence)}


def documented_stored_name(file: str, quantize: str | None) -> str:
    """Where an export made with `--quantize quantize` stores the graph `file`, by section 1's
    table of transformers.js's dtype suffixes (graphs under onnx/ only)."""
    if not quantize or not file.startswith("onnx/"):
        return file
    text = DOC.read_text(encoding="utf-8")
    table = text.split("### Quantized exports", 1)[1].split("\n\n", 3)[2]
    for row in table.splitlines()[2:]:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        if cells[0] == f"`{quantize}`":
            return f"{file.removesuffix('.onnx')}{cells[3].strip('`')}.onnx"
    raise KeyError(quantize)
