"""A GGUF file's own tokenizer as a tokenizer.json, built as transformers builds one from the
file (transformers/integrations/gguf/gguf_tokenizer_mapping.py), with the `tokenizers` library
alone:

- `tokenizer.ggml.model: gpt2` (SmolLM2, Qwen, Llama 3): GPT-2's byte-level BPE, the
  vocabulary and merges as stored, control tokens special; the text split before the merges
  with the regex `tokenizer.ggml.pre` names where it is Qwen2's or Llama 3's (one digit, or up
  to three, a piece), else GPT-2's, as llama.cpp and transformers split it.
- `tokenizer.ggml.model: llama` (Llama 2, TinyLlama, Mistral): SentencePiece's BPE with byte
  fallback, as LlamaTokenizer writes it: the pieces as the vocabulary, the merges the file
  stores or, where it stores none (llama.cpp writes scores instead), every pair of pieces that
  makes a piece, best score first; "▁" for a space and one before the text (unless
  `tokenizer.ggml.add_space_prefix` is false), as SentencePiece and llama.cpp do even where the
  text starts with a space (transformers does not there); BOS before every text (unless
  `tokenizer.ggml.add_bos_token` is false), EOS after where `add_eos_token` says so.

Any other kind is not converted (None).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from registry.errors import ZooError

KINDS = {"gpt2": "byte-level BPE", "llama": "SentencePiece BPE"}  # tokenizer.ggml.model
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4  # llama.cpp's token types
SPACE = "\u2581"  # SentencePiece's stand-in for a space
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT,  # tokenizer.ggml.pre: regex
          "llama-bpe": LLAMA3_SPLIT, "llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT}


def gguf_tokenizer(fields: dict[str, Any], where: str = "the GGUF file") -> str | None:
    """tokenizer.json's text for the file's tokenizer, or None where it is of another kind;
    lists that do not describe one vocabulary are refused in one line (`where`: the file)."""
    kind = fields["tokenizer.ggml.model"].contents() if "tokenizer.ggml.model" in fields else None
    if kind not in KINDS or (kind == "llama" and "tokenizer.ggml.scores" not in fields):
        return None
    if "tokenizer.ggml.tokens" not in fields:
        raise ZooError(f"{where}: no tokenizer.ggml.tokens (tokenizer.ggml.model is {kind})")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if key in fields and len(fields[key].contents()) != len(tokens):
            raise ZooError(f"{where}: {key} has {len(fields[key].contents())} entries for "
                           f"{len(tokens)} tokens")
    if kind == "gpt2":
        if "tokenizer.ggml.merges" not in fields:
            raise ZooError(f"{where}: no tokenizer.ggml.merges (a byte-level BPE needs them)")
        return _byte_level_bpe(fields, _merges(fields, tokens, where))
    repeated = [token for token, count in Counter(tokens).items() if count > 1]
    if repeated:  # SentencePiece's pieces are unique
        raise ZooError(f"{where}: tokenizer.ggml.tokens holds {repeated[0]!r} more than once")
    for key in ("unknown", "bos", "eos"):  # the ids this conversion looks up
        index = _values(fields, f"tokenizer.ggml.{key}_token_id")
        if index is not None and not 0 <= index < len(tokens):
            raise ZooError(f"{where}: tokenizer.ggml.{key}_token_id {index} is not a token id "
                           f"(0 to {len(tokens) - 1})")
    return _sentencepiece_bpe(fields, _merges(fields, tokens, where))


def _values(fields: dict[str, Any], key: str, default: Any = None) -> Any:
    return fields[key].contents() if key in fields else default


def _merges(fields: dict[str, Any], tokens: list[str], where: str
            ) -> list[tuple[str, str]] | None:
    """The file's merges, each two tokens whose join is a token (as the `tokenizers` BPE
    needs them), or None where it stores none."""
    stored = _values(fields, "tokenizer.ggml.merges")
    if not stored:
        return None
    vocab, merges = set(tokens), []
    for index, merge in enumerate(stored):
        left, space, right = merge.partition(" ")
        if not space or not {left, right, left + right} <= vocab:  # `tokenizers` panics
            raise ZooError(f"{where}: tokenizer.ggml.merges[{index}] {merge!r}: expected two "
                           "tokens and a space between, which make a token")
        merges.append((left, right))
    return merges


def _byte_level_bpe(fields: dict[str, Any], merges: list[tuple[str, str]] | None) -> str:
    tokens = fields["tokenizer.ggml.tokens"].contents()
    tokenizer = Tokenizer(models.BPE({token: i for i, token in enumerate(tokens)}, merges or []))
    split = SPLITS.get(_values(fields, "tokenizer.ggml.pre"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                       use_regex=split is None)
    if split is not None:  # the regex the merges were learned on, then bytes as characters
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), tokenizer.pre_tokenizer])
    tokenizer.decoder = decoders.ByteLevel()
    kinds = _values(fields, "tokenizer.ggml.token_type", [])
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True)
                                  for i, kind in enumerate(kinds) if kind == CONTROL])
    return tokenizer.to_str()


def _sentencepiece_bpe(fields: dict[str, Any], stored: list[tuple[str, str]] | None) -> str:
    tokens = fields["tokenizer.ggml.tokens"].contents()
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = stored or merges_from_scores(vocab, fields["tokenizer.ggml.scores"].contents())
    # a character with neither a piece nor byte pieces is <unk>, as SentencePiece gives it
    # (without an unk_token the BPE drops it)
    kinds = _values(fields, "tokenizer.ggml.token_type", [])
    unknown = _values(fields, "tokenizer.ggml.unknown_token_id",
                      next((i for i, kind in enumerate(kinds) if kind == UNKNOWN), None))
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=True, byte_fallback=True,
                                     unk_token=None if unknown is None else tokens[unknown]))
    # The space before the text as a normalizer (as Llama 2's own tokenizer.json has it), not
    # Metaspace's prefix (transformers' GGUF reading), which skips a text that starts with a
    # space: SentencePiece and llama.cpp put one before every text.
    prefix = bool(_values(fields, "tokenizer.ggml.add_space_prefix", True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend(SPACE)] * prefix + [normalizers.Replace(" ", SPACE)])
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence(
        steps + ([decoders.Strip(content=" ", left=1, right=0)] if prefix else []))
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(kinds) if kind in (UNKNOWN, CONTROL)])
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, kind in enumerate(kinds) if kind == USER_DEFINED])
    tokenizer.post_processor = _bos_and_eos(fields, tokens)
    return tokenizer.to_str()


def merges_from_scores(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece BPE vocabulary implies: each way of cutting a piece into two
    pieces, the better the whole piece's score the earlier (on a tie the longer left part, then
    the longer right part, as transformers orders them). `vocab` holds each piece once, in id
    order, so it pairs with `scores`."""
    found = []
    for piece, score in zip(vocab, scores, strict=True):
        cuts = sorted(((piece[:i], piece[i:]) for i in range(1, len(piece))
                       if piece[:i] in vocab and piece[i:] in vocab),
                      key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found.extend((left, right, score) for left, right in cuts)
    found.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _bos_and_eos(fields: dict[str, Any], tokens: list[str]) -> processors.TemplateProcessing:
    """BOS before each text (llama.cpp's default for this kind) and EOS after where the file
    asks, as transformers' tokenizer adds them."""

    def added(key: str, default: bool) -> list[tuple[str, int]]:
        index = _values(fields, f"tokenizer.ggml.{key}_token_id")
        wanted = _values(fields, f"tokenizer.ggml.add_{key}_token", default)
        return [(tokens[index], int(index))] if index is not None and wanted else []

    bos, eos = added("bos", True), added("eos", False)
    start, end = [f"{token}:0" for token, _ in bos], [f"{token}:0" for token, _ in eos]
    return processors.TemplateProcessing(
        single=[*start, "$A:0", *end], pair=[*start, "$A:0", *end, *start, "$B:1", *end],
        special_tokens=list(dict.fromkeys(bos + eos)))
