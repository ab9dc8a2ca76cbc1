// Text generation with a zoo decoder or encoder-decoder export in the browser
// (docs/onnx-contract.md): a prompt typed as text, the answer shown as it comes, with the
// tokens/s ONNX Runtime Web gives. The text goes through the export's own tokenizer
// (tokenizer.mjs: byte-tokenizer.json or tokenizer.json, the ids Python gives); token ids can
// still be typed instead (the raw path). An encoder-decoder's source is encoded once: its
// cross-attention keys/values (encoder.onnx's present.*.encoder.*) are fed unchanged to every
// decoder step.
//
// ONNX Runtime Web and @huggingface/tokenizers are served from ./node_modules (npm ci
// --ignore-scripts in this folder); nothing comes from a CDN. Every failure ends on the page
// as one line in #error and body[data-state=error], so a test (check-page.mjs) or a person
// never waits forever.

import { pick, seeded } from './sampling.mjs';
import { golden, loadTokenizer, textStream } from './tokenizer.mjs';

const ORT_DIST = new URL('./node_modules/onnxruntime-web/dist/', import.meta.url);
const TOKENIZERS = new URL('./node_modules/@huggingface/tokenizers/dist/tokenizers.min.mjs',
                           import.meta.url);
const FORMAT_VERSION = 1; // the manifest format this page (and the Python side) reads
const MODEL_GRAPH = 'onnx/model.onnx'; // the encoder's and decoder's graph, where transformers.js looks

const $ = (id) => document.getElementById(id);
const setState = (state, text) => {
  document.body.dataset.state = state;
  $('status').textContent = text;
};

class PageError extends Error {}

let ort; // loaded on first use, so a missing node_modules is reported on the page

async function loadOrt() {
  if (ort) return ort;
  try {
    ort = await import(new URL('ort.wasm.min.mjs', ORT_DIST).href);
  } catch (error) {
    throw new PageError(`could not load ONNX Runtime Web from ${ORT_DIST.pathname} ` +
                        `(run npm ci --ignore-scripts in examples/web): ${error.message}`);
  }
  // A page served over plain http is not cross-origin isolated: no SharedArrayBuffer, so no
  // WASM threads. One thread is also what makes the timings comparable between runs.
  ort.env.wasm.numThreads = 1;
  ort.env.wasm.wasmPaths = ORT_DIST.href;
  ort.env.logLevel = 'error';
  return ort;
}

async function readManifest(folder) {
  const url = new URL('manifest.json', folder);
  let response;
  try {
    response = await fetch(url);
  } catch (error) {
    throw new PageError(`${url}: cannot fetch it: ${error.message}`);
  }
  if (!response.ok) {
    throw new PageError(`${folder}: not an export (no manifest.json: HTTP ${response.status}); ` +
                        'make one with zoo export');
  }
  let manifest;
  try {
    manifest = await response.json();
  } catch (error) {
    throw new PageError(`${url}: not valid JSON: ${error.message}`);
  }
  if (manifest.format_version !== FORMAT_VERSION) {
    throw new PageError(`${url}: format_version=${JSON.stringify(manifest.format_version)}, ` +
                        `this page reads ${FORMAT_VERSION}`);
  }
  if (!['decoder', 'encoder-decoder'].includes(manifest.family)) {
    throw new PageError(`${folder}: a ${manifest.family} export; this page runs decoders and ` +
                        'encoder-decoders (examples/node runs every family)');
  }
  return manifest;
}

function parseIds(text, card) {
  const clean = text.replace(/\s/g, '');
  if (!/^-?\d+(,-?\d+)*$/.test(clean)) {
    throw new PageError(`ids ${text}: expected comma-separated integers`);
  }
  const ids = clean.split(',').map(Number);
  const bad = ids.find((id) => id < 0 || id >= card.vocab_size);
  if (bad !== undefined) {
    throw new PageError(`token ids should be in 0..${card.vocab_size - 1}, got ${bad}`);
  }
  return ids;
}

// A decoder attends over prompt + new tokens; the encoder-decoder's target is bos + new tokens.
function checkPrompt(ids, card, steps, seq2seq) {
  if (ids.length === 0) throw new PageError('an empty prompt: type some text');
  const longest = seq2seq ? Math.max(ids.length, steps + 1) : ids.length + steps;
  if (!(steps >= 1) || longest > card.max_positions) {
    throw new PageError(`prompt of ${ids.length} tokens plus ${steps} new tokens: should be at ` +
                        `least one new token and at most max_positions=${card.max_positions} ` +
                        'in all');
  }
}

