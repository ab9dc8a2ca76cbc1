// Run a zoo export that has a sentence vector (a card with pooling) with onnxruntime-node,
// following docs/onnx-contract.md ("Sentence vectors and classifiers"):
//
//   node classify.mjs FOLDER --text "Either you must" [--text "Or be accused" ...]
//   node classify.mjs FOLDER --ids 72,101,108 [--ids 5,6,7 ...]
//
// -> {"embeddings": [[...]], "norms": [...], "cosine": [[...]]
//     [, "labels": [...], "probabilities": [[...]]]}     (what `zoo run FOLDER --json` prints)
//
// The rows are padded on the right with the card's pad_token_id (mask 0) into one batch.
// --text goes through the folder's tokenizer (text.mjs), as `zoo run --text` does.
// Bad input prints ONE line `error: ...` on stderr and exits with code 2, like the zoo CLI.

import {
  InputError, MODEL_GRAPH, firstLine, graphFile, int64, open, readManifest,
} from './contract.mjs';
import { readTokenizer } from './text.mjs';

function parseArgs(argv) {
  const usage = 'usage: node classify.mjs FOLDER (--text TEXT ... | --ids 1,2,3 ...)';
  const args = { folder: null, rows: [], texts: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--text') {
      if (i + 1 >= argv.length) throw new InputError(`--text needs a value; ${usage}`);
      args.texts.push(argv[++i]);
    } else if (arg === '--ids') {
      if (i + 1 >= argv.length) throw new InputError(`--ids needs a value; ${usage}`);
      const text = argv[++i].replace(/\s/g, '');
      if (!/^\d+(,\d+)*$/.test(text)) {
        throw new InputError(`--ids ${text}: expected comma-separated integers`);
      }
      args.rows.push(text.split(',').map(Number));
    } else if (arg.startsWith('-')) {
      throw new InputError(`unknown option ${arg}; ${usage}`);
    } else if (args.folder === null) {
      args.folder = arg;
    } else {
      throw new InputError(`unexpected argument ${arg}; ${usage}`);
    }
  }
  if (args.folder === null || (args.rows.length === 0) === (args.texts.length === 0)) {
    throw new InputError(usage);
  }
  return args;
}

// (B, T) ids and mask, each row padded on the right: mean and last pooling read the mask.
function batch(rows, card) {
  const width = Math.max(...rows.map((row) => row.length));
  const ids = rows.flatMap((row) => [...row, ...Array(width - row.length).fill(card.pad_token_id)]);
  const mask = rows.flatMap((row) => [...row.map(() => 1), ...Array(width - row.length).fill(0)]);
  return { ids, mask, dims: [rows.length, width] };
}

// Row-wise softmax of (B, L) logits, in double precision as the Python side computes it.
function softmax(logits) {
  const [rows, count] = logits.dims;
  return Array.from({ length: rows }, (_, r) => {
    const row = Array.from(logits.data.subarray(r * count, (r + 1) * count));
    const top = Math.max(...row);
    const shifted = row.map((value) => Math.exp(value - top));
    const total = shifted.reduce((a, b) => a + b, 0);
    return shifted.map((value) => value / total);
  });
}

function rowsOf(tensor) {
  const [rows, size] = tensor.dims;
  return Array.from({ length: rows }, (_, r) => Array.from(tensor.data.subarray(r * size, (r + 1) * size)));
}

const dot = (a, b) => a.reduce((sum, value, i) => sum + value * b[i], 0);

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const manifest = await readManifest(args.folder);
  const { card } = manifest;
  const file = graphFile(manifest, MODEL_GRAPH);
  const graph = manifest.graphs[file];
  if (!graph || !graph.outputs.includes('sentence_embedding')) {
    throw new InputError(`${args.folder}: no sentence_embedding output (a card with pooling)`);
  }
  if (args.texts.length) {
    const tokenizer = await readTokenizer(args.folder);
    if (tokenizer === null) {
      throw new InputError(`${args.folder}: this export has no tokenizer; pass ids with --ids`);
    }
    args.rows = args.texts.map((text) => tokenizer.sequence(text)); // as Python's sequences
    if (args.rows.some((row) => row.length === 0)) throw new InputError('an empty --text');
  }
  const bad = args.rows.flat().find((id) => id >= card.vocab_size);
  if (bad !== undefined) throw new InputError(`token ids should be < ${card.vocab_size}, got ${bad}`);
  const { ids, mask, dims } = batch(args.rows, card);
  const feeds = { input_ids: int64(ids, dims), attention_mask: int64(mask, dims) };
  if (graph.inputs.includes('token_type_ids')) feeds.token_type_ids = int64(ids.map(() => 0), dims);
  const session = await open(args.folder, file);
  const outputs = await session.run(feeds);
  const embeddings = rowsOf(outputs.sentence_embedding);
  const norms = embeddings.map((vector) => Math.sqrt(dot(vector, vector)));
  const cosine = embeddings.map((a, i) => embeddings.map(
    (b, j) => dot(a, b) / (Math.max(norms[i], 1e-12) * Math.max(norms[j], 1e-12))));
  const result = { embeddings, norms, cosine };
  if (card.num_labels > 0) {
    result.labels = card.labels ?? Array.from({ length: card.num_labels }, (_, i) => `LABEL_${i}`);
    result.probabilities = softmax(outputs.logits);
  }
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  process.stderr.write(`error: ${firstLine(error)}\n`);
  process.exit(2);
});
