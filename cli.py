"""The `zoo` command line: each command parses its options, calls one library function
(commands/, export/commands.py, zoo/commands.py, registry/listing.py, the plots), prints the
lines it returns, and leaves errors to ZooGroup (commands/shell.py): a ZooError is one line
and exit 2, a fault of the machine one line and exit 1. Most options are declared on the
options classes they fill (`@fields`); torch is imported only by the commands that need it, so
`zoo list` and `zoo show` answer at once.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from commands.printing import (
    echo,
    force_option,
    png_out,
    progress,
    registry_option,
    rows_bar,
    seed_option,
    sets_option,
    show_scores,
    train_bar,
)
from commands.shell import OptionsCommand, Parsed, ZooGroup, fields
from registry.errors import ZooError
from registry.options import whole_number


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

    echo(card_report(open_catalog(registries).get(name, dict(sets) or None)))


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
    from zoo.commands import build_command

    echo(build_command(name, Path(out or name), seed, dict(sets), registries, force,
                       progress))


@main.command("import")
@click.argument("source", metavar="DIR|FILE.gguf", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False),
              help="Output folder (a built model).")
@click.option("--adapter", type=click.Path(file_okay=False, path_type=Path),
              help="A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) "
              "for DIR: kept beside the base's weights; OUT loads and exports merged.")
@click.option("--image-size", type=Parsed(whole_number),
              help="An image model (a ViT): import it for images this many pixels a side, its "
              "learned patch positions interpolated bicubically (as transformers' "
              "interpolate_pos_encoding) and its processor's size rewritten.")
@force_option()
def import_command(source: str, out: str, force: bool, adapter: Path | None,
                  image_size: int | None) -> None:
    """Import a Hugging Face GPT-2, BERT, MarianMT, Llama, Mistral, Qwen2 or Qwen3 folder, a
    BertForSequenceClassification folder or a sentence-transformers folder (config.json +
    model.safetensors), or a Llama, Mistral, Qwen2 or Qwen3 GGUF file (dequantized to float32).

    Writes OUT/model.safetensors, config.yaml, source.json and the tokenizer files DIR has;
    OUT then works with `zoo export OUT --onnx`. Pickle checkpoints are never loaded. DIR may
    also be a sharded checkpoint of `zoo train --shard full` (OUT/checkpoints/step-N), which is
    consolidated into OUT a tensor at a time.
    """
    from zoo.commands import import_command as run_import

    echo(run_import(Path(source), Path(out), force, adapter, image_size))


@main.command()
@click.argument("source", metavar="NAME|DIR")
@fields("options", "zoo.training.tasks:TrainOptions",
        "task data eval eval_fraction steps batch_size block_size lr schedule warmup "
        "label_smoothing checkpoint_every out resume seed force lora lora_alpha lora_targets "
        "lora_dropout rslora shard mixed_precision")
@registry_option
def train(source: str, registries: tuple[str, ...], options: dict[str, Any]) -> None:
    """Train a card or a built folder; checkpoints land in OUT (safetensors + JSON).

    --task classify makes SOURCE a classifier for the labels in --data: the body's weights are
    kept, the new head initialised (OUT/init.json lists which), and OUT/eval.json holds the
    held-out scores. Under `torchrun --nproc_per_node N` the same command trains data-parallel;
    with --shard full, sharded with FSDP2 (docs/scaling.md).
    --lora R trains a LoRA adapter on the frozen base (OUT: the base's weights, the adapter in
    PEFT's layout beside them; a folder with one loads, and exports, merged).
    """
    from zoo.commands import train_command
    from zoo.training.tasks import TrainOptions

    options["out"] = options["out"] or Path(f"{Path(source).name}-trained")
    tokenizer_folder = Path(source) if Path(source).is_dir() else None
    echo(train_command(source, TrainOptions(**options, tokenizer_folder=tokenizer_folder),
                       registries, train_bar, show_scores, progress))


@main.group()
def dataset() -> None:
    """Write demo datasets made from what ships."""


@dataset.command("speakers", cls=OptionsCommand)
@fields("options", "zoo.training.speakers:SpeakerSetOptions")
def dataset_speakers(options: dict[str, Any]) -> None:
    """Speaker identification on the shipped Shakespeare: each speech labelled with its
    speaker, split by speech (none in both parts); pretrain.txt is the text without the
    held-out speeches."""
    from zoo.training.speakers import SpeakerSetOptions, speaker_set_lines

    echo(speaker_set_lines(SpeakerSetOptions(**options)))


@dataset.command("topics", cls=OptionsCommand)
@fields("options", "zoo.training.topics:TopicSetOptions")
def dataset_topics(options: dict[str, Any]) -> None:
    """Topic classification: 400 short sentences shipped with the zoo, 100 on each of cooking,
    sport, weather and computing, split within each topic."""
    from zoo.training.topics import TopicSetOptions, topic_set_lines

    echo(topic_set_lines(TopicSetOptions(**options)))


@dataset.command("cities", cls=OptionsCommand)
@fields("options", "zoo.training.cities:CitySetOptions")
def dataset_cities(options: dict[str, Any]) -> None:
    """A chat set for LoRA: describe a shipped city, answered as exactly {"city": ...,
    "country": ...}; the held-out cities are never trained on."""
    from zoo.training.cities import CitySetOptions, city_set_lines

    echo(city_set_lines(CitySetOptions(**options)))


# --- exports --------------------------------------------------------------------------------

EXPORT = "export.options:ExportOptions"


@main.command("export")
@click.argument("source", metavar="NAME|DIR")
@click.option("--onnx", "to_onnx", is_flag=True, help="Export to ONNX (the one format so far).")
@click.option("-o", "--out", type=click.Path(file_okay=False), help="Output folder [NAME-onnx].")
@fields("options", EXPORT, "opset provider atol rtol")
@seed_option("Seed when building a card.")
@sets_option
@fields("options", EXPORT, "optimize quantize dtype calibration attentions adapters")
@click.option("--triton", "triton_repo", type=click.Path(file_okay=False), metavar="REPO",
              help="Also write a Triton model repository for the export (instances on "
                   "--provider's device; `zoo triton` has the other settings).")
@fields("options", EXPORT, "force")
@registry_option
def export_command(source: str, to_onnx: bool, out: str | None, seed: int, sets: tuple[str, ...],
                   triton_repo: str | None, registries: tuple[str, ...],
                   options: dict[str, Any]) -> None:
    """Export a card or a built folder to ONNX, then prove parity with PyTorch.

    Files land in OUT only when onnx.checker and the parity grid (for --quantize: the agreement
    check) both passed.
    """
    if not to_onnx:
        raise ZooError("choose an export format: --onnx")
    from export.commands import export_command as run_export
    from export.options import ExportOptions

    echo(run_export(source, Path(out or f"{Path(source).name}-onnx"), ExportOptions(**options),
                    seed, dict(sets) or None, registries,
                    Path(triton_repo) if triton_repo else None, progress))


@main.command()
@click.argument("folder", type=click.Path())
@fields("options", EXPORT, "provider atol rtol", provider="ONNX Runtime's execution provider.")
def parity(folder: str, options: dict[str, Any]) -> None:
    """Check an exported FOLDER: PyTorch against ONNX Runtime on the shape grid (a quantized
    export: the agreement check against fp32 PyTorch instead)."""
    from export.commands import parity_command

    echo(parity_command(Path(folder), **options))


@main.command("triton")
@click.argument("folder", metavar="OUT", type=click.Path())
@click.option("-o", "--out", "repository", required=True, type=click.Path(file_okay=False),
              help="The model repository to write.")
@fields("options", "export.targets.triton:TritonOptions",
        "kind instances max_batch_size queue_delay_us")
@force_option("an existing repository")
def triton_command(folder: str, repository: str, force: bool, options: dict[str, Any]) -> None:
    """Write a Triton Inference Server model repository for an exported OUT folder: one model
    per graph, config.pbtxt generated from the graph's own inputs and outputs
    (docs/serving.md)."""
    from export.commands import triton_command as run_triton
    from export.targets.triton import TritonOptions

    largest = options["max_batch_size"]
    preferred = tuple(size for size in (largest // 2, largest) if size > 0)
    echo(run_triton(Path(folder), Path(repository),
                    TritonOptions(**options, preferred_batch_sizes=preferred), force))


RUN = "commands.run:RunRequest"


@main.command()
@click.argument("folder", type=click.Path())
@fields("request", RUN, "provider id_lists texts chats images labels template audio "
        "response_format as_json")
@fields("options", "runtime.exported:GenerateOptions")
@fields("transcription", "runtime.transcribe:TranscribeOptions")
@fields("request", RUN, "threads")
def run(folder: str, request: dict[str, Any], options: dict[str, Any],
        transcription: dict[str, Any]) -> None:
    """Run an exported FOLDER with ONNX Runtime.

    Decoders and encoder-decoders generate from --ids and print the new ids; encoders print
    the pooled vector and the top predictions at masked positions. A model with a sentence
    vector (a card with pooling) prints each text's top labels (classifiers) or its vector's
    size and norm, and the texts' cosine similarities. An image model's export (a ViT) prints
    each --image's top labels; a CLIP or SigLIP export each --image's scores for --labels.
    A speech model's export (Whisper) prints --audio's transcript (--format: text, json,
    verbose_json, srt, vtt).
    """
    from commands.run import RunRequest, run_export
    from runtime.exported import GenerateOptions
    from runtime.transcribe import TranscribeOptions

    echo(run_export(RunRequest(Path(folder), **request, options=GenerateOptions(**options),
                               transcription=TranscribeOptions(**transcription)), progress))


CORPUS = "commands.corpus:CorpusRequest"
CORPUS_OPTIONS = "data out column truncate against provider threads force"


@main.command()
@click.argument("folder", metavar="EXPORT", type=click.Path())
@fields("request", CORPUS, CORPUS_OPTIONS + " images", out="The .npy file to write.")
def embed(folder: str, request: dict[str, Any]) -> None:
    """Every row's sentence vector, in row order, into a .npy file (rows x d, float32).

    Rows are batched by length; each row's vector is the one `zoo run --text` gives it.
    --against REFERENCE (the fp32 export beside an int8 one, say): every row's cosine to it.
    A CLIP or SigLIP export: --data's texts or --images' files, unit vectors in one space.
    """
    from commands.corpus import CorpusRequest, embed_command

    echo(embed_command(CorpusRequest(Path(folder), **request), rows_bar))


@main.command()
@click.argument("folder", metavar="EXPORT", type=click.Path())
@fields("request", CORPUS, CORPUS_OPTIONS + " label_column", out="The JSONL file to write.")
def classify(folder: str, request: dict[str, Any]) -> None:
    """Every row's label and class probabilities, in row order, one JSON object a line.

    --against REFERENCE: both exports side by side (rows/s, the same label, the largest change
    of a probability, the sentence vectors' cosine; with --label-column each one's accuracy).
    """
    from commands.corpus import CorpusRequest, classify_command

    echo(classify_command(CorpusRequest(Path(folder), **request), rows_bar))


@main.command()
@click.argument("folders", metavar="OUT...", nargs=-1, required=True, type=click.Path())
@fields("options", "runtime.serve.options:ServeOptions")
def serve(folders: tuple[str, ...], options: dict[str, Any]) -> None:
    """Serve exports over an OpenAI-compatible HTTP API (docs: runtime/serve/app.py)."""
    from runtime.serve.options import ServeOptions
    from runtime.serve.server import serve_exports

    serve_exports([Path(folder) for folder in folders], ServeOptions(**options), progress)


@main.command("evaluate")
@click.argument("folder", metavar="OUT", type=click.Path())
@fields("options", "commands.evaluate:EvaluateOptions")
def evaluate_command(folder: str, options: dict[str, Any]) -> None:
    """Score an export OUT with ONNX Runtime: a classifier on labelled rows (--data), with the
    rows where its prediction equals PyTorch's; an encoder-decoder's exact-match accuracy on
    held-out inputs (--task reverse); a decoder's perplexity on a text (--text); or a chat
    model's greedy replies to conversations, by exact match (--chat)."""
    from commands.evaluate import EvaluateOptions, evaluate

    echo(evaluate(Path(folder), EvaluateOptions(**options), progress))


BENCH = "export.bench.run:BenchOptions"


@main.command()
@click.argument("source", metavar="NAME|DIR")
@fields("options", BENCH, "provider threads")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write every figure to this JSON file.")
@fields("options", BENCH, "repeats optimize quantize dtype profile seed")
@force_option("an existing --json file")
@registry_option
def bench(source: str, json_path: str | None, force: bool, registries: tuple[str, ...],
          options: dict[str, Any]) -> None:
    """Time PyTorch eager against ONNX Runtime on the same weights, scaled by the machine's
    own limits (one large matmul, a 1 GiB read) measured in the same run.

    NAME|DIR: a card or built folder (exported to a temporary folder first) or an export.
    """
    from export.bench.run import BenchOptions, bench_command

    echo(bench_command(source, registries, BenchOptions(**options),
                       Path(json_path) if json_path else None, force, progress))


# --- pictures -------------------------------------------------------------------------------

@main.command()
@click.argument("source", metavar="NAME|DIR|OUT")
@fields("request", "export.inspect.attention:Request",
        "text ids image layer head engine kind generate")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False),
              help="The PNG to write.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write the numbers drawn to this JSON file.")
