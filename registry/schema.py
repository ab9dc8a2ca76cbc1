"""The card schema: every field, its type, default and range, and the checks across fields.

Validation happens on plain data, before any tensor exists; each error names the file, the field
and what was expected, e.g. `gpt-tiny.yaml: n_heads=5 does not divide d_model=64`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import registry.dual as dual
import registry.experts as experts
import registry.stems as stems
from registry.blocks import (
    BLOCKS,
    GELU,
    LAYERNORM,
    LEARNED,
    ROTARY,
    block_fields,
    block_names,
    effective_bias,  # noqa: F401  (its old home, kept for plugins for one release)
    field_owner,
)
from registry.errors import CardError, ZooError
from registry.families import DUAL_POOLINGS, POOLINGS, SPECS
from registry.plugins import load_plugins
from registry.sizes import attention_sizes

FAMILIES = ("encoder", "decoder", "encoder-decoder", dual.DUAL)
REQUIRED = object()
# Upper bounds on the sizes, generous (several times the largest published models), so that a
# typo or a hostile file (`vocab_size: 10**15`) is refused here, not by torch's allocator.
MAX_VOCAB = 2**23  # 8,388,608 tokens; the largest vocabularies have about 10**6
MAX_POSITIONS = 2**20  # 1,048,576 tokens of context
MAX_D_MODEL = 2**16  # 65,536; GPT-3's is 12,288
MAX_D_FF = 2**18  # 262,144
MAX_LAYERS = 1024
MAX_LABELS = MAX_VOCAB  # a classifier's classes are rows of a head, like tokens


@dataclass(frozen=True)
class Field:
    type: type
    default: Any = REQUIRED
    help: str = ""
    minimum: float | None = None
    exclusive_minimum: bool = False
    maximum: float | None = None
    exclusive_maximum: bool = False
    choices: tuple[str, ...] | Callable[[], list[str]] | None = None
    nullable: bool = False


def _blocks(kind: str) -> Callable[[], list[str]]:
    return lambda: block_names(kind)


FIELDS: dict[str, Field] = {
    "family": Field(str, help="encoder | decoder | encoder-decoder | dual-encoder",
                    choices=FAMILIES),
    "description": Field(str, "", help="one line shown by `zoo list`"),
    "vocab_size": Field(int, help="token vocabulary size", minimum=1, maximum=MAX_VOCAB),
    "max_positions": Field(int, help="longest sequence the model accepts", minimum=1,
                           maximum=MAX_POSITIONS),
    "d_model": Field(int, help="hidden size", minimum=1, maximum=MAX_D_MODEL),
    "n_heads": Field(int, help="attention heads", minimum=1, maximum=MAX_D_MODEL),
    "n_kv_heads": Field(int, None, "key/value heads: grouped-query attention (null: n_heads)",
                        minimum=1, maximum=MAX_D_MODEL, nullable=True),
    "head_dim": Field(int, None, "size of one head (null: the hidden size over n_heads)",
                      minimum=1, maximum=MAX_D_MODEL, nullable=True),
    "n_layers": Field(int, help="layers (per stack for encoder-decoder)", minimum=1,
                      maximum=MAX_LAYERS),
    "d_ff": Field(int, help="feed-forward inner size", minimum=1, maximum=MAX_D_FF),
    "dropout": Field(float, 0.1, "dropout probability", minimum=0.0, maximum=1.0,
                     exclusive_maximum=True),
    "activation": Field(str, GELU, "feed-forward kind", choices=_blocks("activation")),
    "norm": Field(str, LAYERNORM, "norm kind", choices=_blocks("norm")),
    "norm_eps": Field(float, 1e-5, "norm epsilon", minimum=0.0, exclusive_minimum=True),
    "norm_placement": Field(str, "pre", "norm before (pre) or after (post) each sublayer",
                            choices=("pre", "post")),
    "position": Field(str, LEARNED, "position kind", choices=_blocks("position")),
    "stem": Field(str, stems.TOKEN_EMBEDDING, "input stem: token_embedding (text) or "
                  "patch_embedding (an image cut into patches, ViT; fields image_size, "
                  "patch_size, channels) or mel_frames (log-mel audio frames, Whisper; fields "
                  "n_mels, max_source_positions)", choices=_blocks("stem")),
    "rope_theta": Field(float, 10000.0, "rotary base", minimum=0.0, exclusive_minimum=True),
    "rope_scaling": Field(dict, None, "rotary scaling, as config.json's: {rope_type: linear, "
                          "factor}, {rope_type: llama3, factor, low_freq_factor, "
                          "high_freq_factor, original_max_position_embeddings} or {rope_type: "
                          "yarn, factor, original_max_position_embeddings, optional beta_fast, "
                          "beta_slow, attention_factor, mscale, mscale_all_dim, truncate} "
                          "(null: none)",
                          nullable=True),
    "attention_pattern": Field(str, "G", "each layer's attention, the pattern cycled over the "
                               "layers: G global, L local (a sliding window); LLLLLG is Gemma "
                               "3's, LG Gemma 2's, GLL ModernBERT's"),
    "sliding_window": Field(int, None, "local layers' window: a causal query sees itself and the "
                            "sliding_window - 1 tokens before it; a bidirectional one "
                            "sliding_window // 2 on either side (null: no local layers)",
                            minimum=1, maximum=MAX_POSITIONS, nullable=True),
    "rope_theta_local": Field(float, None, "rotary base of the local layers (null: rope_theta)",
                              minimum=0.0, exclusive_minimum=True, nullable=True),
    "sandwich_norm": Field(bool, False, "a norm after each sublayer too, before its residual "
                           "add (Gemma 2 and 3: four norms a layer; needs norm_placement pre)"),
    "query_pre_attn_scalar": Field(int, None, "attention scores scaled by "
                                   "query_pre_attn_scalar^-0.5 (Gemma; null: head_dim^-0.5)",
                                   minimum=1, maximum=MAX_D_MODEL, nullable=True),
    "attn_logit_softcapping": Field(float, None, "attention scores capped as cap * tanh(s / "
                                    "cap) before the mask (Gemma 2; null: none)", minimum=0.0,
                                    exclusive_minimum=True, nullable=True),
    "final_logit_softcapping": Field(float, None, "output logits capped as cap * tanh(l / "
                                     "cap) (Gemma 2; decoder; null: none)", minimum=0.0,
                                     exclusive_minimum=True, nullable=True),
    "tie_embeddings": Field(bool, True, "output head (and enc-dec source/target) share embeddings"),
    "scale_embeddings": Field(bool, False, "multiply token embeddings by sqrt(d_model)"),
    "embedding_norm": Field(bool, False, "norm after the embedding sum (BERT)"),
    "final_norm": Field(bool, True, "norm after the last layer (pre-norm stacks)"),
    "bias": Field(bool, True, "biases in linear layers"),
    "attention_bias": Field(bool, None, "biases on the query, key and value projections "
                            "(null: bias)", nullable=True),
    "key_bias": Field(bool, None, "a bias on the key projection (Whisper's k_proj has none; "
                      "null: attention_bias)", nullable=True),
    "mlp_bias": Field(bool, None, "biases in the feed-forward (null: bias)", nullable=True),
    "qk_norm": Field(bool, False, "a norm over each head's queries and keys (Qwen3, OLMo 2)"),
    "qk_norm_scope": Field(str, "head", "qk_norm's reach: each head (Qwen3) or the whole query "
                           "and key projections (OLMoE)", choices=("head", "projection")),
    "output_bias": Field(bool, False, "a bias on the output logits (MarianMT's final_logits_bias)"),
    "target_vocab_size": Field(int, None, "encoder-decoder: a target vocabulary of its own "
                               "(null: the source's, shared)", minimum=1, maximum=MAX_VOCAB,
                               nullable=True),
    "type_vocab_size": Field(int, 0, "token types (encoder; 0 = none)", minimum=0,
                             maximum=MAX_VOCAB),
    "pooler": Field(bool, False, "tanh pooler over the first token (encoder)"),
    "mlm_head": Field(bool, False, "masked-LM head tied to the embeddings (encoder)"),
    "pad_token_id": Field(int, 0, "padding token", minimum=0),
    "bos_token_id": Field(int, None, "start token (encoder-decoder: decoder start)", minimum=0,
                          nullable=True),
    "eos_token_id": Field(int, None, "end token", minimum=0, nullable=True),
    "mask_token_id": Field(int, None, "mask token for masked-LM (encoder)", minimum=0,
                           nullable=True),
    "pooling": Field(str, None, "sentence vector: cls | mean | last | pooler; a dual "
                     "encoder's text vector: eos | last (none: no vector)",
                     choices=tuple(dict.fromkeys((*POOLINGS, *DUAL_POOLINGS))), nullable=True),
    "normalize": Field(bool, False, "scale the sentence vector to unit length"),
    "num_labels": Field(int, 0, "classifier classes on the sentence vector (0 = none)",
                        minimum=0, maximum=MAX_LABELS),
    "labels": Field(list, None, "the classes' names, in id order (optional)", nullable=True),
    "norm_bias": Field(bool, True, "a bias in each layernorm (ModernBERT's have none)"),
    "first_attention_norm": Field(bool, True, "pre-norm: a norm before the first layer's "
                                  "attention (ModernBERT has none: its embedding norm just ran)"),
    "head_bias": Field(bool, True, "a bias on the dense transform of the MLM head and of the "
                       "classifier's (ModernBERT's classifier_bias)"),
    "classifier_transform": Field(bool, False, "the classifier reads the sentence vector through "
                                  "dense, GELU and norm (ModernBertForSequenceClassification)"),
    "relative_buckets": Field(int, 32, "position t5_relative: buckets of key-query offsets, "
                              "per head (half each way in the encoder)", minimum=4,
                              maximum=MAX_POSITIONS),
    "relative_max_distance": Field(int, 128, "position t5_relative: offsets from here on "
                                   "share the last bucket", minimum=2, maximum=MAX_POSITIONS),
    "query_scale": Field(bool, True, "scale attention scores by 1/sqrt(head_dim) (false: T5, "
                         "whose initialisation absorbs it)"),
    "share_embeddings": Field(bool, None, "encoder-decoder: source and target share one "
                              "embedding, whether or not the head is tied to it (T5 v1.1: "
                              "shared, untied; null: as tie_embeddings)", nullable=True),
    "head_scale": Field(bool, False, "multiply the final states by d_model^-0.5 before a tied "
                        "output head (T5)"),
    # the dual encoder's (registry/dual.py): its own fields are the text tower's
    "vision": Field(dict, None, "dual-encoder: the image tower, a card of its own (family "
                    "encoder, stem patch_embedding)", nullable=True),
    "projection_dim": Field(int, None, "dual-encoder: size of the joint space both towers "
                            "project into", minimum=1, maximum=MAX_D_MODEL, nullable=True),
    "projection_bias": Field(bool, False, "dual-encoder: biases on the projections (SigLIP's "
                             "text head)"),
    "vision_projection": Field(bool, True, "dual-encoder: the image vector is projected "
                               "(false: it is the pooled state, SigLIP's)"),
    "vision_pooling": Field(str, "cls", "dual-encoder: the image vector: cls (the class token's "
                            "state through the final norm, CLIP's) or map (the final norm, then "
                            "an attention probe, SigLIP's)", choices=dual.VISION_POOLINGS),
    "logit_scale": Field(float, 2.6592, "dual-encoder: the cosine is scaled by "
                         "exp(logit_scale) (CLIP's init: log 1/0.07)", minimum=-100.0,
                         maximum=100.0),
    "logit_bias": Field(float, None, "dual-encoder: added to the scaled cosine (SigLIP's "
                        "sigmoid; null: none, CLIP's softmax)", nullable=True),
    "causal": Field(bool, False, "dual-encoder: the text tower attends causally (CLIP's)"),
}
ENCODER_ONLY = ("pooler", "mlm_head", "type_vocab_size", "embedding_norm")
# The mixture-of-experts feed-forward, a built-in block with card fields of its own
# (registry/experts.py): they are resolved only in cards that select it.
experts.register(Field)
stems.register(Field)  # the input stems, the patch stem's fields with them


def shared_embeddings(card: dict[str, Any]) -> bool:
    """Whether an encoder-decoder's source and target read one embedding matrix: as the card's
    share_embeddings says, else where the head is tied too; never with two vocabularies."""
    share = card.get("share_embeddings")
    share = card["tie_embeddings"] if share is None else share
    return share and card["target_vocab_size"] is None


def target_vocab_size(card: dict[str, Any]) -> int:
    """The vocabulary the decoder reads and writes: the source's unless the card has its own."""
    return card["target_vocab_size"] or card["vocab_size"]


