"""What the commands print besides their result lines: progress on stderr and one progress
bar (training steps, a file's rows), an updating line on a terminal, about twenty lines in a
log; and the options several commands share (the rest sit on the options classes)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import click

from commands.shell import Parsed
from registry.options import card_override


def echo(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(line)


def progress(message: str) -> None:
    click.echo(message, err=True)


def bar(unit: str, done: int, total: int, tail: str) -> None:
    """`unit done/total [####....] tail` on stderr: one updating line on a terminal, about
    twenty lines in a log file."""
    filled = 20 * done // total
    tty = sys.stderr.isatty()
    if not tty and done != total and filled == 20 * (done - 1) // total:
        return
    line = f"{unit} {done:>{len(str(total))}}/{total} [{'#' * filled}{'.' * (20 - filled)}] {tail}"
    click.echo(("\r" + line) if tty else line, err=True, nl=not tty or done == total)


def train_bar(step: int, total: int, loss: float, lr: float, tokens_per_second: float) -> None:
    bar("step", step, total, f"loss {loss:.4f}  lr {lr:.2e}  {tokens_per_second / 1000:.1f}k tok/s")


def rows_bar(done: int, total: int, rows_per_second: float) -> None:
    bar("rows", done, total, f"{rows_per_second:.1f} rows/s")


registry_option = click.option(
    "--registry", "registries", multiple=True, type=click.Path(file_okay=False),
    help="Extra folder of cards (repeatable); also ZOO_PATH.")
sets_option = click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
                           type=Parsed(card_override), help="Override a card field (repeatable).")
png_out = click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
                       help="The PNG file to write.")


def force_option(what: str = "an existing output folder") -> Any:
    return click.option("--force", is_flag=True, help=f"Overwrite {what}.")


def seed_option(what: str) -> Any:
    return click.option("--seed", default=0, show_default=True, help=what)


def show_scores(step: int, scores: dict[str, Any]) -> None:
    if "accuracy" not in scores:  # --task chat: the loss on the held-out replies
        progress(f"eval at step {step}: loss {scores['loss']:.4f} on {scores['examples']} "
                 "held-out conversations")
        return
    progress(f"eval at step {step}: accuracy {scores['accuracy']:.3f}  macro-F1 "
             f"{scores['macro_f1']:.3f}")
