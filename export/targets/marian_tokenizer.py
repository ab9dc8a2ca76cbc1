"""MarianMT's tokenizer files as the Hugging Face clients read them.

transformers (Python) reads MarianMT's own files (`source.spm`, `target.spm`, `vocab.json`) as
`MarianTokenizer`, which `tokenizer_config.json` names. transformers.js has no sentencepiece:
its MarianTokenizer reads `tokenizer.json`, so that file is written here from the same files,
the way its converted opus-mt models carry one: a Unigram model whose ids are vocab.json's, each
piece scored as in source.spm (the sentencepiece normalizer and whitespace handling carried
over), and `</s>` appended to every text, as MarianTokenizer does.

It gives MarianTokenizer's ids where vocab.json holds every piece of source.spm (a shared
vocabulary: one sentencepiece model's pieces and the specials). A piece of source.spm that
vocab.json lacks is `<unk>` for MarianTokenizer but is spelled with smaller pieces here, and a
piece only the target side has could be chosen here (it is scored below every source piece,
so only where no source piece spells the text): the note says how many pieces differ. A
target vocabulary of its own (`target_vocab.json`) cannot be one tokenizer.json: none is
written, and the note says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.errors import ZooError, needs_package
from registry.paths import display_path
from runtime.files.spm_tokenizer import SOURCE_SPM, TARGET_VOCAB, VOCAB, vocabulary

EOS, UNK, PAD = "</s>", "<unk>", "<pad>"
UNIGRAM, NORMAL = 1, 1  # sentencepiece's TrainerSpec.UNIGRAM and SentencePiece.NORMAL
BELOW_SOURCE = 10.0  # how far below source.spm's lowest score a target-only piece is scored
SPACE = "\u2581"  # sentencepiece's space
# MarianTokenizer (and `zoo run`) joins the pieces, spells each SPACE as " " and strips the text:
# a text cut short on a bare SPACE piece, or one that starts with it, loses those spaces. A plain
# Metaspace decoder drops only the first piece's one space and keeps the last. Strip, the decoder,
# cannot do it: it cuts a fixed count, and the Rust library panics where the text is shorter than
# that count. Spaces before or after nothing are the ends in both regex engines (Oniguruma, where
# ^ and $ would match at every line, and JavaScript's); nmt_nfkc's pieces spell every space " ".
EDGE_SPACES = r"(?<![\s\S]) +| +(?![\s\S])"


def _source_model(path: Path) -> Any:
    needs_package("sentencepiece", display_path(path))
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    try:
        model.ParseFromString(path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError, and OSError
        raise ZooError(f"{display_path(path)}: not a sentencepiece model: {exc}") from exc
    return model


def marian_tokenizer_json(folder: Path) -> tuple[str | None, str | None]:
    """(tokenizer.json's text or None, a note: why there is none, or where it may differ)."""
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

    folder = Path(folder)
    if (folder / TARGET_VOCAB).is_file():
        return None, (f"no tokenizer.json: {TARGET_VOCAB} is a target vocabulary of its own, and "
                      "one tokenizer.json has one (transformers.js cannot tokenize this export)")
    source = _source_model(folder / SOURCE_SPM)
    if source.trainer_spec.model_type != UNIGRAM:
        return None, f"no tokenizer.json: {SOURCE_SPM} is not a unigram model"
    vocab = vocabulary(folder / VOCAB)
    pieces = sorted(vocab, key=vocab.get)
    if [vocab[piece] for piece in pieces] != list(range(len(pieces))):
        return None, f"no tokenizer.json: {VOCAB}'s ids are not 0, 1, 2, ... in a row"
    scores = {p.piece: p.score for p in source.pieces if p.type == NORMAL}
    floor = min(scores.values(), default=0.0) - BELOW_SOURCE
    backend = Tokenizer(models.Unigram([(piece, scores.get(piece, floor)) for piece in pieces],
                                       unk_id=vocab[UNK], byte_fallback=False))
    spec = source.normalizer_spec
    charsmap = spec.precompiled_charsmap  # the normalization (nmt_nfkc, ...) as compiled
    steps = [normalizers.Precompiled(charsmap)] if charsmap else []
    if spec.remove_extra_whitespaces:  # no space at either end, a run of spaces as one
        steps += [normalizers.Strip(), normalizers.Replace(Regex(" {2,}"), " ")]
    backend.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spec.add_dummy_prefix else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=prepend)
    backend.decoder = decoders.Sequence([  # MarianTokenizer's text, spaces at the ends cut
        decoders.Replace(SPACE, " "), decoders.Fuse(), decoders.Replace(Regex(EDGE_SPACES), "")])
    specials = [token for token in (EOS, UNK, PAD) if token in vocab]
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                for token in specials])
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A $B {EOS}", special_tokens=[(EOS, vocab[EOS])])
    missing = sum(piece not in vocab for piece in scores)
    extra = sum(piece not in scores for piece in pieces if piece not in specials)
    note = None
    if missing or extra:
        note = (f"tokenizer.json: {missing} pieces of {SOURCE_SPM} missing from {VOCAB} and "
                f"{extra} pieces only {VOCAB} has: it may split some texts otherwise than "
                "MarianTokenizer (transformers.js reads it; Python reads the sentencepiece files)")
    return backend.to_str(pretty=True), note


def marian_tokenizer_config(card: Any, vocab: dict[str, int]) -> dict[str, Any]:
    """tokenizer_config.json: transformers' MarianTokenizer, which reads the sentencepiece
    files by their own names (transformers.js takes the class and reads tokenizer.json)."""
    return {"tokenizer_class": "MarianTokenizer", "source_lang": None, "target_lang": None,
            "separate_vocabs": False, "eos_token": EOS, "unk_token": UNK,
            **({"pad_token": PAD} if PAD in vocab else {}),
            "model_max_length": card["max_positions"], "clean_up_tokenization_spaces": False,
            "sp_model_kwargs": {}}


def marian_special_tokens(vocab: dict[str, int]) -> dict[str, str]:
    return {role: token for role, token in (("eos_token", EOS), ("unk_token", UNK),
                                            ("pad_token", PAD)) if token in vocab}