def _coerce(name: str, value: Any, spec: Field, where: str) -> Any:
    if value is None and spec.nullable:
        return None
    if spec.type is float and isinstance(value, str):
        try:  # YAML 1.1 reads `1e-5` (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec.type is int and isinstance(value, bool) or not isinstance(value, spec.type):
        raise CardError(f"{where}: {name}={value!r} should be {spec.type.__name__}")
    return value


def _check_range(name: str, value: Any, spec: Field, where: str) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise CardError(f"{where}: {name}={value} should be a finite number")
    if spec.minimum is not None:
        low_ok = value > spec.minimum if spec.exclusive_minimum else value >= spec.minimum
        if not low_ok:
            op = ">" if spec.exclusive_minimum else ">="
            raise CardError(f"{where}: {name}={value} should be {op} {spec.minimum}")
    if spec.maximum is not None:
        high_ok = value < spec.maximum if spec.exclusive_maximum else value <= spec.maximum
        if not high_ok:
            op = "<" if spec.exclusive_maximum else "<="
            raise CardError(f"{where}: {name}={value} should be {op} {spec.maximum}")
    if spec.choices is not None:
        choices = list(spec.choices() if callable(spec.choices) else spec.choices)
        if value not in choices:
            raise CardError(f"{where}: {name}={value!r} should be one of {', '.join(choices)}"
                            + _suggest(str(value), choices))


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_known_fields(fields: dict[str, Any], where: str, extra: tuple[str, ...] = ()) -> None:
    """Reject an unknown field, suggesting the closest known one (blocks' own fields are
    known too: whether they apply is `validate`'s question)."""
    load_plugins()
    known = [*FIELDS, *block_fields(), *extra]
    for name in fields:
        if name not in known:
            raise CardError(f"{where}: unknown field '{name}'" + _suggest(str(name), known))


