"""The `zoo` command line: parses, calls, prints, and maps errors to exit codes.

User errors (`ZooError`) print one line and exit 2. torch is imported only by the commands that
need it, so `zoo list` and `zoo show` answer at once.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
import yaml

from registry import Card, ZooError, count_parameters, open_catalog, total_parameters
from registry.errors import first_line
from registry.params import UnknownCount
from registry.paths import display_path

EXIT_USER_ERROR = 2
EXIT_FAULT = 1


class ZooGroup(click.Group):
    """Turns a ZooError anywhere below into one line on stderr and exit code 2 (1 for a
    FaultError, and for an OSError: a full disk, a read-only location); SIGTERM stops a
    command as Ctrl-C does, so its staged output is cleaned up on the way out."""

    def invoke(self, ctx: click.Context) -> Any:
        previous = _on_sigterm(_interrupt)
        try:
            return super().invoke(ctx)
        except ZooError as exc:
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
            problem = getattr(exc, "problem", None) or first_line(exc)
            raise ZooError(f"--set {pair!r}: value is not valid YAML: {problem}") from exc
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
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE",
              help="Override a card field (repeatable), as for build and export.")
@registry_option
def show(name: str, sets: tuple[str, ...], registries: tuple[str, ...]) -> None:
    """Show card NAME resolved, where each field came from, and its parameter count."""
    card = resolve_card(name, registries, parse_overrides(sets))
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
    from zoo.files.atomic import refuse_existing

    refuse_existing(target, force)  # before minutes of work, not after
    click.echo(f"building {card.name} (seed {seed})...", err=True)
    from zoo.build import build_model
    from zoo.files.weights import save_built

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
@click.option("--opset", default=18, show_default=True, help="ONNX opset (18 to 25).")
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True,
              help="ONNX Runtime provider for the parity check.")
@click.option("--atol", default=1e-4, show_default=True, help="Parity absolute tolerance.")
@click.option("--rtol", default=1e-3, show_default=True, help="Parity relative tolerance.")
@click.option("--seed", default=0, show_default=True, help="Seed when building a card.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="Override a field.")
@click.option("--optimize", is_flag=True,
              help="ONNX Runtime's transformer fusions; decoders also get model_kv.onnx, a "
                   "generation graph whose key/value cache is updated in place.")
@click.option("--quantize", type=click.Choice(["int8", "int4"]),
              help="Weight-only MatMul quantization; checked by top-1 agreement with fp32 "
                   "instead of the parity grid.")
@click.option("--attentions", is_flag=True,
              help="Also output every layer's attention maps (attentions.{i}, Hugging Face's "
                   "names); checked by the parity grid like every output.")
@click.option("--triton", "triton_repo", type=click.Path(file_okay=False), metavar="REPO",
              help="Also write a Triton model repository for the export (instances on "
                   "--provider's device; `zoo triton` has the other settings).")
@click.option("--force", is_flag=True, help="Overwrite an existing output folder.")
@registry_option
def export_command(source: str, to_onnx: bool, out: str | None, opset: int, provider: str,
                   atol: float, rtol: float, seed: int, sets: tuple[str, ...], optimize: bool,
                   quantize: str | None, attentions: bool, triton_repo: str | None, force: bool,
                   registries: tuple[str, ...]) -> None:
    """Export a card or a built folder to ONNX, then prove parity with PyTorch.

    Files land in OUT only when onnx.checker and the parity grid (for --quantize: the agreement
    check) both passed.
    """
    if not to_onnx:
        raise ZooError("choose an export format: --onnx")
    target = Path(out or f"{Path(source).name}-onnx")
    from zoo.files.atomic import check_writable, refuse_existing

    refuse_existing(target, force)
    if triton_repo:  # before the export lands: a repository that cannot be written fails first
        refuse_existing(Path(triton_repo), force)
        check_writable(Path(triton_repo))
    progress = lambda message: click.echo(message, err=True)  # noqa: E731
    from export.checks.agreement import AgreementError
    from export.checks.parity import ParityError
    from export.onnx.trace import check_opset
    from export.pipeline import export_and_verify
    from zoo.files.sources import load_source

    check_opset(opset)
    progress(f"loading {source}...")
    model, card = load_source(source, registries, seed, parse_overrides(sets) or None)
    try:
        folder = Path(source) if Path(source).is_dir() else None
        report = export_and_verify(model, card, target, opset, provider, atol, rtol, force,
                                   progress, folder, optimize, quantize, attentions)
    except (ParityError, AgreementError) as exc:
        click.echo(exc.report.table())
        raise
    click.echo(report.table())
    files = ", ".join(sorted(p.name for p in target.iterdir()))
    click.echo(f"wrote {target}/ ({files})")
    if triton_repo:
        from export.serving.triton import TritonOptions

        kind = "gpu" if provider == "cuda" else "cpu"
        write_triton(target, Path(triton_repo), TritonOptions(kind=kind), force)


def write_triton(export: Path, repository: Path, options: Any, force: bool) -> None:
    from export.serving.triton import write_repository

    for name, folder in write_repository(export, repository, options, force).items():
        click.echo(f"wrote {folder}/ (Triton model {name}: config.pbtxt, 1/model.onnx)")
    click.echo(f"serve: tritonserver --model-repository={repository.resolve()}")


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
@click.option("--force", is_flag=True, help="Overwrite an existing repository.")
def triton_command(folder: str, repository: str, kind: str, instances: int,
                   max_batch_size: int, queue_delay_us: int, force: bool) -> None:
    """Write a Triton Inference Server model repository for an exported OUT folder: one model
    per graph, config.pbtxt generated from the graph's own inputs and outputs
    (docs/serving.md)."""
    from export.serving.triton import TritonOptions

    preferred = tuple(size for size in (max_batch_size // 2, max_batch_size) if size > 0)
    options = TritonOptions(max_batch_size, preferred, queue_delay_us, kind, instances)
    write_triton(Path(folder), Path(repository), options, force)


@main.command()
@click.argument("folder", type=click.Path())
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True)
@click.option("--atol", default=1e-4, show_default=True, help="Absolute tolerance.")
@click.option("--rtol", default=1e-3, show_default=True, help="Relative tolerance.")
def parity(folder: str, provider: str, atol: float, rtol: float) -> None:
    """Check an exported FOLDER: PyTorch against ONNX Runtime on the shape grid (a quantized
    export: the agreement check against fp32 PyTorch instead)."""
    from export.checks.agreement import AgreementError
    from export.checks.parity import ParityError
    from export.checks.verify import verify
    from export.runtime.sessions import Runtime
    from zoo.files.weights import load_built

    runtime = Runtime(Path(folder), provider)  # verifies the manifest's sha256 first
    model, card = load_built(Path(folder))
    try:
        report = verify(model, card, runtime, atol, rtol)
    except (ParityError, AgreementError) as exc:
        click.echo(exc.report.table())
        raise
    click.echo(report.table())


def parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise ZooError(f"--ids {text!r}: expected comma-separated integers like 1,2,3") from exc


@main.command()
@click.argument("folder", type=click.Path())
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True)
@click.option("--ids", "id_lists", multiple=True,
              help="Comma-separated token ids; repeat for a (left-padded) batch.")
@click.option("--text", "texts", multiple=True,
              help="Text prompt (needs an export with a tokenizer); repeat for a batch.")
@click.option("--json", "as_json", is_flag=True,
              help="Classifiers and embedding models: print the raw numbers as JSON.")
@click.option("--max-new-tokens", default=32, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, help="0 = no limit.")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--beams", default=1, show_default=True, help="Beam search width.")
@click.option("--seed", default=0, show_default=True, help="Sampling seed.")
@click.option("--threads", type=int, help="ONNX Runtime CPU threads [all cores].")
def run(folder: str, provider: str, id_lists: tuple[str, ...], texts: tuple[str, ...],
        as_json: bool, max_new_tokens: int, temperature: float, top_k: int, top_p: float,
        beams: int, seed: int, threads: int | None) -> None:
    """Run an exported FOLDER with ONNX Runtime.

    Decoders and encoder-decoders generate from --ids and print the new ids; encoders print
    the pooled vector and the top predictions at masked positions. A model with a sentence
    vector (a card with pooling) prints each text's top labels (classifiers) or its vector's
    size and norm, and the texts' cosine similarities.
    """
    from export.runtime.prompts import check_ids, check_text
    from export.runtime.sampling import check_new_tokens

    check_new_tokens(max_new_tokens)  # before the folder is opened: bad options need no export
    texts = tuple(check_text(text) for text in texts)
    import numpy as np

    from export.families import family_of
    from export.runtime.encode import encode
    from export.runtime.generate import generate, left_padded
    from export.runtime.sampling import Sampling
    from export.runtime.sessions import Runtime
    from zoo.files.tokenizer import load_tokenizer

    if not texts and not id_lists:
        raise ZooError("give token ids with --ids 1,2,3 (or --text)")
    runtime = Runtime(Path(folder), provider, threads)
    tokenizer = load_tokenizer(Path(folder))
    if texts and tokenizer is None:
        raise ZooError(f"{folder}: this export has no tokenizer; pass token ids with --ids")
    prompts = ([tokenizer.encode(text) for text in texts] if texts
               else [parse_ids(i) for i in id_lists])
    if any(not prompt for prompt in prompts):
        raise ZooError("an empty prompt: every --text or --ids needs at least one token")
    check_ids(runtime.card, prompts, "--text" if texts else "--ids")
    if runtime.card["pooling"] is not None:
        show_sequences(runtime, prompts, list(texts) or list(id_lists), as_json)
        return
    if as_json:
        raise ZooError("--json is for classifiers and embedding models (cards with pooling)")
    if not family_of(runtime.card).generates:
        for prompt in prompts:
            pooled, predictions = encode(runtime, np.array(prompt))
            if pooled is not None:
                click.echo("pooled: " + " ".join(f"{value:.5f}" for value in pooled))
            for prediction in predictions:
                best = ", ".join(f"{token} ({probability:.3f})" for token, probability
                                 in zip(prediction.tokens, prediction.probabilities, strict=True))
                click.echo(f"masked position {prediction.position}: {best}")
        return
    ids, mask = left_padded(prompts, runtime.card["pad_token_id"])
    sampling = Sampling(temperature, top_k, top_p, seed, beams)
    eos = runtime.card["eos_token_id"]
    start = time.perf_counter()
    tokens = generate(runtime, ids, mask, max_new_tokens, sampling, eos)
    if len(prompts) > 1:  # a batch of users: what they got per second, together
        made = sum(list(row).index(eos) + 1 if eos in row else len(row) for row in tokens.tolist())
        seconds = time.perf_counter() - start
        click.echo(f"{len(prompts)} prompts: {made} new tokens (each up to its eos) in "
                   f"{seconds:.2f} s, {made / seconds:.1f} tokens/s aggregate", err=True)
    continues = family_of(runtime.card).continues_prompt  # a translation does not
    for index, row in enumerate(tokens):
        if texts:
            click.echo((texts[index] if continues else "") + tokenizer.decode(row.tolist()))
        else:
            click.echo(",".join(str(token) for token in row))


def show_sequences(runtime: Any, prompts: list[list[int]], inputs: list[str],
                   as_json: bool) -> None:
    """A classifier's top labels per text, or the vectors' size and norm; then, for two or
    more texts, the cosine-similarity matrix."""
    import json

    from export.runtime.classify import run_sequences

    result = run_sequences(runtime, prompts)
    if as_json:
        click.echo(json.dumps({"inputs": inputs, **result.to_json()}))
        return
    norms = result.norms()
    for row, shown in enumerate(inputs):
        click.echo(f"[{row}] {shown!r}")
        if result.probabilities is not None:
            click.echo("    " + ", ".join(f"{label} {p:.3f}" for label, p in result.top(row)))
        else:
            click.echo(f"    vector: {result.embeddings.shape[1]} dims, norm {norms[row]:.5f}")
    if len(prompts) > 1:
        click.echo("cosine similarity:")
        for row, values in enumerate(result.cosine()):
            click.echo(f"  [{row}] " + " ".join(f"{value:+.4f}" for value in values))


def progress_bar(step: int, total: int, loss: float, lr: float, tokens_per_second: float) -> None:
    filled = int(20 * step / total)
    line = (f"step {step:>{len(str(total))}}/{total} [{'#' * filled}{'.' * (20 - filled)}] "
            f"loss {loss:.4f}  lr {lr:.2e}  {tokens_per_second / 1000:.1f}k tok/s")
    tty = sys.stderr.isatty()
    if not tty and step % max(1, total // 20) and step != total:
        return  # a log file gets about twenty lines, a terminal one updating line
    click.echo(("\r" + line) if tty else line, err=True, nl=not tty or step == total)


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
@click.option("--seed", default=0, show_default=True, help="Initialisation and data seed.")
@click.option("--force", is_flag=True, help="Replace an existing OUT (starting afresh).")
@registry_option
def train(source: str, task: str, data: str | None, eval_file: str | None,
          eval_fraction: float | None, steps: int, batch_size: int, block_size: int,
          lr: float | None, schedule: str | None, warmup: int | None,
          label_smoothing: float | None,
          checkpoint_every: int, out: str | None, resume: bool, seed: int, force: bool,
          registries: tuple[str, ...]) -> None:
    """Train a card or a built folder; checkpoints land in OUT (safetensors + JSON).

    --task classify makes SOURCE a classifier for the labels in --data: the body's weights are
    kept, the new head initialised (OUT/init.json lists which), and OUT/eval.json holds the
    held-out scores. Under `torchrun --nproc_per_node N` the same command trains data-parallel.
    """
    from zoo.files.sources import load_source
    from zoo.training.train import TrainOptions
    from zoo.training.train import train as run_training

    target = Path(out or f"{Path(source).name}-trained")
    if task == "classify" and data is None:
        raise ZooError("--task classify needs --data FILE (JSONL or CSV of text, label)")
    if task != "classify" and (eval_file or eval_fraction is not None):
        raise ZooError("--eval and --eval-fraction are for --task classify")
    model, card = load_source(source, registries, seed)
    files: dict[str, bytes] = {}
    if task == "classify":
        import json

        from zoo.training.classify import INIT_RECORD, prepare_classifier

        model, card, record = prepare_classifier(model, card, Path(data), seed, source)
        files[INIT_RECORD] = (json.dumps(record, indent=1) + "\n").encode()
        click.echo(f"classifier: {card['num_labels']} labels, pooling {card['pooling']}; kept "
                   f"{len(record['kept'])} tensors of {source}, initialised "
                   f"{len(record['initialised'])}, dropped {len(record['dropped'])}", err=True)
    source_folder = Path(source) if Path(source).is_dir() else None
    options = TrainOptions(
        task=task, out=target, data=Path(data) if data else None, steps=steps,
        batch_size=batch_size, block_size=block_size, lr=lr, schedule=schedule, warmup=warmup,
        label_smoothing=label_smoothing, checkpoint_every=checkpoint_every, seed=seed,
        resume=resume, force=force, eval=Path(eval_file) if eval_file else None,
        eval_fraction=eval_fraction, tokenizer_folder=source_folder)
    result = run_training(model, card, options, progress_bar, evaluated=show_scores,
                          files=files)
    if result.get("rank", 0) == 0:
        losses = result["losses"]
        click.echo(f"trained {card.name} for {result['step']} steps: loss {losses[0]:.4f} -> "
                   f"{losses[-1]:.4f}; wrote {target}/")
        if "eval" in result:
            scores, baseline = result["eval"], result["eval"]["majority_baseline"]
            click.echo(f"held-out: accuracy {scores['accuracy']:.3f}, macro-F1 "
                       f"{scores['macro_f1']:.3f} on {scores['examples']} rows (majority "
                       f"baseline '{baseline['label']}': accuracy {baseline['accuracy']:.3f}, "
                       f"macro-F1 {baseline['macro_f1']:.3f}); wrote {target / 'eval.json'}")


def show_scores(step: int, scores: dict[str, Any]) -> None:
    click.echo(f"eval at step {step}: accuracy {scores['accuracy']:.3f}  macro-F1 "
               f"{scores['macro_f1']:.3f}", err=True)


@main.group()
def dataset() -> None:
    """Write demo datasets made from what ships."""


@dataset.command("speakers")
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Folder for train.jsonl, eval.jsonl and pretrain.txt.")
@click.option("--top", default=4, show_default=True, help="The most frequent speakers kept.")
@click.option("--eval-fraction", default=0.2, show_default=True,
              help="Share of the speeches held out.")
@click.option("--seed", default=0, show_default=True, help="Seed of the split.")
@click.option("--force", is_flag=True, help="Overwrite an existing folder.")
def dataset_speakers(out: str, top: int, eval_fraction: float, seed: int, force: bool) -> None:
    """Speaker identification on the shipped Shakespeare: each speech labelled with its
    speaker, split by speech (none in both parts); pretrain.txt is the text without the
    held-out speeches."""
    from zoo.training.speakers import write_speaker_set

    made = write_speaker_set(Path(out), top, eval_fraction, seed, force)
    counts = {name: sum(s.speaker == name for s in made.train) for name in made.classes}
    click.echo(f"wrote {out}/ (train.jsonl: {len(made.train)} speeches, eval.jsonl: "
               f"{len(made.eval)}, pretrain.txt); classes: "
               + ", ".join(f"{name} ({count})" for name, count in counts.items()))


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
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True)
def evaluate_command(folder: str, data: str | None, task: str | None, text_file: str | None,
                     window: int | None, count: int, beams: int, provider: str) -> None:
    """Score an export OUT with ONNX Runtime: a classifier on labelled rows (--data), with the
    rows where its prediction equals PyTorch's; an encoder-decoder's exact-match accuracy on
    held-out inputs (--task reverse); or a decoder's perplexity on a text (--text)."""
    if sum(option is not None for option in (data, task, text_file)) != 1:
        raise ZooError("give one of --data FILE (a classifier), --task reverse (an "
                       "encoder-decoder) or --text FILE (a decoder)")
    if data is not None:
        evaluate_classifier(folder, data, provider)
    elif text_file is not None:
        evaluate_text(folder, text_file, window, provider)
    else:
        evaluate_task(folder, task, count, beams, provider)


