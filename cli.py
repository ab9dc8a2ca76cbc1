"""The `zoo` command line: parses, calls, prints, and maps errors to exit codes.

User errors (`ZooError`) print one line and exit 2. torch is imported only by the commands that
need it, so `zoo list` and `zoo show` answer at once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml

from registry import Card, ZooError, count_parameters, open_catalog, total_parameters
from registry.params import UnknownCount

EXIT_USER_ERROR = 2


class ZooGroup(click.Group):
    """Turns a ZooError anywhere below into one line on stderr and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ZooError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_USER_ERROR)


registry_option = click.option(
    "--registry", "registries", multiple=True, type=click.Path(file_okay=False),
    help="Extra folder of cards (repeatable); also ZOO_PATH.",
)


def human(count: int | None) -> str:
    if count is None:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.1f}{unit}"
    return str(count)


def parse_overrides(pairs: tuple[str, ...]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        field, sep, raw = pair.partition("=")
        if not sep or not field:
            raise ZooError(f"--set {pair!r}: expected field=value")
        try:
            overrides[field.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ZooError(f"--set {pair!r}: value is not valid YAML: {exc}") from exc
    return overrides


@click.group(cls=ZooGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A plugin-style Transformer model zoo: YAML cards, shared PyTorch blocks, safetensors
    weights, and ONNX export with parity checks against ONNX Runtime."""


@main.command("list")
@click.argument("pattern", default="*")
@registry_option
def list_cards(pattern: str, registries: tuple[str, ...]) -> None:
    """List cards whose name matches PATTERN (wildcards: * ? [...])."""
    catalog = open_catalog(registries)
    names = catalog.names(pattern)
    if not names:
        raise ZooError(f"no card matches '{pattern}'")
    rows = []
    for name in names:
        card = catalog.get(name)
        rows.append((name, card.family, human(total_parameters(card.fields)),
                     card["description"]))
    widths = [max(len(row[i]) for row in rows + [("NAME", "FAMILY", "PARAMS", "")])
              for i in range(3)]
    header = ("NAME", "FAMILY", "PARAMS", "DESCRIPTION")
    for row in [header, *rows]:
        click.echo(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")


@main.command()
@click.argument("name")
@registry_option
def show(name: str, registries: tuple[str, ...]) -> None:
    """Show card NAME resolved, where each field came from, and its parameter count."""
    card = open_catalog(registries).get(name)
    click.echo(f"# {card.name}  ({card.path})")
    width = max(len(field) for field in card.fields)
    for field, value in card.fields.items():
        shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        click.echo(f"{field:<{width}}  {shown:<24}  # {card.origins[field]}")
    try:
        parts = count_parameters(card.fields)
    except UnknownCount as exc:
        click.echo(f"parameters: unknown (plugin block '{exc}' declares no count)")
        return
    click.echo(f"parameters: {sum(parts.values()):,}")
    for part, count in parts.items():
        click.echo(f"  {part:<16} {count:>14,}")


def resolve_card(name: str, registries: tuple[str, ...], overrides: dict[str, Any]) -> Card:
    return open_catalog(registries).get(name, overrides or None)


@main.command()
@click.argument("name")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Output folder [./NAME].")
@click.option("--seed", default=0, show_default=True, help="Initialisation seed.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Override a card field (repeatable).")
@click.option("--force", is_flag=True, help="Overwrite an existing output folder.")
@registry_option
def build(name: str, out: str | None, seed: int, sets: tuple[str, ...], force: bool,
          registries: tuple[str, ...]) -> None:
    """Build card NAME with fresh weights: writes OUT/model.safetensors and OUT/config.yaml."""
    card = resolve_card(name, registries, parse_overrides(sets))
    target = Path(out or name)
    from zoo.atomic import refuse_existing

    refuse_existing(target, force)  # before minutes of work, not after
    click.echo(f"building {card.name} (seed {seed})...", err=True)
    from zoo.build import build_model
    from zoo.weights import save_built

    model = build_model(card, seed=seed)
    path = save_built(model, card, target, force=force)
    parts: dict[str, int] = {}
    for param_name, parameter in model.named_parameters():
        part = param_name.split(".")[0]
        parts[part] = parts.get(part, 0) + parameter.numel()
    click.echo(f"wrote {path} and {path.parent / 'config.yaml'}")
    click.echo(f"parameters: {sum(parts.values()):,}")
    for part, count in parts.items():
        click.echo(f"  {part:<20} {count:>14,}")


PROVIDER = click.Choice(["cpu", "cuda"])


@main.command("export")
@click.argument("source", metavar="NAME|DIR")
@click.option("--onnx", "to_onnx", is_flag=True, help="Export to ONNX (the one format so far).")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Output folder [NAME-onnx].")
@click.option("--opset", default=18, show_default=True, help="ONNX opset.")
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True,
              help="ONNX Runtime provider for the parity check.")
@click.option("--atol", default=1e-4, show_default=True, help="Parity absolute tolerance.")
@click.option("--rtol", default=1e-3, show_default=True, help="Parity relative tolerance.")
@click.option("--seed", default=0, show_default=True, help="Seed when building a card.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="Override a field.")
@click.option("--force", is_flag=True, help="Overwrite an existing output folder.")
@registry_option
def export_command(source: str, to_onnx: bool, out: str | None, opset: int, provider: str,
                   atol: float, rtol: float, seed: int, sets: tuple[str, ...], force: bool,
                   registries: tuple[str, ...]) -> None:
    """Export a card or a built folder to ONNX, then prove parity with PyTorch.

    Files land in OUT only when onnx.checker and the parity grid both passed.
    """
    if not to_onnx:
        raise ZooError("choose an export format: --onnx")
    target = Path(out or f"{Path(source).name}-onnx")
    from zoo.atomic import refuse_existing

    refuse_existing(target, force)
    progress = lambda message: click.echo(message, err=True)  # noqa: E731
    from export.parity import ParityError
    from export.pipeline import export_and_verify, load_source

    progress(f"loading {source}...")
    model, card = load_source(source, registries, seed, parse_overrides(sets) or None)
    try:
        report = export_and_verify(model, card, target, opset, provider, atol, rtol, force,
                                   progress)
    except ParityError as exc:
        click.echo(exc.report.table())
        raise
    click.echo(report.table())
    files = ", ".join(sorted(p.name for p in target.iterdir()))
    click.echo(f"wrote {target}/ ({files})")


@main.command()
@click.argument("folder", type=click.Path())
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True)
@click.option("--atol", default=1e-4, show_default=True, help="Absolute tolerance.")
@click.option("--rtol", default=1e-3, show_default=True, help="Relative tolerance.")
def parity(folder: str, provider: str, atol: float, rtol: float) -> None:
    """Check an exported FOLDER: PyTorch against ONNX Runtime on the shape grid."""
    from export.engines import TorchEngine
    from export.parity import ParityError, check_parity
    from export.runtime import Runtime
    from zoo.weights import load_built

    runtime = Runtime(Path(folder), provider)  # verifies the manifest's sha256 first
    model, card = load_built(Path(folder))
    report = check_parity(TorchEngine(model, card), runtime, atol, rtol)
    click.echo(report.table())
    if not report.passed:
        raise ParityError(report)


if __name__ == "__main__":
    sys.exit(main())