def validate(
    fields: dict[str, Any], where: str, origins: dict[str, str] | None = None
) -> dict[str, Any]:
    """Return the fields with defaults filled in, or raise CardError naming the file and field.

    `origins` maps a field to the file it came from (along an `extends` chain), so an error
    points at the file that set the bad value; `where` is the card itself.
    """
    load_plugins()  # plugin block names are valid choices, wherever the card came from
    origins = origins or {}
    check_known_fields(fields, where)
    resolved: dict[str, Any] = {}
    for name, spec in FIELDS.items():
        resolved[name] = _resolve(name, spec, fields, where, origins)
    _resolve_block_fields(fields, resolved, where, origins)
    _check_across_fields(resolved, where, origins)
    return resolved


def _resolve(name: str, spec: Field, fields: dict[str, Any], where: str,
             origins: dict[str, str]) -> Any:
    """One field's value: the default where absent, else checked against its spec."""
    if name not in fields:
        if spec.default is REQUIRED:
            raise CardError(f"{where}: missing required field '{name}' ({spec.help})")
        return spec.default
    source = origins.get(name, where)
    value = _coerce(name, fields[name], spec, source)
    _check_range(name, value, spec, source)
    return value


def _resolve_block_fields(fields: dict[str, Any], resolved: dict[str, Any], where: str,
                          origins: dict[str, str]) -> None:
    """The fields of the blocks the card selects, after the schema's; a block's field on a
    card that does not select the block is refused, naming the block it belongs to."""
    for kind, entries in BLOCKS.items():
        for name, spec in entries[resolved[kind]].fields.items():
            if name in FIELDS:
                raise ZooError(f"{entries[resolved[kind]].origin}: card field '{name}' is "
                               "already a field of the schema")
            resolved[name] = _resolve(name, spec, fields, where, origins)
    for name in fields:
        owner = field_owner(name)
        if name not in resolved and owner is not None:
            kind, entry = owner
            raise CardError(f"{origins.get(name, where)}: {name} applies only to {kind} "
                            f"{entry.name}, not {resolved[kind]}")