// The bytes of one exported file (null for an `optional` one that is not there), checked
// against the manifest's sha256 as the Python side does (a partial copy fails here with its
// name, not deep inside ONNX Runtime). crypto.subtle exists only in secure contexts (https,
// localhost, 127.0.0.1); elsewhere the check is skipped.
async function fetchChecked(url, entry, optional = false) {
  const response = await fetch(url).catch((error) => {
    throw new PageError(`${url}: cannot fetch it: ${error.message}`);
  });
  if (optional && response.status === 404) return null; // an optional file that is not there
  if (!response.ok) {
    throw new PageError(`${url}: HTTP ${response.status} (listed in manifest.json but missing?)`);
  }
  const bytes = new Uint8Array(await response.arrayBuffer());
  if (entry && globalThis.crypto?.subtle) {
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
    if (hex !== entry.sha256) {
      throw new PageError(`${url}: sha256 does not match manifest.json (changed after export)`);
    }
  }
  return bytes;
}

// Integer inputs are int64 (BigInt64Array in JavaScript).
const int64 = (values, dims) => new ort.Tensor('int64', BigInt64Array.from(values, BigInt), dims);

// The logits of the last position of (1, T, vocab): what the next token is picked from.
function lastRow(logits) {
  const vocab = logits.dims[2];
  return logits.data.subarray((logits.dims[1] - 1) * vocab, logits.dims[1] * vocab);
}

// The export's tokenizer (or null): its files fetched from the folder (a 404: not there) and
// checked against the manifest's sha256; the library is loaded only for a tokenizer.json.
async function readTokenizer(folder, manifest) {
  const read = async (name) => {
    const bytes = await fetchChecked(new URL(name, folder).href, manifest.files[name], true);
    return bytes === null ? null : new TextDecoder().decode(bytes);
  };
  const library = () => import(TOKENIZERS.href).then((module) => module.Tokenizer, (error) => {
    throw new PageError(`could not load @huggingface/tokenizers from ${TOKENIZERS.pathname} ` +
                        `(run npm ci --ignore-scripts in examples/web): ${error.message}`);
  });
  try {
    return await loadTokenizer(read, library);
  } catch (error) {
    throw error instanceof PageError ? error : new PageError(`${folder}${error.message}`);
  }
}

// The file that holds the contract graph `name`: a quantized export stores it under
// transformers.js's name for its dtype (onnx/model_q4.onnx), as quantization.stored_as says.
const graphFile = (manifest, name) => manifest.quantization?.stored_as?.[name] ?? name;

// One session per graph (by its contract name); the encoder-decoder's graphs share
// weights.onnx.data, fetched once.
async function openSession(folder, manifest, name, externalData) {
  const file = graphFile(manifest, name);
  const url = new URL(file, folder).href;
  const bytes = await fetchChecked(url, manifest.files[file]);
  try {
    return await ort.InferenceSession.create(bytes, { executionProviders: ['wasm'], externalData });
  } catch (error) {
    throw new PageError(`${url}: ONNX Runtime cannot load it: ${error.message}`);
  }
}

// [input, output] name pairs of the cache the graph returns: present.* fed back as past_key_values.*
function cacheNames(graph) {
  return graph.inputs.filter((name) => name.startsWith('past_key_values.'))
    .map((name) => [name, name.replace(/^past_key_values\./, 'present.')])
    .filter(([, output]) => graph.outputs.includes(output));
}

// weights.onnx.data beside the graph stored as `file`, where the manifest lists it (the
// encoder-decoder's two graphs share it, as do an --optimize'd decoder's in onnx/), as the
// externalData ONNX Runtime Web reads: the graphs name it 'weights.onnx.data'. Undefined where
// the weights are inline.
async function sharedWeights(folder, manifest, file) {
  const name = file.replace(/[^/]*$/, 'weights.onnx.data');
  if (!manifest.files[name]) return undefined;
  const data = await fetchChecked(new URL(name, folder).href, manifest.files[name]);
  return [{ path: 'weights.onnx.data', data }];
}

async function decoderSteps(folder, manifest, ids) {
  const weights = await sharedWeights(folder, manifest, graphFile(manifest, MODEL_GRAPH));
  const session = await openSession(folder, manifest, MODEL_GRAPH, weights);
  let length = 0; // past + new: the attention mask covers all of them (no padding here)
  const feedsFor = (next) => {
    const positions = next.map((_, i) => length + i); // cumsum(mask) - 1 without padding
    length += next.length;
    return {
      input_ids: int64(next, [1, next.length]),
      attention_mask: int64(new Array(length).fill(1), [1, length]),
      position_ids: int64(positions, [1, next.length]),
    };
  };
  return { session, feedsFor, first: ids, graph: manifest.graphs[graphFile(manifest, MODEL_GRAPH)] };
}