def evaluate_text(folder: str, text_file: str, window: int | None, provider: str) -> None:
    from export.checks.perplexity import score_text
    from export.families import family_of
    from export.runtime.sessions import Runtime
    from zoo.files.tokenizer import load_tokenizer
    from zoo.training.data import read_text_tokens

    runtime = Runtime(Path(folder), provider)
    family = family_of(runtime.card)
    if not (family.generates and family.continues_prompt):
        raise ZooError(f"{folder}: a {runtime.card.family} export; --text scores a decoder's "
                       "next-token predictions")
    tokenizer = load_tokenizer(Path(folder))
    if tokenizer is None:
        raise ZooError(f"{folder}: this export has no tokenizer to read the text with")
    ids = read_text_tokens(Path(text_file), tokenizer, 1).tolist()

    shown = [-1]

    def progress(done: int, total: int) -> None:  # about ten lines, whatever the length
        if 10 * done // total > shown[0]:
            shown[0] = 10 * done // total
            click.echo(f"perplexity: {done}/{total} windows", err=True)

    result = score_text(runtime, ids, window, progress)
    click.echo(f"{text_file}: perplexity {result.perplexity:.3f} ({result.nats_per_token:.4f} "
               f"nats/token, {result.predictions} predictions; ONNX Runtime)")