ROPE_SCALINGS = {"linear": ("factor",),
                 "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"),
                 "yarn": ("factor", "original_max_position_embeddings")}
# Settings a kind reads where present (transformers' defaults otherwise).
ROPE_OPTIONAL = {"yarn": ("beta_fast", "beta_slow", "attention_factor", "mscale",
                          "mscale_all_dim", "truncate")}


def _check_rope_scaling(card: dict[str, Any], where: str) -> None:
    """Only the scalings the rotary block computes; any other (dynamic, longrope) is refused
    by name rather than approximated."""
    scaling = card["rope_scaling"]
    if card["position"] != ROTARY:
        raise CardError(f"{where}: rope_scaling applies only to position rotary, not "
                        f"{card['position']}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in ROPE_SCALINGS:
        raise CardError(f"{where}: rope_scaling rope_type={kind!r} is not supported (the zoo "
                        f"computes {', '.join(ROPE_SCALINGS)})")
    for key in ROPE_SCALINGS[kind]:
        value = scaling.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise CardError(f"{where}: rope_scaling {key}={value!r} should be a number > 0 "
                            f"(rope_type {kind} needs {', '.join(ROPE_SCALINGS[kind])})")
    for key in ROPE_OPTIONAL.get(kind, ()):
        value = scaling.get(key)
        if key == "truncate":
            if value is not None and not isinstance(value, bool):
                raise CardError(f"{where}: rope_scaling truncate={value!r} should be true or "
                                "false")
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                    or not value > 0):
            raise CardError(f"{where}: rope_scaling {key}={value!r} should be a number > 0")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise CardError(f"{where}: rope_scaling high_freq_factor should exceed "
                        "low_freq_factor")


