// Run a zoo ONNX export with onnxruntime-node, following docs/onnx-contract.md.
//
//   node generate.mjs FOLDER --text "ROMEO:" [--steps 32]
//   node generate.mjs FOLDER --ids 72,101,108 [--steps 32]
//
// decoder:          greedy generation with the key/value cache: the prompt and its
//                   continuation, streamed as tokens come (--ids: {"tokens":[...]})
// encoder-decoder:  encode once, then greedy decoding from bos: the translation, streamed
//                   (--ids: {"tokens":[...]})
// encoder:          the pooled vector                             -> {"pooled":[...]}
//
// Everything it needs comes from FOLDER: manifest.json (family and card sizes) and, for
// --text, its tokenizer (byte-tokenizer.json or tokenizer.json, read as the zoo's Python side
// reads it: examples/web/tokenizer.mjs). Generation stops early at the card's eos_token_id,
// which is included in --ids' output, as `zoo run` does; --text prints what `zoo run --text`
// prints.
// Bad input prints ONE line `error: ...` on stderr and exits with code 2, like the zoo CLI.

import { join } from 'node:path';
import ort from 'onnxruntime-node';
import {
  InputError, MODEL_GRAPH, firstLine, graphFile, int64, open, readManifest,
} from './contract.mjs';
import { readTokenizer, textStream } from './text.mjs';

function parseArgs(argv) {
  const usage = 'usage: node generate.mjs FOLDER (--text TEXT | --ids 1,2,3) [--steps N]';
  const args = { folder: null, ids: null, text: null, steps: 32 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--ids' || arg === '--text' || arg === '--steps') {
      if (i + 1 >= argv.length) throw new InputError(`${arg} needs a value; ${usage}`);
      args[arg.slice(2)] = argv[++i];
    } else if (arg.startsWith('-')) {
      throw new InputError(`unknown option ${arg}; ${usage}`);
    } else if (args.folder === null) {
      args.folder = arg;
    } else {
      throw new InputError(`unexpected argument ${arg}; ${usage}`);
    }
  }
  if (args.folder === null || (args.ids === null) === (args.text === null)) {
    throw new InputError(usage);
  }
  if (args.ids !== null) {
    if (!/^-?\d+(,-?\d+)*$/.test(args.ids.replace(/\s/g, ''))) {
      throw new InputError(`--ids ${args.ids}: expected comma-separated integers`);
    }
    args.ids = args.ids.replace(/\s/g, '').split(',').map(Number);
  }
  if (!/^\d+$/.test(String(args.steps)) || Number(args.steps) < 1) {
    throw new InputError(`--steps ${args.steps}: expected a positive integer`);
  }
  args.steps = Number(args.steps);
  return args;
}

function checkIds(ids, steps, manifest) {
  const { vocab_size: vocab, max_positions: limit } = manifest.card;
  if (ids.length === 0) throw new InputError('an empty prompt: it needs at least one token');
  const bad = ids.find((id) => id < 0 || id >= vocab);
  if (bad !== undefined) {
    throw new InputError(`token ids should be in 0..${vocab - 1}, got ${bad}`);
  }
  if (ids.length > limit) {
    throw new InputError(`prompt of ${ids.length} tokens exceeds max_positions=${limit}`);
  }
  // A decoder attends over prompt + new tokens; the encoder-decoder's target is bos + new tokens.
  const total = manifest.family === 'decoder' ? ids.length + steps : steps + 1;
  if (manifest.family !== 'encoder' && total > limit) {
    throw new InputError(`prompt of ${ids.length} plus ${steps} new tokens exceeds ` +
                         `max_positions=${limit}`);
  }
}

// The cache before the first step: the manifest's cache shape (batch_size, kv_heads, past_sequence_length,
// head_dim) with batch 1 and past length 0.
function emptyPast(manifest, names) {
  const sizes = { batch_size: 1, past_sequence_length: 0 };
  const dims = manifest.cache.shape.map((axis) => sizes[axis] ?? axis);
  const empty = () => new ort.Tensor('float32', new Float32Array(0), dims);
  return Object.fromEntries(names.map((name) => [name, empty()]));
}

// [input, output] name pairs of the cache, from the manifest: present.{i}[.decoder].key/.value
// is fed back as past_key_values.{i}[.decoder].key/.value on the next step. The
// encoder-decoder's cross cache (past_key_values.{i}.encoder.*) is an input the graph does not
// return: it comes from encoder.onnx's present.{i}.encoder.*, once (crossNames).
const toPresent = (name) => name.replace(/^past_key_values\./, 'present.');
function cacheNames(graph) {
  const past = graph.inputs.filter((name) => name.startsWith('past_key_values.'));
  return past.map((name) => [name, toPresent(name)])
    .filter(([, output]) => graph.outputs.includes(output));
}
function crossNames(graph) {
  return graph.inputs.filter((name) => name.startsWith('past_key_values.') &&
                                       !graph.outputs.includes(toPresent(name)))
    .map((name) => [name, toPresent(name)]);
}

// Greedy pick from the last position of logits (1, T, vocab); the first maximum wins, as in numpy.
function argmaxLast(logits) {
  const vocab = logits.dims[2];
  const row = logits.data.subarray((logits.dims[1] - 1) * vocab, logits.dims[1] * vocab);
  let best = 0;
  for (let i = 1; i < vocab; i++) if (row[i] > row[best]) best = i;
  return best;
}