@force_option("existing output files")
@registry_option
def attention(source: str, out: str, json_path: str | None, force: bool,
              registries: tuple[str, ...], request: dict[str, Any]) -> None:
    """Draw the attention maps of one prompt in an about-square grid: heads of a layer, or
    layers x heads, tokens on both axes (source tokens on the cross-attention's key axis)."""
    from export.inspect.attention import Request, attention_command

    echo(attention_command(Request(source, **request, registries=registries), Path(out),
                           Path(json_path) if json_path else None, force))


@main.group()
def plot() -> None:
    """Draw the pictures that explain a Transformer into PNG files."""


@plot.command("positions")
@click.argument("source", metavar="NAME|DIR")
@png_out
@click.option("--positions", type=Parsed(whole_number),
              help="Draw the first N positions [all: max_positions].")
@force_option("an existing PNG")
@registry_option
def plot_positions_command(source: str, out: str, positions: int | None, force: bool,
                           registries: tuple[str, ...]) -> None:
    """The position table as a heatmap, position x dimension: sinusoids, a learned table, or
    rotary angles. NAME is built with seed 0; DIR is a built or trained model folder."""
    from zoo.plots.positions import plot_positions

    drawn = plot_positions(source, Path(out), force, registries, positions)
    click.echo(f"wrote {drawn.path}")


