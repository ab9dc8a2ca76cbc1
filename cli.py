"""The `zoo` command line: each command parses its options, calls one library function
(export/commands/, registry/listing.py, the plots), prints the lines it returns, and leaves
errors to ZooGroup: a ZooError is one line and exit 2, a fault of the machine one line and
exit 1. torch is imported only by the commands that need it, so `zoo list` and `zoo show`
answer at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import yaml

from registry.errors import ZooError, first_line
from registry.paths import display_path

EXIT_USER_ERROR = 2
EXIT_FAULT = 1


class ZooGroup(click.Group):
    """Turns a ZooError anywhere below into one line on stderr and exit code 2 (1 for a
    FaultError, and for an OSError: a full disk, a read-only location), after the report of a
    failed check; SIGTERM stops a command as Ctrl-C does, so its staged output is cleaned up
    on the way out."""

    def invoke(self, ctx: click.Context) -> Any:
        previous = _on_sigterm(_interrupt)
        try:
            return super().invoke(ctx)
        except ZooError as exc:
            report = getattr(exc, "report", None)  # a failed parity or agreement check
            if report is not None:
                click.echo(report.table())
            click.echo(f"error: {exc}", err=True)
            ctx.exit(getattr(exc, "exit_code", EXIT_USER_ERROR))
        except OSError as exc:
            click.echo(f"error: {os_problem(exc)}", err=True)
            ctx.exit(EXIT_FAULT)
        finally:
            _on_sigterm(previous)


def _on_sigterm(handler: Any) -> Any:
    """Install `handler` for SIGTERM, returning the one before; only the main thread may."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler if handler is not None else signal.SIG_DFL)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through every atomic write's clean-up


def os_problem(exc: OSError) -> str:
    """One line for a failed read or write: the file where the OS names one, and why."""
    where = display_path(exc.filename) if exc.filename is not None else "writing the output"
    return f"{where}: {exc.strerror or first_line(exc)}"


def echo(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(line)


def progress(message: str) -> None:
    click.echo(message, err=True)


# --- options that several commands share ----------------------------------------------------

PROVIDER = click.Choice(["cpu", "cuda"])
registry_option = click.option(
    "--registry", "registries", multiple=True, type=click.Path(file_okay=False),
    help="Extra folder of cards (repeatable); also ZOO_PATH.")
provider_option = click.option("--provider", type=PROVIDER, default="cpu", show_default=True,
                               help="ONNX Runtime's execution provider.")
threads_option = click.option("--threads", type=int, help="ONNX Runtime CPU threads [all cores].")
sets_option = click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
                           help="Override a card field (repeatable).")
png_out = click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
                       help="The PNG file to write.")


def force_option(what: str = "an existing output folder") -> Any:
    return click.option("--force", is_flag=True, help=f"Overwrite {what}.")


def seed_option(what: str) -> Any:
    return click.option("--seed", default=0, show_default=True, help=what)


def tolerance_options(command: Any) -> Any:
    command = click.option("--rtol", default=1e-3, show_default=True,
                           help="Parity relative tolerance.")(command)
    return click.option("--atol", default=1e-4, show_default=True,
                        help="Parity absolute tolerance.")(command)


# --- parsing --------------------------------------------------------------------------------