def evaluate_classifier(folder: str, data: str, provider: str) -> None:
    from export.runtime.classify import predictions
    from export.runtime.engines import TorchEngine
    from export.runtime.sessions import Runtime
    from zoo.files.tokenizer import load_tokenizer
    from zoo.files.weights import load_built
    from zoo.training.labelled import label_ids, read_rows
    from zoo.training.scores import scores

    runtime = Runtime(Path(folder), provider)
    card = runtime.card
    if not card["num_labels"]:
        raise ZooError(f"{folder}: not a classifier export (num_labels is 0)")
    tokenizer = load_tokenizer(Path(folder))
    if tokenizer is None:
        raise ZooError(f"{folder}: this export has no tokenizer to read the texts with")
    rows = read_rows(Path(data))
    truth = label_ids(rows, card["labels"], card["num_labels"])
    limit = card["max_positions"]
    prompts = [tokenizer.encode(example.text)[:limit] for example in rows.examples]
    onnx_says = predictions(runtime, prompts)
    torch_says = predictions(TorchEngine(*load_built(Path(folder))), prompts)
    names = card["labels"] or [str(i) for i in range(card["num_labels"])]
    result = scores(truth, onnx_says, names)
    same = sum(a == b for a, b in zip(onnx_says, torch_says, strict=True))
    click.echo(f"{len(truth)} rows: accuracy {result['accuracy']:.3f}, macro-F1 "
               f"{result['macro_f1']:.3f} (ONNX Runtime); the same prediction as PyTorch on "
               f"{same} of {len(truth)}")