def _check_across_fields(card: dict[str, Any], where: str, origins: dict[str, str]) -> None:
    if card["n_kv_heads"] is not None and card["n_heads"] % card["n_kv_heads"]:
        raise CardError(f"{where}: n_kv_heads={card['n_kv_heads']} does not divide "
                        f"n_heads={card['n_heads']} (each key/value head serves a group)")
    if card["head_dim"] is None and card["d_model"] % card["n_heads"]:
        sources = {origins.get(name, where) for name in ("n_heads", "d_model")} - {where}
        came_from = f" (set in {', '.join(sorted(sources))})" if sources else ""
        raise CardError(f"{where}: n_heads={card['n_heads']} does not divide "
                        f"d_model={card['d_model']}{came_from}")
    if card["position"] == ROTARY and attention_sizes(card).head_dim % 2:
        raise CardError(f"{where}: position=rotary needs an even head size, "
                        f"got a head size of {attention_sizes(card).head_dim}")
    if card["rope_scaling"] is not None:
        _check_rope_scaling(card, where)
    _check_local_attention(card, where)
    _check_norm_options(card, where)
    _check_gemma_fields(card, where)
    _check_relative_bias(card, where)
    for token in ("pad_token_id", "bos_token_id", "eos_token_id", "mask_token_id"):
        if card[token] is not None and card[token] >= card["vocab_size"]:
            raise CardError(f"{where}: {token}={card[token]} should be < vocab_size="
                            f"{card['vocab_size']}")
    if card["family"] != "encoder":
        for name in ENCODER_ONLY:
            if card[name]:
                raise CardError(f"{where}: {name}={card[name]!r} applies only to family encoder, "
                                f"not {card['family']}")
    _check_sequence_heads(card, where)
    stems.check_patches(card, where)
    dual.check_dual(card, where, validate, {name: FIELDS[name].default for name in dual.FIELDS})
    stems.check_mel_frames(card, where)
    if card["target_vocab_size"] is not None and card["family"] != "encoder-decoder":
        raise CardError(f"{where}: target_vocab_size applies only to family encoder-decoder")
    for token in ("bos_token_id", "eos_token_id"):  # tokens the decoder reads or writes
        if card[token] is not None and card[token] >= target_vocab_size(card):
            raise CardError(f"{where}: {token}={card[token]} should be < target_vocab_size="
                            f"{target_vocab_size(card)}")
    if card["family"] == "encoder-decoder" and card["bos_token_id"] is None:
        raise CardError(f"{where}: bos_token_id is required for family encoder-decoder "
                        "(the decoder's start token)")
    if card["activation"] == experts.NAME:
        family = card["family"]
        if family != "decoder":  # the router's loss and the cache graphs are a decoder's
            raise CardError(f"{where}: activation=moe applies only to family decoder, not "
                            f"{family}")
        experts.check_experts(card, where)
    if card["qk_norm_scope"] != "head" and not card["qk_norm"]:
        raise CardError(f"{where}: qk_norm_scope={card['qk_norm_scope']!r} needs qk_norm: true")


