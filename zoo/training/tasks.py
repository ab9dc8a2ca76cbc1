"""What `zoo train` is asked (TrainOptions) and the tasks it runs, one class a task: which
families it trains, its default schedule and label smoothing, what it needs of the card, and
how it makes a step's batch, computes the loss, names the files OUT gets and scores held-out
rows. The loop (train.py) only calls through them; `TASKS` is the one table of them."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from registry.catalog import Card
from registry.errors import ZooError
from registry.options import option
from registry.paths import display_path
from registry.stems import is_mel_card, is_patch_card, num_patches
from runtime.files import images as image_files
from runtime.files.conversations import ChatRenderer, chat_files
from runtime.files.tokenizer import BYTE_TOKENIZER, WORD_TOKENIZER, ByteTokenizer, tokenizer_files
from runtime.scores import majority_baseline, scores
from zoo.blocks import lora as lora_blocks
from zoo.training import chat, classify, data, image_folders, images, reverse
from zoo.training.schedules import SCHEDULES
from zoo.training.sharding import MIXED_PRECISION, SHARD_MODES


@dataclass
class TrainOptions:
    task: str = option(help="lm: decoder on text; mlm: encoder on text; copy: encoder-decoder, "
                       "synthetic; reverse: encoder-decoder, the shipped text's words in reverse "
                       "order; classify: a classifier (encoder or decoder) on labelled text; "
                       "chat: a decoder on conversations in its chat template, the loss on the "
                       "assistant's tokens.",
                       choices=lambda: TASKS)
    out: Path = option(help="Output folder [NAME-trained].", flags=("-o", "--out"), path="dir",
                       required=False)
    data: Path | None = option(None, "lm/mlm: UTF-8 text [the shipped Shakespeare]; classify: "
                               'JSONL ({"text": ..., "label": ...} a line) or CSV with a '
                               "text,label header, or for an image model a folder with a "
                               "subfolder of images per label [the 8x8 digits]; chat: JSONL "
                               '({"messages": [{"role": ..., "content": ...}, ...]} a line).')
    steps: int = option(300, "Total optimizer steps.")
    batch_size: int = option(32)
    block_size: int = option(128, "Tokens per sequence.")  # capped at the card's max_positions
    lr: float | None = option(None, "cosine: peak rate [1e-3]; noam: factor [1.0].")
    schedule: str | None = option(None, "[noam for encoder-decoder, cosine otherwise]",
                                  choices=SCHEDULES)
    warmup: int | None = option(None, "Warm-up steps [400 for noam, 100 for cosine].")
    label_smoothing: float | None = option(None, "[0.1 for encoder-decoder, else 0]")
    clip: float = 1.0
    checkpoint_every: int = option(100)
    seed: int = option(0, "Initialisation and data seed.")
    resume: bool = option(False, "Continue from OUT's last checkpoint.")
    force: bool = option(False, "Replace an existing OUT (starting afresh).")
    copy_length: int = 10
    copy_symbols: int = 10
    eval: Path | None = option(None, "classify, chat: held-out rows (same format), scored at "
                               "each checkpoint (accuracy and macro-F1; chat: the loss).",
                               path="file")
    eval_fraction: float | None = option(
        None, "classify, chat: hold out this share of --data instead (split with --seed).")
    lora: int | None = option(None, "Train a LoRA adapter of this rank on the frozen base: "
                              "only the adapters train; OUT keeps the base's weights and the "
                              "adapter in PEFT's layout (adapter_config.json, "
                              "adapter_model.safetensors).", metavar="R")
    lora_alpha: float = option(lora_blocks.DEFAULT_ALPHA, "--lora: the update is scaled by "
                               "alpha / R (PEFT's default alpha).")
    lora_targets: str = option(",".join(lora_blocks.DEFAULT_TARGETS), "--lora: the linears that "
                               "get an adapter, comma-separated, by the zoo's names: "
                               f"{', '.join(lora_blocks.TARGETS)} (experts left out; the "
                               "default is PEFT's for Llama, q_proj and v_proj).")
    lora_dropout: float = option(0.0, "--lora: dropout on the adapter's input, as PEFT's.")
    rslora: bool = option(False, "--lora: rsLoRA, the update scaled by alpha / sqrt(R).")
    shard: str = option("none", "full: FSDP2 under torchrun, each layer's parameters, gradients "
                        "and Adam state sharded across the ranks, checkpoints sharded (DCP); "
                        "none: every rank holds the whole model (DDP).", choices=SHARD_MODES)
    mixed_precision: str = option("none", "--shard full: bf16 computes in bfloat16 (float32 "
                                  "master weights and gradient reduction), where the device "
                                  "has bfloat16 arithmetic.", choices=MIXED_PRECISION)
    tokenizer_folder: Path | None = None  # classify, chat: the tokenizer's folder (SOURCE)

    def check(self) -> None:
        """Refuse, in one line, options that do not go together (before any card is read)."""
        if self.task == "chat" and self.data is None:
            raise ZooError('--task chat needs --data FILE (JSONL of {"messages": [...]})')
        if self.data is not None and self.data.is_dir() and self.task != "classify":
            raise ZooError(f"--data {display_path(self.data)} is a folder: a folder of images "
                           "per label is for --task classify on an image model")
        if self.task not in ("classify", "chat") and (self.eval or
                                                      self.eval_fraction is not None):
            raise ZooError("--eval and --eval-fraction are for --task classify and chat")
        if self.steps < 1 or self.batch_size < 1:
            raise ZooError("--steps and --batch-size should be >= 1")
        if self.shard == "none" and self.mixed_precision != "none":
            raise ZooError("--mixed-precision is FSDP's: use it with --shard full")
        if self.shard == "full" and (self.eval or self.eval_fraction is not None):
            raise ZooError("--shard full: held-out scoring (--eval, --eval-fraction) runs on "
                           "rank 0 alone, which a sharded model cannot (score OUT "
                           "afterwards)")
        if self.lora is None:
            return
        if self.task == "classify":
            raise ZooError("--lora trains adapters on a frozen base: --task classify's new "
                           "head would stay untrained")
        if not self.lora_alpha > 0 or not 0 <= self.lora_dropout < 1:
            raise ZooError("--lora-alpha should be > 0 and --lora-dropout in [0, 1)")

    def targets(self) -> list[str]:
        """--lora-targets' names."""
        return [name.strip() for name in self.lora_targets.split(",") if name.strip()]

    def resolved(self, card: Card) -> TrainOptions:
        task = TASKS[self.task]
        schedule = self.schedule or task.schedule
        return TrainOptions(**{
            **asdict(self),
            "schedule": schedule,
            "lr": self.lr if self.lr is not None else (1.0 if schedule == "noam" else 1e-3),
            "warmup": self.warmup or (400 if schedule == "noam" else 100),
            "label_smoothing": self.label_smoothing if self.label_smoothing is not None
            else task.label_smoothing,
            "block_size": min(self.block_size, card["max_positions"]),
        })