def evaluate_task(folder: str, task: str, count: int, beams: int, provider: str) -> None:
    from export.checks.exact_match import exact_match
    from export.families import family_of
    from export.runtime.sessions import Runtime
    from zoo.files.tokenizer import load_tokenizer
    from zoo.training import reverse

    if count < 1:
        raise ZooError(f"--count {count}: should be >= 1")
    runtime = Runtime(Path(folder), provider)
    family = family_of(runtime.card)
    if not family.generates or family.continues_prompt:  # it needs source -> new target
        raise ZooError(f"{folder}: a {runtime.card.family} export; --task {task} evaluates "
                       "an encoder-decoder")
    try:
        pairs = reverse.held_out(runtime.card["vocab_size"], count)
    except ValueError as exc:
        raise ZooError(f"--count {count}: {exc}") from exc
    result = exact_match(runtime, pairs, beams)
    tokenizer = load_tokenizer(Path(folder))
    show = tokenizer.decode if tokenizer is not None else (lambda ids: ",".join(map(str, ids)))
    for source, target, output in result.examples:
        mark = "ok" if output == target else "wrong"
        click.echo(f"{show(source)!r} -> {show(output)!r} ({mark})")
    click.echo(f"exact match: {result.correct}/{result.total} = {result.accuracy:.1%} "
               "(held-out inputs)")