// The decode loop both generating families share: `feedsFor(tokens)` gives the inputs for the
// new tokens besides the cache; each step's presents become the next step's pasts.
// `onToken(token)` sees each token as it comes (to stream the text).
async function greedy(session, manifest, first, steps, feedsFor, cache, onToken) {
  const tokens = [];
  let past = emptyPast(manifest, cache.map(([name]) => name));
  let next = first;
  for (let step = 0; step < steps; step++) {
    const outputs = await session.run({ ...feedsFor(next), ...past });
    past = Object.fromEntries(cache.map(([input, output]) => [input, outputs[output]]));
    const token = argmaxLast(outputs.logits);
    tokens.push(token);
    onToken(token);
    if (token === manifest.card.eos_token_id) break;
    next = [token];
  }
  return tokens;
}

async function runDecoder(folder, manifest, ids, steps, onToken) {
  const file = graphFile(manifest, MODEL_GRAPH);
  const session = await open(folder, file);
  let length = 0; // tokens seen so far (past + new): the mask covers all of them
  const feedsFor = (tokens) => {
    const positions = tokens.map((_, i) => length + i); // no padding: cumsum(mask) - 1
    length += tokens.length;
    return {
      input_ids: int64(tokens, [1, tokens.length]),
      attention_mask: int64(new Array(length).fill(1), [1, length]),
      position_ids: int64(positions, [1, tokens.length]),
    };
  };
  const cache = cacheNames(manifest.graphs[file]);
  return { tokens: await greedy(session, manifest, ids, steps, feedsFor, cache, onToken) };
}

async function runSeq2Seq(folder, manifest, ids, steps, onToken) {
  const encoder = await open(folder, 'encoder.onnx');
  const decoder = await open(folder, 'decoder.onnx');
  const mask = int64(ids.map(() => 1), [1, ids.length]);
  const encoded = await encoder.run({
    input_ids: int64(ids, [1, ids.length]), attention_mask: mask,
  });
  // The encoder runs once; the cross-attention keys/values it returns and the source mask
  // are fed unchanged to every decoder step.
  const cross = Object.fromEntries(crossNames(manifest.graphs['decoder.onnx'])
    .map(([input, output]) => [input, encoded[output]]));
  const feedsFor = (tokens) => ({
    input_ids: int64(tokens, [1, tokens.length]),
    encoder_attention_mask: mask,
    ...cross,
  });
  const cache = cacheNames(manifest.graphs['decoder.onnx']);
  const start = [manifest.card.bos_token_id];
  return { tokens: await greedy(decoder, manifest, start, steps, feedsFor, cache, onToken) };
}

async function runEncoder(folder, manifest, ids) {
  const file = graphFile(manifest, MODEL_GRAPH);
  const session = await open(folder, file);
  const { inputs } = manifest.graphs[file];
  if (!manifest.graphs[file].outputs.includes('pooler_output')) {
    throw new InputError(`${manifest.name}: this encoder has no pooler (card pooler: false)`);
  }
  const feeds = {
    input_ids: int64(ids, [1, ids.length]),
    attention_mask: int64(ids.map(() => 1), [1, ids.length]),
  };
  if (inputs.includes('token_type_ids')) {
    feeds.token_type_ids = int64(ids.map(() => 0), [1, ids.length]); // one segment
  }
  const outputs = await session.run(feeds);
  return { pooled: Array.from(outputs.pooler_output.data) };
}

// --text: the ids of the text, and what to print as tokens come. A decoder's output starts
// with the prompt (it continues it), a translation's does not: as `zoo run --text` prints.
async function textPrompt(folder, manifest, text) {
  const tokenizer = await readTokenizer(folder);
  if (tokenizer === null) {
    throw new InputError(`${folder}: this export has no tokenizer (byte-tokenizer.json or ` +
                         'tokenizer.json); pass token ids with --ids');
  }
  const stream = textStream(tokenizer);
  const write = (piece) => process.stdout.write(piece);
  return {
    // the text with its tokenizer's special tokens (a decoder's BOS, a translation source's
    // </s>), as Python's zoo run
    ids: tokenizer.sequence(text),
    start: () => manifest.family === 'decoder' && write(text),
    onToken: (token) => write(stream.push(token)),
    end: () => write(`${stream.end()}\n`),
  };
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const manifest = await readManifest(args.folder);
  const runners = { decoder: runDecoder, 'encoder-decoder': runSeq2Seq, encoder: runEncoder };
  const run = runners[manifest.family];
  if (!run) throw new InputError(`${args.folder}: unknown family ${manifest.family}`);
  const text = args.text === null ? null : await textPrompt(args.folder, manifest, args.text);
  const ids = text === null ? args.ids : text.ids;
  checkIds(ids, args.steps, manifest);
  if (text === null || manifest.family === 'encoder') { // an encoder's answer is a vector
    console.log(JSON.stringify(await run(args.folder, manifest, ids, args.steps, () => {})));
    return;
  }
  text.start();
  await run(args.folder, manifest, ids, args.steps, text.onToken);
  text.end();
}

main().catch((error) => {
  process.stderr.write(`error: ${firstLine(error)}\n`);
  process.exit(2);
});