class TrainingTask:
    """One run of a task on a card: made once the options are checked and resolved."""

    trains: tuple[str, ...] = ()  # the families it trains
    logged: tuple[str, ...] = ()  # the held-out scores metrics.jsonl gets, as eval_<name>
    schedule = "cosine"
    label_smoothing = 0.0

    def __init__(self, card: Card, options: TrainOptions) -> None:
        self.card, self.options = card, options

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        """Refuse, in one line, a card or options the task cannot train (before any data)."""

    def batch(self, step: int, rank: int) -> data.Batch:
        return self.make_batch(data.batch_generator(self.options.seed, step, rank))

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        raise NotImplementedError

    def logits(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        """Cross-entropy over every labelled position, label-smoothed as the options say."""
        logits = self.logits(model, batch)
        return F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(),
                               ignore_index=data.IGNORE,
                               label_smoothing=self.options.label_smoothing)

    def files(self) -> dict[str, bytes]:
        """What OUT gets at the start besides config.yaml: the tokenizer."""
        return {}

    def evaluate(self, model: nn.Module) -> dict[str, Any] | None:
        """Scores on held-out rows, where the task has them."""
        return None


class TextTask(TrainingTask):
    """lm and mlm: blocks of a UTF-8 text's bytes."""

    def __init__(self, card: Card, options: TrainOptions) -> None:
        super().__init__(card, options)
        self.ids = data.read_text_tokens(options.data or data.SHIPPED_TEXT, ByteTokenizer(),
                                         options.block_size + 1)

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        if card["vocab_size"] < ByteTokenizer().vocab_size:
            raise ZooError(f"{card.name}: vocab_size={card['vocab_size']} is too small for the "
                           f"byte tokenizer (needs {ByteTokenizer().vocab_size})")

    def files(self) -> dict[str, bytes]:
        return {BYTE_TOKENIZER: ByteTokenizer().to_json().encode()}