def _check_local_attention(card: dict[str, Any], where: str) -> None:
    """attention_pattern, sliding_window and rope_theta_local (zoo/blocks/windows.py)."""
    pattern = card["attention_pattern"]
    if not pattern or set(pattern) - {"G", "L"}:
        raise CardError(f"{where}: attention_pattern={pattern!r} should be letters G (global) "
                        "and L (local), e.g. LLLLLG")
    local = "L" in pattern[:card["n_layers"]]
    if local and card["family"] == "encoder-decoder":
        raise CardError(f"{where}: attention_pattern with local layers (L) applies only to "
                        "families encoder and decoder")
    if local and card["sliding_window"] is None:
        raise CardError(f"{where}: attention_pattern={pattern!r} has local layers (L) and "
                        "needs sliding_window")
    for name in ("sliding_window", "rope_theta_local"):
        if card[name] is not None and not local:
            raise CardError(f"{where}: {name} applies only to local layers (an L in "
                            f"attention_pattern, now {pattern!r})")
    if card["rope_theta_local"] is not None and card["position"] != ROTARY:
        raise CardError(f"{where}: rope_theta_local applies only to position rotary, not "
                        f"{card['position']}")


def _check_norm_options(card: dict[str, Any], where: str) -> None:
    """norm_bias and first_attention_norm (ModernBERT's norms)."""
    if not card["norm_bias"] and card["norm"] != LAYERNORM:
        raise CardError(f"{where}: norm_bias=false applies only to norm layernorm, not "
                        f"{card['norm']}")
    if not card["first_attention_norm"] and card["norm_placement"] != "pre":
        raise CardError(f"{where}: first_attention_norm=false applies only to "
                        "norm_placement pre")


