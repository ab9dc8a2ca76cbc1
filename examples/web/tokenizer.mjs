// Text <-> ids for a zoo export, the same ids and text as the zoo's Python tokenizer
// (runtime/files/tokenizer.py; docs/onnx-contract.md, section 6): byte-tokenizer.json,
// tokenizer.json and the reversal demo's word-tokenizer.json (a MarianMT export's
// sentencepiece files are not read here: its tokenizer.json is their translation, which adds
// the source's </s> as a special token, so a source is encoded with `sequence`). One file for
// Node.js
// (examples/node) and the page: it lives in the page's folder because a page can load only
// what its server serves, and it imports nothing itself: the caller hands in how to read a
// file of the export and how to get the Tokenizer class of @huggingface/tokenizers
// (node_modules for Node, a URL for the page; loaded only for a tokenizer.json).

export const BYTE_TOKENIZER = 'byte-tokenizer.json';
export const HF_TOKENIZER = 'tokenizer.json';
export const WORD_TOKENIZER = 'word-tokenizer.json';

// Ids 0..255 are the UTF-8 bytes of the text; ids >= 256 are special and decode to nothing.
// TextDecoder replaces each invalid sequence with U+FFFD the way Python's errors="replace"
// does (both follow Unicode's "maximal subpart" practice).
class ByteTokenizer {
  constructor(spec) {
    this.kind = 'bytes';
    this.eos = spec.eos;
  }

  encode(text) {
    return Array.from(new TextEncoder().encode(text));
  }

  sequence(text) {
    return this.encode(text); // no special tokens to add
  }

  decode(ids) {
    return new TextDecoder('utf-8').decode(Uint8Array.from(ids.filter((id) => id < 256)));
  }
}

// Whole lowercase words from id 3 (0-2: pad, bos, eos): the word-reversal demo's vocabulary.
// Python splits on any Unicode whitespace, as \s does here.
class WordTokenizer {
  constructor(spec) {
    this.kind = 'words';
    this.words = spec.words;
    this.index = new Map(spec.words.map((word, i) => [word, i + 3]));
  }

  encode(text) {
    const words = text.toLowerCase().split(/\s+/).filter(Boolean);
    const unknown = words.filter((word) => !this.index.has(word));
    if (unknown.length) {
      throw new Error(`words not in the vocabulary: ${unknown.slice(0, 5).join(', ')} (it has ` +
                      `the ${this.words.length} most frequent words of its training text)`);
    }
    return words.map((word) => this.index.get(word));
  }

  sequence(text) {
    return this.encode(text);
  }

  decode(ids) {
    return ids.filter((id) => id >= 3 && id < this.words.length + 3)
      .map((id) => this.words[id - 3]).join(' ');
  }
}

// A Hugging Face tokenizer.json, as Python's `tokenizers` uses it in the zoo: no special
// tokens added when encoding a piece of text (`sequence` adds them), skipped when decoding, and no "clean up" of spaces (that is
// transformers', not tokenizers', and @huggingface/tokenizers does it unless told not to).
class HuggingFaceTokenizer {
  constructor(json, Tokenizer) {
    this.kind = 'tokenizer.json';
    this.backend = new Tokenizer(json, {});
  }

  encode(text) {
    return this.backend.encode(text, { add_special_tokens: false }).ids;
  }

  // A whole sequence, with the special tokens its post-processor adds (BERT's [CLS] ... [SEP],
  // Llama 2's BOS): what Python's sequence_ids gives for a sentence vector or a decoder prompt.
  sequence(text) {
    return this.backend.encode(text, { add_special_tokens: true }).ids;
  }

  decode(ids) {
    if (ids.length === 0) return ''; // the library throws on an empty list
    return this.backend.decode(ids, { skip_special_tokens: true,
                                      clean_up_tokenization_spaces: false });
  }
}

// The export's tokenizer, or null where it has none. `read(name)` resolves to the file's text
// or null when the file is absent; `library()` resolves to @huggingface/tokenizers' Tokenizer
// class. byte-tokenizer.json wins when both files are there: the
// tokenizer.json beside it is its translation for ONNX Runtime GenAI (as in Python).
export async function loadTokenizer(read, library) {
  const bytes = await read(BYTE_TOKENIZER);
  if (bytes !== null) {
    const spec = parse(bytes, BYTE_TOKENIZER);
    if (spec.kind !== 'bytes' || !Number.isInteger(spec.eos)) {
      throw new Error(`${BYTE_TOKENIZER}: not a byte tokenizer file (kind should be 'bytes')`);
    }
    return new ByteTokenizer(spec);
  }
  const json = await read(HF_TOKENIZER);
  if (json === null) {
    const words = await read(WORD_TOKENIZER);
    if (words === null) return null;
    const spec = parse(words, WORD_TOKENIZER);
    if (spec.kind !== 'words' || !Array.isArray(spec.words)) {
      throw new Error(`${WORD_TOKENIZER}: not a word tokenizer file (kind should be 'words')`);
    }
    return new WordTokenizer(spec);
  }
  const spec = parse(json, HF_TOKENIZER);
  const Tokenizer = await library();
  try {
    return new HuggingFaceTokenizer(spec, Tokenizer);
  } catch (error) {
    throw new Error(`${HF_TOKENIZER}: not a readable tokenizer.json: ${error.message}`);
  }
}

function parse(text, name) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`${name}: not valid JSON: ${error.message}`);
  }
}

// Text as tokens come: push(id) returns the new piece of text (maybe ''), end() the rest.
// It decodes everything so far and hands out what grew since the last piece, holding back a
// text that ends in U+FFFD (half a character, the rest of its bytes still to come). So the
// pieces join to exactly decode(all ids), which is what Python prints.
export function textStream(tokenizer) {
  const ids = [];
  let shown = '';
  const grow = (final) => {
    const text = tokenizer.decode(ids);
    if (!final && (text.endsWith('\uFFFD') || !text.startsWith(shown))) return '';
    // A decoder that rewrote text already shown (not one the zoo ships) loses that edit here.
    const piece = text.slice(shown.length);
    shown = text;
    return piece;
  };
  return {
    push(id) {
      ids.push(id);
      return grow(false);
    },
    end: () => grow(true),
  };
}

// What the golden tests compare with Python: each text's ids and the text they decode to, and
// the decoding of given id lists (special tokens, bytes that are not UTF-8).
export function golden(tokenizer, { texts = [], ids = [] }) {
  return {
    encoded: texts.map((text) => {
      const encoded = tokenizer.encode(text);
      return { ids: encoded, text: tokenizer.decode(encoded), sequence: tokenizer.sequence(text) };
    }),
    decoded: ids.map((list) => tokenizer.decode(list)),
  };
}