@plot.command("schedule", cls=OptionsCommand)
@click.argument("name")
@png_out
@click.option("--warmup", "warmups", multiple=True, type=Parsed(whole_number),
              help="Warm-up steps, one curve each (repeatable) [zoo train's default].")
@click.option("--d-model", "d_models", multiple=True, type=Parsed(whole_number),
              help="noam only: d_model, one curve each (repeatable) [the card's].")
@click.option("--steps", type=Parsed(whole_number),
              help="Steps drawn (cosine: the run's length) [5 x the largest warm-up].")
@fields("options", "zoo.training.tasks:TrainOptions", "schedule lr",
        schedule="[as zoo train: noam for encoder-decoder, cosine otherwise]")
@force_option("an existing PNG")
@registry_option
def plot_schedule_command(name: str, out: str, warmups: tuple[int, ...],
                          d_models: tuple[int, ...], steps: int | None, force: bool,
                          registries: tuple[str, ...], options: dict[str, Any]) -> None:
    """The learning rate against the step for card NAME, one curve per --warmup/--d-model."""
    from registry.catalog import open_catalog
    from zoo.plots.schedule import plot_schedule

    drawn = plot_schedule(open_catalog(registries).get(name), Path(out), force,
                          options["schedule"], list(warmups), list(d_models), steps,
                          options["lr"])
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