@main.command("import")
@click.argument("source", metavar="DIR", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Output folder (a built model).")
@click.option("--force", is_flag=True, help="Overwrite an existing output folder.")
def import_command(source: str, out: str, force: bool) -> None:
    """Import a Hugging Face GPT-2 or BERT folder (config.json + model.safetensors).

    Writes OUT/model.safetensors, config.yaml, source.json and tokenizer.json when DIR has one;
    OUT then works with `zoo export OUT --onnx`. Pickle checkpoints are never loaded.
    """
    from zoo.files.importers import import_checkpoint

    record = import_checkpoint(Path(source), Path(out), force)
    changed = " ".join(f"{key}={value}" for key, value in record["overrides"].items()
                       if key != "description")
    click.echo(f"imported {record['architecture']} as {record['extends']} with {changed}")
    if record["ignored"] or record["tied"]:
        click.echo(f"left out {len(record['ignored']) + len(record['tied'])} tensors "
                   "(buffers, tied copies, heads the zoo lacks; listed in source.json)")
    files = ", ".join(sorted(p.name for p in Path(out).iterdir()))
    click.echo(f"wrote {out}/ ({files})")


@main.command()
@click.argument("source", metavar="NAME|DIR")
@click.option("--provider", type=PROVIDER, default="cpu", show_default=True)
@click.option("--threads", type=int, help="Threads for ONNX Runtime and torch [all cores].")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write every figure to this JSON file.")
@click.option("--repeats", default=10, show_default=True,
              help="Timed runs per figure (slow figures a third), after three warm-up runs.")
@click.option("--optimize/--no-optimize", default=True, show_default=True,
              help="When exporting NAME or a built folder: --optimize it.")
@click.option("--quantize", type=click.Choice(["int8", "int4"]),
              help="When exporting NAME or a built folder: --quantize it.")
@click.option("--profile", is_flag=True, help="Add ONNX Runtime's per-operator times.")
@click.option("--seed", default=0, show_default=True, help="Seed when building a card.")
@click.option("--force", is_flag=True, help="Overwrite an existing --json file.")
@registry_option
def bench(source: str, provider: str, threads: int | None, json_path: str | None,
          repeats: int, optimize: bool, quantize: str | None, profile: bool, seed: int,
          force: bool, registries: tuple[str, ...]) -> None:
    """Time PyTorch eager against ONNX Runtime on the same weights, scaled by the machine's
    own limits (one large matmul, a 1 GiB read) measured in the same run.

    NAME|DIR: a card or built folder (exported to a temporary folder first) or an export.
    """
    from zoo.files.atomic import refuse_existing

    if json_path:
        refuse_existing(Path(json_path), force)  # before minutes of measuring, not after
    if repeats < 1 or (threads is not None and threads < 1):
        raise ZooError("--repeats and --threads should be >= 1")
    from export.bench.run import BenchOptions, render, run_bench, write_json

    options = BenchOptions(provider, threads, repeats, optimize, quantize, profile, seed)
    result = run_bench(source, registries, options,
                       lambda message: click.echo(message, err=True))
    click.echo(render(result))
    if json_path:
        write_json(result, Path(json_path), force)
        click.echo(f"wrote {json_path}")


png_out = click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
                       help="The PNG file to write.")