def _check_gemma_fields(card: dict[str, Any], where: str) -> None:
    """sandwich_norm and final_logit_softcapping: where the zoo's blocks compute them."""
    if card["sandwich_norm"] and (card["norm_placement"] != "pre"
                                  or card["family"] == "encoder-decoder"):
        raise CardError(f"{where}: sandwich_norm applies only to norm_placement pre in families "
                        f"encoder and decoder, not {card['norm_placement']} in "
                        f"{card['family']}")
    if card["final_logit_softcapping"] is not None and (card["family"] != "decoder"
                                                        or card["pooling"] is not None):
        raise CardError(f"{where}: final_logit_softcapping applies only to a decoder's LM head "
                        "(family decoder, no pooling)")


def _check_relative_bias(card: dict[str, Any], where: str) -> None:
    """T5's buckets (zoo/blocks/relative_bias.py): the exact offsets are the first half of
    the causal buckets, and the logarithmic ones need a farther limit; the d_model^-0.5 head
    scale is the tied head's."""
    if card["relative_max_distance"] <= card["relative_buckets"] // 2:
        raise CardError(f"{where}: relative_max_distance={card['relative_max_distance']} "
                        f"should exceed relative_buckets // 2 = {card['relative_buckets'] // 2} "
                        "(the offsets with a bucket each)")
    if card["share_embeddings"] is not None and card["family"] != "encoder-decoder":
        raise CardError(f"{where}: share_embeddings applies only to family encoder-decoder")
    if card["share_embeddings"] and card["target_vocab_size"] is not None:
        raise CardError(f"{where}: share_embeddings=true needs one vocabulary "
                        "(target_vocab_size: null)")
    if card["head_scale"] and not card["tie_embeddings"]:
        raise CardError(f"{where}: head_scale applies only to a tied head (tie_embeddings: "
                        "true)")


def _check_sequence_heads(card: dict[str, Any], where: str) -> None:
    """pooling, normalize, num_labels and labels: the sentence vector and the classifier."""
    pooling, labels = card["pooling"], card["labels"]
    if pooling is not None:
        # a causal decoder's first token has seen nothing; only the encoder has BERT's pooler
        allowed = SPECS[card["family"]].poolings if card["family"] in SPECS else ()
        if pooling not in allowed:
            expected = f"one of {', '.join(allowed)}" if allowed else "absent (null)"
            raise CardError(f"{where}: pooling={pooling!r} for family {card['family']} should "
                            f"be {expected}")
        if pooling == "pooler" and not card["pooler"]:
            raise CardError(f"{where}: pooling='pooler' needs pooler: true")
    if card["normalize"] and pooling is None:
        raise CardError(f"{where}: normalize=true needs a pooling (cls | mean | last | pooler)")
    if card["num_labels"]:
        if pooling is None:
            raise CardError(f"{where}: num_labels={card['num_labels']} needs a pooling (the "
                            "classifier reads the sentence vector)")
        if card["mlm_head"]:
            raise CardError(f"{where}: num_labels={card['num_labels']} and mlm_head=true both "
                            "output 'logits'; a classifier has no MLM head (mlm_head: false)")
    if labels is None:
        return
    if not all(isinstance(label, str) and label for label in labels):
        raise CardError(f"{where}: labels={labels!r} should be a list of non-empty names")
    if len(labels) != card["num_labels"]:
        raise CardError(f"{where}: labels has {len(labels)} names, but num_labels="
                        f"{card['num_labels']}")
    if len(set(labels)) != len(labels):
        twice = sorted({label for label in labels if labels.count(label) > 1})
        raise CardError(f"{where}: labels names {', '.join(twice)} more than once")


def default_pooling(card: dict[str, Any]) -> str:
    """The sentence vector a classifier reads when its card names none: BERT's pooler where
    the card has one (as BertForSequenceClassification), else the first real token for an
    encoder and the last for a decoder (as GPT2ForSequenceClassification)."""
    if card["pooler"]:
        return "pooler"
    spec = SPECS.get(card["family"])
    return spec.default_pooling if spec is not None else "cls"