async function seq2seqSteps(folder, manifest, ids) {
  const externalData = await sharedWeights(folder, manifest, 'encoder.onnx');
  const encoder = await openSession(folder, manifest, 'encoder.onnx', externalData);
  const session = await openSession(folder, manifest, 'decoder.onnx', externalData);
  const mask = int64(ids.map(() => 1), [1, ids.length]);
  const encoded = await encoder.run({ input_ids: int64(ids, [1, ids.length]),
                                      attention_mask: mask });
  const graph = manifest.graphs['decoder.onnx'];
  const returned = new Set(cacheNames(graph).map(([input]) => input));
  const cross = Object.fromEntries(graph.inputs
    .filter((name) => name.startsWith('past_key_values.') && !returned.has(name))
    .map((name) => [name, encoded[name.replace(/^past_key_values\./, 'present.')]]));
  const feedsFor = (next) => ({
    input_ids: int64(next, [1, next.length]), encoder_attention_mask: mask, ...cross,
  });
  return { session, feedsFor, first: [manifest.card.bos_token_id], graph };
}

// What the form asks for, checked: numbers in range, ids parsed (the raw path) or text.
function readForm() {
  const number = (id, test, expected) => {
    const value = Number($(id).value);
    if ($(id).value.trim() === '' || !test(value)) {
      throw new PageError(`${$(id).labels[0].firstChild.textContent.trim()}: ` +
                          `${JSON.stringify($(id).value)}, expected ${expected}`);
    }
    return value;
  };
  return {
    folder: new URL($('model').value.replace(/\/*$/, '/'), location.href), // files resolve inside
    text: $('text').value,
    ids: $('ids').value.trim(),
    steps: number('steps', (n) => Number.isInteger(n) && n >= 1, 'a whole number >= 1'),
    temperature: number('temperature', (n) => n >= 0, 'a number >= 0 (0: greedy)'),
    topK: number('topk', (n) => Number.isInteger(n) && n >= 0, 'a whole number >= 0 (0: all)'),
    seed: number('seed', Number.isInteger, 'a whole number'),
  };
}

// The prompt's ids, and the text it shows as: typed text goes through the export's tokenizer;
// typed ids (the raw path) are used as they are.
function promptOf(request, tokenizer, card) {
  if (request.ids) {
    const ids = parseIds(request.ids, card);
    return { ids, shown: tokenizer ? tokenizer.decode(ids) : '' };
  }
  if (!tokenizer) {
    throw new PageError(`${request.folder}: this export has no tokenizer (byte-tokenizer.json ` +
                        'or tokenizer.json); type token ids instead');
  }
  // the text with its tokenizer's special tokens (a decoder's BOS, a translation source's
  // </s>), as Python's zoo run
  return { ids: tokenizer.sequence(request.text), shown: request.text };
}

// Hand the browser the turn so the new text is painted (a message, not setTimeout, which
// nested calls stretch to 4 ms).
const paint = () => new Promise((resolve) => {
  const channel = new MessageChannel();
  channel.port1.onmessage = resolve;
  channel.port2.postMessage(null);
});

async function generate(request) {
  setState('loading', 'loading ONNX Runtime Web, the manifest and the tokenizer...');
  await loadOrt();
  const manifest = await readManifest(request.folder);
  const { card } = manifest;
  const seq2seq = manifest.family === 'encoder-decoder';
  const tokenizer = await readTokenizer(request.folder, manifest);
  const { ids, shown } = promptOf(request, tokenizer, card);
  checkPrompt(ids, card, request.steps, seq2seq);
  const { session, feedsFor, first, graph } = await (seq2seq ? seq2seqSteps : decoderSteps)(
    request.folder, manifest, ids);

  // A decoder's text continues the prompt (shown first, as `zoo run --text` prints it); a
  // translation's does not. Without a tokenizer the raw path shows the ids.
  $('prompt').textContent = seq2seq ? '' : shown;
  const stream = tokenizer ? textStream(tokenizer) : { push: (id) => `${id} `, end: () => '' };
  const run = { tokens: [], stepMs: [] };
  window.zooRun = run;
  const random = seeded(request.seed);

  // First step: the whole prompt (or the start token), past length 0: cache tensors of the
  // manifest's cache shape (batch_size, kv_heads, past_sequence_length, head_dim) with batch 1, past 0.
  const cache = cacheNames(graph);
  const sizes = { batch_size: 1, past_sequence_length: 0 };
  const dims = manifest.cache.shape.map((axis) => sizes[axis] ?? axis);
  let past = Object.fromEntries(cache.map(([name]) =>
    [name, new ort.Tensor('float32', new Float32Array(0), dims)]));
  let next = first;
  setState('running', `generating up to ${request.steps} tokens (${manifest.name})...`);
  for (let step = 0; step < request.steps; step++) {
    const feeds = { ...feedsFor(next), ...past };
    const start = performance.now(); // around the awaited run: what a token costs
    const outputs = await session.run(feeds);
    const token = pick(lastRow(outputs.logits), request, random);
    run.stepMs.push(performance.now() - start);
    past = Object.fromEntries(cache.map(([input, output]) => [input, outputs[output]]));
    if (step === 0 && !seq2seq) showAttention(graph, outputs, ids, card);
    run.tokens.push(token);
    $('generated').textContent += stream.push(token);
    showSpeed(run, seq2seq ? 'source' : 'prompt', ids.length, false);
    if (token === card.eos_token_id) break;
    next = [token];
    await paint();
  }
  $('generated').textContent += stream.end();
  showSpeed(run, seq2seq ? 'source' : 'prompt', ids.length, true);
}

// Tokens/s from the measured steps: the first step reads the whole prompt, so it is shown on
// its own and the rate is that of the steps after it (one new token each).
function showSpeed(run, what, length, done) {
  const [first, ...later] = run.stepMs;
  const laterMs = later.reduce((a, b) => a + b, 0);
  run.tokensPerSecond = later.length && laterMs > 0 ? (1000 * later.length) / laterMs : null;
  run.totalMs = first + laterMs;
  const rate = run.tokensPerSecond === null ? '' : `, then ${run.tokensPerSecond.toFixed(1)} ` +
    `tokens/s (${(laterMs / later.length).toFixed(2)} ms per token)`;
  setState(done ? 'done' : 'running', `${run.tokens.length} tokens; first step (${what} of ` +
           `${length} tokens) ${first.toFixed(1)} ms${rate}`);
}

// An export made with --attentions also outputs attentions.{i} (1, H, T, T) for the prompt:
// draw the last layer's heads as heatmaps (rows: queries, columns: keys; darker = more weight)
// and keep the numbers drawn in window.zooAttention, so a test can compare them with Python's.
function showAttention(graph, outputs, ids, card) {
  const layer = card.n_layers - 1;
  const name = `attentions.${layer}`;
  if (!graph.outputs.includes(name)) return;
  const tensor = outputs[name];
  const [, heads, queries, keys] = tensor.dims;
  const maps = [];
  const box = $('attention');
  box.replaceChildren();
  const cell = Math.max(4, Math.min(24, Math.floor(240 / keys)));
  for (let head = 0; head < heads; head++) {
    const rows = [];
    for (let q = 0; q < queries; q++) {
      const start = (head * queries + q) * keys;
      rows.push(Array.from(tensor.data.subarray(start, start + keys)));
    }
    maps.push(rows);
    const figure = document.createElement('figure');
    const canvas = document.createElement('canvas');
    canvas.width = keys * cell;
    canvas.height = queries * cell;
    const context = canvas.getContext('2d');
    rows.forEach((row, q) => row.forEach((weight, k) => {
      const shade = Math.round(255 * (1 - weight));
      context.fillStyle = `rgb(${shade}, ${shade}, 255)`;
      context.fillRect(k * cell, q * cell, cell, cell);
    }));
    const caption = document.createElement('figcaption');
    caption.textContent = `layer ${layer} head ${head}`;
    figure.append(canvas, caption);
    box.append(figure);
  }
  $('attention-title').textContent = `attention of the prompt (${ids.join(', ')}), ` +
    `layer ${layer}: rows are queries, columns keys`;
  window.zooAttention = { layer, tokens: ids, heads: maps };
}

function showError(error) {
  const text = String(error?.message ?? error).trim().split('\n')[0];
  $('error').textContent = `error: ${text}`;
  setState('error', 'failed');
}

async function start() {
  for (const id of ['prompt', 'generated', 'attention-title', 'error']) $(id).textContent = '';
  $('attention').replaceChildren();
  window.zooAttention = null;
  window.zooRun = null;
  $('generate').disabled = true;
  try {
    await generate(readForm());
  } catch (error) {
    showError(error);
  } finally {
    $('generate').disabled = false;
  }
}

// Anything that escapes (a rejected promise inside ONNX Runtime, say) still reaches the page.
window.addEventListener('error', (event) => showError(event.error ?? event.message));
window.addEventListener('unhandledrejection', (event) => showError(event.reason));

$('form').addEventListener('submit', (event) => {
  event.preventDefault();
  start();
});

// For the golden tests (check-page.mjs --golden): the page's tokenizer, read from the folder
// in the form, encodes texts and decodes id lists. The folder may hold only tokenizer files.
window.zooGolden = async (input) => {
  const tokenizer = await readTokenizer(readForm().folder, { files: {} });
  return tokenizer && { kind: tokenizer.kind, ...golden(tokenizer, input) };
};

// URL parameters fill the form (?model=...&text=...&run=1 starts at once).
const params = new URLSearchParams(location.search);
for (const field of ['model', 'text', 'ids', 'steps', 'temperature', 'topk', 'seed']) {
  if (params.has(field)) $(field).value = params.get(field);
}
if (params.get('run') === '1') start();