force_png = click.option("--force", is_flag=True, help="Overwrite an existing PNG.")


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
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@registry_option
def attention(source: str, text: str | None, id_list: str | None, layer: str, head: str,
              engine: str | None, kind: str | None, new_tokens: int | None, out: str,
              json_path: str | None, force: bool, registries: tuple[str, ...]) -> None:
    """Draw the attention maps of one prompt: heads of a layer, or layers x heads, tokens on
    both axes (source tokens on the cross-attention's key axis)."""
    from export.inspect.attention import Request, draw_attention

    request = Request(source, text, parse_ids(id_list) if id_list is not None else None,
                      engine, layer, head, kind, new_tokens, registries)
    looked, drawn = draw_attention(request, Path(out), Path(json_path) if json_path else None,
                                   force)
    width, height = drawn.size
    click.echo(f"wrote {out} ({looked.group.name}, {drawn.panels} panels, {width}x{height}, "
               f"{looked.engine})" + (f" and {json_path}" if json_path else ""))


def parse_count(option: str, text: str | None) -> int | None:
    """A whole number from the command line; parsed here so a bad one is one line, exit 2."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ZooError(f"{option} {text!r}: expected a whole number") from None


@main.group()
def plot() -> None:
    """Draw the pictures that explain a Transformer into PNG files."""


@plot.command("positions")
@click.argument("source", metavar="NAME|DIR")
@png_out
@click.option("--positions", help="Draw the first N positions [all: max_positions].")
@force_png
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
@force_png
@registry_option
def plot_schedule_command(name: str, out: str, warmups: tuple[str, ...],
                          d_models: tuple[str, ...], steps: str | None, schedule: str | None,
                          lr: float | None, force: bool, registries: tuple[str, ...]) -> None:
    """The learning rate against the step for card NAME, one curve per --warmup/--d-model."""
    card = resolve_card(name, registries, {})
    from zoo.plots.schedule import plot_schedule

    drawn = plot_schedule(card, Path(out), force, schedule,
                          [parse_count("--warmup", w) for w in warmups],
                          [parse_count("--d-model", d) for d in d_models],
                          parse_count("--steps", steps), lr)
    click.echo(f"wrote {drawn.path}")


@plot.command("training")
@click.argument("folder", metavar="OUT", type=click.Path())
@png_out
@force_png
def plot_training_command(folder: str, out: str, force: bool) -> None:
    """Loss and learning rate against the step, from OUT/metrics.jsonl (written by zoo train)."""
    from zoo.plots.training import plot_training

    drawn = plot_training(Path(folder), Path(out), force)
    click.echo(f"wrote {drawn.path}")


if __name__ == "__main__":
    sys.exit(main())