class LanguageModelling(TextTask):
    trains = ("decoder",)

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        o = self.options
        return data.lm_batch(self.ids, o.batch_size, o.block_size, generator)

    def logits(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        return model(batch.inputs["input_ids"])[0]


class MaskedLanguageModelling(TextTask):
    trains = ("encoder",)

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        super().check(card, options)
        if card["mask_token_id"] is None:
            raise ZooError(f"{card.name}: --task mlm needs mask_token_id in the card")

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        o, c = self.options, self.card
        return data.mlm_batch(self.ids, o.batch_size, o.block_size, generator,
                              c["mask_token_id"], c["vocab_size"])

    def logits(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        return model(batch.inputs["input_ids"])["logits"]


class SequenceToSequence(TrainingTask):
    """The encoder-decoder's tasks, with the paper's schedule."""

    trains = ("encoder-decoder",)
    schedule = "noam"

    def eos(self) -> int:
        return self.card["eos_token_id"] if self.card["eos_token_id"] is not None else 2

    def logits(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        return model(batch.inputs["input_ids"], batch.inputs["decoder_input_ids"],
                     batch.inputs.get("attention_mask"))


class Copy(SequenceToSequence):
    """The Annotated Transformer's synthetic copy task."""

    label_smoothing = 0.1  # copy: Vaswani et al. 2017, section 5.4

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        if options.copy_length + 1 > card["max_positions"]:
            raise ZooError(f"copy length {options.copy_length} exceeds max_positions")
        if 3 + options.copy_symbols > card["vocab_size"]:
            raise ZooError(f"{card.name}: vocab_size={card['vocab_size']} is too small for "
                           f"{options.copy_symbols} copy symbols")

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        o = self.options
        return data.copy_batch(o.batch_size, o.copy_length, o.copy_symbols,
                               self.card["bos_token_id"], self.eos(), generator)


class Reverse(SequenceToSequence):
    """Runs of the shipped text's words, to be written in reverse order (reverse.py)."""

    label_smoothing = 0.1  # reverse: Vaswani et al. 2017, section 5.4

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        if reverse.LONGEST + 1 > card["max_positions"] or card["vocab_size"] < 16:
            raise ZooError(f"{card.name}: --task reverse needs max_positions >= "
                           f"{reverse.LONGEST + 1} and vocab_size >= 16")

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        c = self.card
        inputs, labels = reverse.reverse_batch(c["vocab_size"], self.options.batch_size,
                                               c["bos_token_id"], self.eos(),
                                               c["pad_token_id"], generator)
        return data.Batch(inputs, labels, int(inputs["attention_mask"].sum()) * 2)

    def files(self) -> dict[str, bytes]:  # so `zoo run OUT --text "..."` reverses words
        return {WORD_TOKENIZER: reverse.vocabulary(self.card["vocab_size"]).to_json().encode()}


class Classify(TrainingTask):
    """A classifier (encoder or decoder with pooling) on labelled text (classify.py)."""

    trains = ("encoder", "decoder")
    logged = ("accuracy", "macro_f1")

    def __init__(self, card: Card, options: TrainOptions) -> None:
        super().__init__(card, options)
        self.tokenizer = classify.text_tokenizer(options.tokenizer_folder)
        assert options.data is not None  # check() refused it otherwise
        self.labelled = classify.ClassifyData.read(
            card, self.tokenizer, options.data, options.eval, options.eval_fraction,
            options.seed, options.block_size)

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        if is_patch_card(card):  # an image model: the digits (zoo/training/images.py)
            return
        if options.data is None:
            raise ZooError("--task classify needs --data FILE (JSONL or CSV of text, label)")
        refuse_folder(card, options.data)
        if not card["num_labels"]:
            raise ZooError("--task classify needs --data FILE (labelled rows) and a classifier "
                           "card (zoo.training.classify.prepare_classifier makes one)")

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        rows = self.labelled.train
        chosen = torch.randint(0, len(rows.ids), (self.options.batch_size,),
                               generator=generator).tolist()
        ids, mask = classify.padded([rows.ids[i] for i in chosen], self.card["pad_token_id"])
        labels = torch.tensor([rows.labels[i] for i in chosen])
        return data.Batch({"input_ids": ids, "attention_mask": mask}, labels, int(mask.sum()))

    def loss(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        logits = model(batch.inputs["input_ids"], batch.inputs["attention_mask"])["logits"]
        return F.cross_entropy(logits, batch.labels, label_smoothing=self.options.label_smoothing)

    def files(self) -> dict[str, bytes]:
        return _folder_tokenizer(self.options.tokenizer_folder) or \
            {BYTE_TOKENIZER: ByteTokenizer().to_json().encode()}

    def evaluate(self, model: nn.Module) -> dict[str, Any] | None:
        if self.labelled.eval is None:
            return None
        return classify.evaluate(model, self.labelled, self.card["pad_token_id"])


def refuse_folder(card: Card, data: Path) -> None:
    """A text classifier's --data is a file: a folder (of images per label) refused."""
    if data.is_dir():
        raise ZooError(f"--data {display_path(data)} is a folder: {card.name} reads text; "
                       "give a JSONL or CSV file of text, label")


class ImageClassify(TrainingTask):
    """`--task classify` on an image model: the digits as images (zoo/training/images.py)."""

    trains = Classify.trains
    logged = Classify.logged

    def __init__(self, card: Card, options: TrainOptions) -> None:
        images.check_options(card, options)
        super().__init__(card, options)
        if options.data is None:
            self.train_split, self.held = images.split_digits(card, options.eval_fraction,
                                                               options.seed)
        else:  # a folder per label; the card names its labels (zoo/commands.py made it so)
            self.train_split, self.held = image_folders.split_folder(
                card, options.data, options.eval_fraction, options.seed)
        self.labels = list(card["labels"])
        self.tokens_per_image = num_patches(card) + 1  # and the class token

    def batch(self, step: int, rank: int) -> data.Batch:
        generator = data.batch_generator(self.options.seed, step, rank)
        chosen = torch.randint(0, len(self.train_split.labels), (self.options.batch_size,),
                               generator=generator)
        return data.Batch({"pixel_values": self.train_split.pixels[chosen]},
                          self.train_split.labels[chosen],
                          len(chosen) * self.tokens_per_image)

    def loss(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        logits = model(batch.inputs["pixel_values"])["logits"]
        return F.cross_entropy(logits, batch.labels, label_smoothing=self.options.label_smoothing)

    def files(self) -> dict[str, bytes]:
        """The preprocessing it was trained with, so its export runs image files the same way."""
        config = image_files.default_config(self.card["image_size"])
        return {image_files.PREPROCESSOR_CONFIG: (json.dumps(config, indent=2) + "\n").encode()}

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        truth = self.held.labels.tolist()
        return {**scores(truth, images.predict(model, self.held.pixels), self.labels),
                "majority_baseline": majority_baseline(self.train_split.labels.tolist(), truth,
                                                       self.labels)}


class Chat(TrainingTask):
    """Supervised fine-tuning on conversations in the model's chat template (chat.py)."""

    trains = ("decoder",)
    logged = ("loss",)

    def __init__(self, card: Card, options: TrainOptions) -> None:
        super().__init__(card, options)
        assert options.data is not None and options.tokenizer_folder is not None  # check()
        renderer = ChatRenderer(*chat_files(options.tokenizer_folder), card["bos_token_id"],
                                card["eos_token_id"])
        self.pad = card["pad_token_id"] if card["pad_token_id"] is not None \
            else card["eos_token_id"]  # right padding: never attended to, never a label
        self.rows = chat.ChatData.read(renderer, options.data, options.eval,
                                       options.eval_fraction, options.seed, options.block_size)

    @classmethod
    def check(cls, card: Card, options: TrainOptions) -> None:
        folder = options.tokenizer_folder
        if folder is None:
            raise ZooError(f"{card.name}: --task chat trains a model folder with a chat "
                           "template (chat_template.jinja and tokenizer.json), not a card")
        chat_files(folder)

    def make_batch(self, generator: torch.Generator) -> data.Batch:
        chosen = torch.randint(0, len(self.rows.train.ids), (self.options.batch_size,),
                               generator=generator).tolist()
        return chat.chat_batch(self.rows.train, chosen, self.pad)

    def logits(self, model: nn.Module, batch: data.Batch) -> torch.Tensor:
        return model(batch.inputs["input_ids"])[0]

    def files(self) -> dict[str, bytes]:  # the template and tokenizer, for `zoo run --chat`
        return _folder_tokenizer(self.options.tokenizer_folder)

    def evaluate(self, model: nn.Module) -> dict[str, Any] | None:
        if self.rows.eval is None:
            return None
        return chat.held_out_loss(model, self.rows.eval, self.pad)


def _folder_tokenizer(folder: Path | None) -> dict[str, bytes]:
    """A model folder's tokenizer files (and chat template) by name, or none."""
    copied = tokenizer_files(folder) if folder is not None and folder.is_dir() else []
    return {path.name: path.read_bytes() for path in copied}


TASKS: dict[str, type[TrainingTask]] = {
    "lm": LanguageModelling, "mlm": MaskedLanguageModelling, "copy": Copy,
    "reverse": Reverse, "classify": Classify, "chat": Chat,
}


def Task(card: Card, options: TrainOptions) -> TrainingTask:  # noqa: N802 (reads as a class)
    """The run of `options.task` on `card` (options checked and resolved); an image model's
    classify task reads images (zoo/training/images.py)."""
    if options.task == "classify" and is_patch_card(card):
        return ImageClassify(card, options)
    if is_mel_card(card):  # its source is audio frames: no task here reads audio
        raise ZooError(f"{card.name}: `zoo train` has no task for a speech model (stem "
                       "mel_frames: its source is audio); import a trained Whisper instead")
    return TASKS[options.task](card, options)


def default_task(card: Card) -> str:
    """The task `zoo train` trains this card's family with first (`zoo plot schedule` draws
    its schedule)."""
    task = next((name for name, task in TASKS.items() if card.family in task.trains), None)
    if task is None:
        raise ZooError(f"{card.name}: `zoo train` has no task for a {card.family}")
    return task