def parse_overrides(pairs: tuple[str, ...]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        field, sep, raw = pair.partition("=")
        if not sep or not field:
            raise ZooError(f"--set {pair!r}: expected field=value")
        try:
            overrides[field.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or first_line(exc)
            raise ZooError(f"--set {pair!r}: value is not valid YAML: {problem}") from exc
    return overrides


def parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise ZooError(f"--ids {text!r}: expected comma-separated integers like 1,2,3") from exc


def parse_count(option: str, text: str | None) -> int | None:
    """A whole number from the command line; parsed here so a bad one is one line, exit 2."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ZooError(f"{option} {text!r}: expected a whole number") from None


@click.group(cls=ZooGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="zoo", prog_name="zoo", message="%(prog)s %(version)s")
def main() -> None:
    """A plugin-style Transformer model zoo: YAML cards, shared PyTorch blocks, safetensors
    weights, and ONNX export with parity checks against ONNX Runtime."""


# --- cards and model folders ----------------------------------------------------------------

@main.command("list")
@click.argument("pattern", default="*")
@registry_option
def list_cards(pattern: str, registries: tuple[str, ...]) -> None:
    """List cards whose name matches PATTERN (wildcards: * ? [...])."""
    from registry.listing import card_table

    echo(card_table(pattern, registries))


@main.command()
@click.argument("name")
@sets_option
@registry_option
def show(name: str, sets: tuple[str, ...], registries: tuple[str, ...]) -> None:
    """Show card NAME resolved, where each field came from, and its parameter count."""
    from registry.catalog import open_catalog
    from registry.listing import card_report

    echo(card_report(open_catalog(registries).get(name, parse_overrides(sets) or None)))


@main.command()
@click.argument("name")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Output folder [./NAME].")
@seed_option("Initialisation seed.")
@sets_option
@force_option()
@registry_option
def build(name: str, out: str | None, seed: int, sets: tuple[str, ...], force: bool,
          registries: tuple[str, ...]) -> None:
    """Build card NAME with fresh weights: writes OUT/model.safetensors and OUT/config.yaml."""
    from export.commands.models import build_command

    echo(build_command(name, Path(out or name), seed, parse_overrides(sets), registries, force,
                       progress))


@main.command("import")
@click.argument("source", metavar="DIR|FILE.gguf", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Output folder (a built model).")
@force_option()
def import_command(source: str, out: str, force: bool) -> None:
    """Import a Hugging Face GPT-2, BERT, MarianMT, Llama, Mistral, Qwen2 or Qwen3 folder, a
    BertForSequenceClassification folder or a sentence-transformers folder (config.json +
    model.safetensors), or a Llama-architecture GGUF file (dequantized to float32).

    Writes OUT/model.safetensors, config.yaml, source.json and the tokenizer files DIR has;
    OUT then works with `zoo export OUT --onnx`. Pickle checkpoints are never loaded.
    """
    from export.commands.models import import_command as run_import

    echo(run_import(Path(source), Path(out), force))


def progress_bar(step: int, total: int, loss: float, lr: float, tokens_per_second: float) -> None:
    filled = int(20 * step / total)
    line = (f"step {step:>{len(str(total))}}/{total} [{'#' * filled}{'.' * (20 - filled)}] "
            f"loss {loss:.4f}  lr {lr:.2e}  {tokens_per_second / 1000:.1f}k tok/s")
    tty = sys.stderr.isatty()
    if not tty and step % max(1, total // 20) and step != total:
        return  # a log file gets about twenty lines, a terminal one updating line
    click.echo(("\r" + line) if tty else line, err=True, nl=not tty or step == total)


def show_scores(step: int, scores: dict[str, Any]) -> None:
    progress(f"eval at step {step}: accuracy {scores['accuracy']:.3f}  macro-F1 "
             f"{scores['macro_f1']:.3f}")


@main.command()
@click.argument("source", metavar="NAME|DIR")
@click.option("--task", type=click.Choice(["lm", "mlm", "copy", "reverse", "classify"]),
              required=True,
              help="lm: decoder on text; mlm: encoder on text; copy: encoder-decoder, synthetic; "
                   "reverse: encoder-decoder, the shipped text's words in reverse order; "
                   "classify: a classifier (encoder or decoder) on labelled text.")
@click.option("--data", type=click.Path(dir_okay=False),
              help="lm/mlm: UTF-8 text [the shipped Shakespeare]; classify: JSONL "
                   '({"text": ..., "label": ...} a line) or CSV with a text,label header.')
@click.option("--eval", "eval_file", type=click.Path(dir_okay=False),
              help="classify: held-out rows (same format), scored at each checkpoint.")
@click.option("--eval-fraction", type=float,
              help="classify: hold out this share of --data instead (split with --seed).")
@click.option("--steps", default=300, show_default=True, help="Total optimizer steps.")
@click.option("--batch-size", default=32, show_default=True)
@click.option("--block-size", default=128, show_default=True, help="Tokens per sequence.")
@click.option("--lr", type=float, help="cosine: peak rate [1e-3]; noam: factor [1.0].")
@click.option("--schedule", type=click.Choice(["noam", "cosine"]),
              help="[noam for encoder-decoder, cosine otherwise]")
@click.option("--warmup", type=int, help="Warm-up steps [400 for noam, 100 for cosine].")
@click.option("--label-smoothing", type=float, help="[0.1 for encoder-decoder, else 0]")
@click.option("--checkpoint-every", default=100, show_default=True)
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Output folder [NAME-trained].")
@click.option("--resume", is_flag=True, help="Continue from OUT's last checkpoint.")
@seed_option("Initialisation and data seed.")
@click.option("--force", is_flag=True, help="Replace an existing OUT (starting afresh).")
@registry_option
def train(source: str, task: str, data: str | None, eval_file: str | None,
          eval_fraction: float | None, steps: int, batch_size: int, block_size: int,
          lr: float | None, schedule: str | None, warmup: int | None,
          label_smoothing: float | None, checkpoint_every: int, out: str | None, resume: bool,
          seed: int, force: bool, registries: tuple[str, ...]) -> None:
    """Train a card or a built folder; checkpoints land in OUT (safetensors + JSON).

    --task classify makes SOURCE a classifier for the labels in --data: the body's weights are
    kept, the new head initialised (OUT/init.json lists which), and OUT/eval.json holds the
    held-out scores. Under `torchrun --nproc_per_node N` the same command trains data-parallel.
    """
    if task == "classify" and data is None:
        raise ZooError("--task classify needs --data FILE (JSONL or CSV of text, label)")
    if task != "classify" and (eval_file or eval_fraction is not None):
        raise ZooError("--eval and --eval-fraction are for --task classify")
    from export.commands.models import train_command
    from zoo.training.train import TrainOptions

    options = TrainOptions(
        task=task, out=Path(out or f"{Path(source).name}-trained"),
        data=Path(data) if data else None, steps=steps, batch_size=batch_size,
        block_size=block_size, lr=lr, schedule=schedule, warmup=warmup,
        label_smoothing=label_smoothing, checkpoint_every=checkpoint_every, seed=seed,
        resume=resume, force=force, eval=Path(eval_file) if eval_file else None,
        eval_fraction=eval_fraction,
        tokenizer_folder=Path(source) if Path(source).is_dir() else None)
    echo(train_command(source, options, registries, progress_bar, show_scores, progress))


@main.group()
def dataset() -> None:
    """Write demo datasets made from what ships."""


@dataset.command("speakers")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Folder for train.jsonl, eval.jsonl and pretrain.txt.")
@click.option("--top", default=4, show_default=True, help="The most frequent speakers kept.")
@click.option("--eval-fraction", default=0.2, show_default=True,
              help="Share of the speeches held out.")
@seed_option("Seed of the split.")
@force_option("an existing folder")
def dataset_speakers(out: str, top: int, eval_fraction: float, seed: int, force: bool) -> None:
    """Speaker identification on the shipped Shakespeare: each speech labelled with its
    speaker, split by speech (none in both parts); pretrain.txt is the text without the
    held-out speeches."""
    from zoo.training.speakers import speaker_set_lines

    echo(speaker_set_lines(Path(out), top, eval_fraction, seed, force))


@dataset.command("topics")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Folder for train.jsonl and eval.jsonl.")
@click.option("--eval-fraction", default=0.25, show_default=True,
              help="Share of each topic's sentences held out.")
@seed_option("Seed of the split.")
@force_option("an existing folder")
def dataset_topics(out: str, eval_fraction: float, seed: int, force: bool) -> None:
    """Topic classification: 400 short sentences shipped with the zoo, 100 on each of cooking,
    sport, weather and computing, split within each topic."""
    from zoo.training.topics import topic_set_lines

    echo(topic_set_lines(Path(out), eval_fraction, seed, force))


# --- exports --------------------------------------------------------------------------------

@main.command("export")
@click.argument("source", metavar="NAME|DIR")
@click.option("--onnx", "to_onnx", is_flag=True, help="Export to ONNX (the one format so far).")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Output folder [NAME-onnx].")
@click.option("--opset", default=18, show_default=True, help="ONNX opset (18 to 25).")
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True,
              help="ONNX Runtime provider for the parity check.")
@tolerance_options
@seed_option("Seed when building a card.")
@sets_option
@click.option("--optimize", is_flag=True,
              help="ONNX Runtime's transformer fusions; decoders also get model_kv.onnx, a "
                   "generation graph whose key/value cache is updated in place.")
@click.option("--quantize", type=click.Choice(["int8", "int4", "int8-dynamic"]),
              help="int8/int4: weight-only MatMul quantization, checked by top-1 agreement "
                   "with fp32; int8-dynamic (encoders, embedders, classifiers): int8 weights "
                   "and activations, checked by a quality gate (sentence cosine, label "
                   "agreement, MLM top-1) instead of the parity grid.")
@click.option("--calibration", type=click.Path(dir_okay=False), metavar="FILE",
              help="int8-dynamic: measure the activations to smooth on these texts (one a "
                   "line, or .jsonl / .csv with a 'text' column; 64 rows spread over the file) "
                   "instead of the shipped English text: text like the model's own use.")
@click.option("--attentions", is_flag=True,
              help="Also output every layer's attention maps (attentions.{i}, Hugging Face's "
                   "names); checked by the parity grid like every output.")
@click.option("--triton", "triton_repo", type=click.Path(file_okay=False), metavar="REPO",
              help="Also write a Triton model repository for the export (instances on "
                   "--provider's device; `zoo triton` has the other settings).")
@force_option()
@registry_option
def export_command(source: str, to_onnx: bool, out: str | None, opset: int, provider: str,
                   atol: float, rtol: float, seed: int, sets: tuple[str, ...], optimize: bool,
                   quantize: str | None, calibration: str | None, attentions: bool,
                   triton_repo: str | None, force: bool, registries: tuple[str, ...]) -> None:
    """Export a card or a built folder to ONNX, then prove parity with PyTorch.

    Files land in OUT only when onnx.checker and the parity grid (for --quantize: the agreement
    check) both passed.
    """
    if not to_onnx:
        raise ZooError("choose an export format: --onnx")
    from export.commands.exporting import export_command as run_export
    from export.options import ExportOptions

    options = ExportOptions(opset, provider, atol, rtol, force, optimize, quantize, attentions,
                            Path(calibration) if calibration else None)
    echo(run_export(source, Path(out or f"{Path(source).name}-onnx"), options, seed,
                    parse_overrides(sets) or None, registries,
                    Path(triton_repo) if triton_repo else None, progress))


@main.command()
@click.argument("folder", type=click.Path())
@provider_option
@tolerance_options
def parity(folder: str, provider: str, atol: float, rtol: float) -> None:
    """Check an exported FOLDER: PyTorch against ONNX Runtime on the shape grid (a quantized
    export: the agreement check against fp32 PyTorch instead)."""
    from export.commands.exporting import parity_command

    echo(parity_command(Path(folder), provider, atol, rtol))


@main.command("triton")
@click.argument("folder", metavar="OUT", type=click.Path())
@click.option("-o", "--out", "repository", required=True, type=click.Path(file_okay=False),
              help="The model repository to write.")
@click.option("--kind", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
              help="Where Triton runs the instances (KIND_CPU / KIND_GPU).")
@click.option("--instances", default=1, show_default=True, help="Instances per model.")
@click.option("--max-batch-size", default=8, show_default=True)
@click.option("--queue-delay-us", default=100, show_default=True,
              help="Dynamic batching: how long a request may wait for others (encoders).")
@force_option("an existing repository")
def triton_command(folder: str, repository: str, kind: str, instances: int,
                   max_batch_size: int, queue_delay_us: int, force: bool) -> None:
    """Write a Triton Inference Server model repository for an exported OUT folder: one model
    per graph, config.pbtxt generated from the graph's own inputs and outputs
    (docs/serving.md)."""
    from export.commands.exporting import triton_command as run_triton
    from export.serving.triton import TritonOptions

    preferred = tuple(size for size in (max_batch_size // 2, max_batch_size) if size > 0)
    options = TritonOptions(max_batch_size, preferred, queue_delay_us, kind, instances)
    echo(run_triton(Path(folder), Path(repository), options, force))


@main.command()
@click.argument("folder", type=click.Path())
@provider_option
@click.option("--ids", "id_lists", multiple=True,
              help="Comma-separated token ids; repeat for a (left-padded) batch.")
@click.option("--text", "texts", multiple=True,
              help="Text prompt (needs an export with a tokenizer); repeat for a batch.")
@click.option("--chat", "chats", multiple=True,
              help="A user's message, put in the export's chat template "
                   "(chat_template.jinja); prints the reply. Repeat for more.")
@click.option("--json", "as_json", is_flag=True,
              help="Classifiers and embedding models: print the raw numbers as JSON.")
@click.option("--max-new-tokens", default=32, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, help="0 = no limit.")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--beams", default=1, show_default=True, help="Beam search width.")
@seed_option("Sampling seed.")
@threads_option
def run(folder: str, provider: str, id_lists: tuple[str, ...], texts: tuple[str, ...],
        chats: tuple[str, ...], as_json: bool, max_new_tokens: int, temperature: float,
        top_k: int, top_p: float, beams: int, seed: int, threads: int | None) -> None:
    """Run an exported FOLDER with ONNX Runtime.

    Decoders and encoder-decoders generate from --ids and print the new ids; encoders print
    the pooled vector and the top predictions at masked positions. A model with a sentence
    vector (a card with pooling) prints each text's top labels (classifiers) or its vector's
    size and norm, and the texts' cosine similarities.
    """
    from export.commands.run import RunRequest, run_export
    from runtime.exported import GenerateOptions

    options = GenerateOptions(max_new_tokens, temperature, top_k, top_p, beams, seed)
    request = RunRequest(Path(folder), texts, tuple(parse_ids(i) for i in id_lists), chats,
                         as_json, options, provider, threads)
    echo(run_export(request, progress))


def rows_bar(done: int, total: int, rows_per_second: float) -> None:
    """`zoo embed` / `zoo classify`: rows done, on one updating line (a log: ~twenty lines)."""
    filled = int(20 * done / total)
    line = (f"rows {done:>{len(str(total))}}/{total} [{'#' * filled}{'.' * (20 - filled)}] "
            f"{rows_per_second:.1f} rows/s")
    tty = sys.stderr.isatty()
    if not tty and done != total and (20 * done // total) == (20 * (done - 1) // total):
        return
    click.echo(("\r" + line) if tty else line, err=True, nl=not tty or done == total)


def corpus_command(what: str) -> Any:
    """The options `zoo embed` and `zoo classify` share."""
    def decorate(command: Any) -> Any:
        for option in reversed([
                click.argument("folder", metavar="EXPORT", type=click.Path()),
                click.option("--data", type=click.Path(dir_okay=False), required=True,
                             help="One text a line, or .jsonl / .csv with a text column."),
                click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
                             help=f"The {what} file to write."),
                click.option("--column", default="text", show_default=True,
                             help="The JSONL field or CSV column holding the text."),
                click.option("--truncate", is_flag=True,
                             help="Cut rows past max_positions instead of refusing them."),
                click.option("--against", type=click.Path(), metavar="REFERENCE",
                             help="Run this export over the rows too (first), and print the "
                                  "two side by side: rows/s, cosine, labels."),
                provider_option, threads_option, force_option("an existing output file")]):
            command = option(command)
        return command
    return decorate


@main.command()
@corpus_command(".npy")
def embed(folder: str, data: str, out: str, column: str, truncate: bool, against: str | None,
          provider: str, threads: int | None, force: bool) -> None:
    """Every row's sentence vector, in row order, into a .npy file (rows x d, float32).

    Rows are batched by length; each row's vector is the one `zoo run --text` gives it.
    --against REFERENCE (the fp32 export beside an int8 one, say): every row's cosine to it.
    """
    from export.commands.corpus import CorpusRequest, embed_command

    echo(embed_command(CorpusRequest(Path(folder), Path(data), Path(out), column, truncate,
                                     force, provider, threads,
                                     Path(against) if against else None), rows_bar))


@main.command()
@corpus_command("JSONL")
@click.option("--label-column", metavar="COLUMN",
              help="The JSONL field or CSV column holding each row's true label: print the "
                   "accuracy (of --against's export too).")
def classify(folder: str, data: str, out: str, column: str, truncate: bool, against: str | None,
             provider: str, threads: int | None, force: bool, label_column: str | None) -> None:
    """Every row's label and class probabilities, in row order, one JSON object a line.

    --against REFERENCE: both exports side by side (rows/s, the same label, the largest change
    of a probability, the sentence vectors' cosine; with --label-column each one's accuracy).
    """
    from export.commands.corpus import CorpusRequest, classify_command

    echo(classify_command(CorpusRequest(Path(folder), Path(data), Path(out), column, truncate,
                                        force, provider, threads,
                                        Path(against) if against else None, label_column),
                          rows_bar))


@main.command("evaluate")
@click.argument("folder", metavar="OUT", type=click.Path())
@click.option("--data", type=click.Path(dir_okay=False),
              help="A classifier: labelled rows, JSONL or CSV of text, label (as for zoo train "
                   "--task classify).")
@click.option("--task", type=click.Choice(["reverse"]),
              help="An encoder-decoder: reverse = held-out runs of the shipped text's words.")
@click.option("--text", "text_file", type=click.Path(dir_okay=False),
              help="A decoder: perplexity on this UTF-8 text (use text it did not train on).")
@click.option("--window", type=int, help="--text: tokens per window [max_positions].")
@click.option("--count", default=200, show_default=True, help="--task: held-out inputs.")
@click.option("--beams", default=1, show_default=True, help="--task: beam search width.")
@provider_option
def evaluate_command(folder: str, data: str | None, task: str | None, text_file: str | None,
                     window: int | None, count: int, beams: int, provider: str) -> None:
    """Score an export OUT with ONNX Runtime: a classifier on labelled rows (--data), with the
    rows where its prediction equals PyTorch's; an encoder-decoder's exact-match accuracy on
    held-out inputs (--task reverse); or a decoder's perplexity on a text (--text)."""
    if sum(option is not None for option in (data, task, text_file)) != 1:
        raise ZooError("give one of --data FILE (a classifier), --task reverse (an "
                       "encoder-decoder) or --text FILE (a decoder)")
    from export.commands import evaluate

    if data is not None:
        echo(evaluate.evaluate_classifier(Path(folder), Path(data), provider))
    elif text_file is not None:
        echo(evaluate.evaluate_text(Path(folder), Path(text_file), window, provider, progress))
    else:
        echo(evaluate.evaluate_task(Path(folder), str(task), count, beams, provider))


@main.command()
@click.argument("source", metavar="NAME|DIR")
@provider_option
@click.option("--threads", type=int, help="Threads for ONNX Runtime and torch [all cores].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write every figure to this JSON file.")
@click.option("--repeats", default=10, show_default=True,
              help="Timed runs per figure (slow figures a third), after three warm-up runs.")
@click.option("--optimize/--no-optimize", default=True, show_default=True,
              help="When exporting NAME or a built folder: --optimize it.")
@click.option("--quantize", type=click.Choice(["int8", "int4", "int8-dynamic"]),
              help="When exporting NAME or a built folder: --quantize it.")
@click.option("--profile", is_flag=True, help="Add ONNX Runtime's per-operator times.")
@seed_option("Seed when building a card.")
@force_option("an existing --json file")
@registry_option
def bench(source: str, provider: str, threads: int | None, json_path: str | None,
          repeats: int, optimize: bool, quantize: str | None, profile: bool, seed: int,
          force: bool, registries: tuple[str, ...]) -> None:
    """Time PyTorch eager against ONNX Runtime on the same weights, scaled by the machine's
    own limits (one large matmul, a 1 GiB read) measured in the same run.

    NAME|DIR: a card or built folder (exported to a temporary folder first) or an export.
    """
    from export.bench.run import BenchOptions, bench_command

    options = BenchOptions(provider, threads, repeats, optimize, quantize, profile, seed)
    echo(bench_command(source, registries, options, Path(json_path) if json_path else None,
                       force, progress))


# --- pictures -------------------------------------------------------------------------------

@main.command()
@click.argument("source", metavar="NAME|DIR|OUT")
@click.option("--text", help="Text prompt (a folder with a tokenizer).")
@click.option("--ids", "id_list", help="Comma-separated token ids.")
@click.option("--layer", default="all", show_default=True, help="A layer index, or all.")
@click.option("--head", default="all", show_default=True, help="A head index, or all.")
@click.option("--engine", type=click.Choice(["torch", "onnx"]),
              help="[onnx for an export folder (made with --attentions), else torch]")
@click.option("--kind", help="encoder-decoder: encoder, decoder or cross [cross].")
@click.option("--generate", "new_tokens", type=int,
              help="Generate this many tokens first and show them too [0; 16 for the "
                   "encoder-decoder, whose target is generated].")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="The PNG to write.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the numbers drawn to this JSON file.")
@force_option("existing output files")
@registry_option
def attention(source: str, text: str | None, id_list: str | None, layer: str, head: str,
              engine: str | None, kind: str | None, new_tokens: int | None, out: str,
              json_path: str | None, force: bool, registries: tuple[str, ...]) -> None:
    """Draw the attention maps of one prompt: heads of a layer, or layers x heads, tokens on
    both axes (source tokens on the cross-attention's key axis)."""
    from export.inspect.attention import Request, attention_command

    request = Request(source, text, parse_ids(id_list) if id_list is not None else None,
                      engine, layer, head, kind, new_tokens, registries)
    echo(attention_command(request, Path(out), Path(json_path) if json_path else None, force))


@main.group()
def plot() -> None:
    """Draw the pictures that explain a Transformer into PNG files."""


@plot.command("positions")
@click.argument("source", metavar="NAME|DIR")
@png_out
@click.option("--positions", help="Draw the first N positions [all: max_positions].")
@force_option("an existing PNG")
@registry_option
def plot_positions_command(source: str, out: str, positions: str | None, force: bool,
                           registries: tuple[str, ...]) -> None:
    """The position table as a heatmap, position x dimension: sinusoids, a learned table, or
    rotary angles. NAME is built with seed 0; DIR is a built or trained model folder."""
    from zoo.plots.positions import plot_positions

    drawn = plot_positions(source, Path(out), force, registries,
                           parse_count("--positions", positions))
    click.echo(f"wrote {drawn.path}")


@plot.command("schedule")
@click.argument("name")
@png_out
@click.option("--warmup", "warmups", multiple=True,
              help="Warm-up steps, one curve each (repeatable) [zoo train's default].")
@click.option("--d-model", "d_models", multiple=True,
              help="noam only: d_model, one curve each (repeatable) [the card's].")
@click.option("--steps", help="Steps drawn (cosine: the run's length) [5 x the largest warm-up].")
@click.option("--schedule", type=click.Choice(["noam", "cosine"]),
              help="[as zoo train: noam for encoder-decoder, cosine otherwise]")
@click.option("--lr", type=float, help="cosine: peak rate [1e-3]; noam: factor [1.0].")
@force_option("an existing PNG")
@registry_option
def plot_schedule_command(name: str, out: str, warmups: tuple[str, ...],
                          d_models: tuple[str, ...], steps: str | None, schedule: str | None,
                          lr: float | None, force: bool, registries: tuple[str, ...]) -> None:
    """The learning rate against the step for card NAME, one curve per --warmup/--d-model."""
    from registry.catalog import open_catalog

    card = open_catalog(registries).get(name)
    from zoo.plots.schedule import plot_schedule

    drawn = plot_schedule(card, Path(out), force, schedule,
                          [parse_count("--warmup", w) for w in warmups],
                          [parse_count("--d-model", d) for d in d_models],
                          parse_count("--steps", steps), lr)
    click.echo(f"wrote {drawn.path}")


@plot.command("training")
@click.argument("folder", metavar="OUT", type=click.Path())
@png_out
@force_option("an existing PNG")
def plot_training_command(folder: str, out: str, force: bool) -> None:
    """Loss and learning rate against the step, from OUT/metrics.jsonl (written by zoo train)."""
    from zoo.plots.training import plot_training

    drawn = plot_training(Path(folder), Path(out), force)
    click.echo(f"wrote {drawn.path}")


if __name__ == "__main__":
    sys.exit(main())
