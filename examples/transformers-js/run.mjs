// Loads a zoo export folder with transformers.js, as a Hugging Face model folder: nothing added
// or edited (config.json, the tokenizer files and onnx/model.onnx are the export's own).
//
//   node run.mjs FOLDER text-generation --text "ROMEO:" [--max-new-tokens 32]
//   node run.mjs FOLDER feature-extraction --text A --text B [--pooling mean] [--normalize]
//   node run.mjs FOLDER text-classification --text A --text B
//   node run.mjs FOLDER translation --text A --text B [--max-new-tokens 32]
//   node run.mjs FOLDER fill-mask --text "A <|mask|> B"
//   node run.mjs FOLDER image-classification --image a.png --image b.jpg
//   node run.mjs FOLDER zero-shot-image-classification --image a.png --label cat --label dog
//                [--template "a photo of a {}."]
//   node run.mjs FOLDER automatic-speech-recognition --audio a.wav [--language en] [--timestamps]
//
// `--dtype q4` (or q8, int8, fp32) is handed to transformers.js, which then opens
// onnx/model_q4.onnx (a translation model: onnx/encoder_model_q4.onnx and
// onnx/decoder_model_merged_q4.onnx); without it, config.json's transformers.js_config.dtype
// decides.
//
// Prints one JSON object: generation's `tokens` (prompt and new ids) and `text`; the
// embeddings' `vectors`; the classifier's `labels` (each text's best) and `scores` (every
// label's probability, by label); translation's `inputs` (each text's source ids), `tokens`
// (its new ids, from AutoModelForSeq2SeqLM.generate) and `texts` (the `translation` pipeline's);
// fill-mask's `tokens` and `scores` (each text's five likeliest ids at the mask, best first);
// image-classification's `labels` (each image's best) and `scores` (every label's probability,
// by label), the images read and preprocessed by transformers.js from preprocessor_config.json;
// zero-shot-image-classification's the same, over the --label texts (a CLIP or SigLIP export).
// automatic-speech-recognition's `tokens` (each 16-bit PCM mono WAV's ids from
// AutoModelForSpeechSeq2Seq.generate, the forced prompt first) and `texts` (the pipeline's), the
// features made by transformers.js from preprocessor_config.json.
// Errors: one line on stderr, exit 1.

import { readFileSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import {
  AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq, AutoProcessor,
  AutoTokenizer, env, pipeline,
} from '@huggingface/transformers';

const TASKS = ['text-generation', 'feature-extraction', 'text-classification', 'translation',
               'fill-mask', 'image-classification', 'zero-shot-image-classification',
               'automatic-speech-recognition'];

function parse(argv) {
  const [folder, task, ...rest] = argv;
  if (!folder || !TASKS.includes(task)) {
    throw new Error(`usage: node run.mjs FOLDER (${TASKS.join('|')}) --text TEXT ...`);
  }
  const args = { folder: resolve(folder), task, texts: [], images: [], labels: [], audio: [],
                 template: '{}', maxNewTokens: 32, pooling: 'mean', normalize: false,
                 options: {}, language: null, timestamps: false };
  for (let i = 0; i < rest.length; i++) {
    const flag = rest[i];
    if (flag === '--text') args.texts.push(rest[++i]);
    else if (flag === '--image') args.images.push(resolve(rest[++i]));
    else if (flag === '--label') args.labels.push(rest[++i]);
    else if (flag === '--template') args.template = rest[++i];
    else if (flag === '--audio') args.audio.push(resolve(rest[++i]));
    else if (flag === '--language') args.language = rest[++i];
    else if (flag === '--timestamps') args.timestamps = true;
    else if (flag === '--max-new-tokens') args.maxNewTokens = Number(rest[++i]);
    else if (flag === '--pooling') args.pooling = rest[++i];
    else if (flag === '--normalize') args.normalize = true;
    else if (flag === '--dtype') args.options.dtype = rest[++i];
    else throw new Error(`unknown option ${flag}`);
  }
  if (task.endsWith('image-classification')) {
    if (args.images.length === 0) throw new Error('give at least one --image');
  } else if (task === 'automatic-speech-recognition') {
    if (args.audio.length === 0) throw new Error('give at least one --audio');
  } else if (args.texts.length === 0) throw new Error('give at least one --text');
  return args;
}

async function generate(id, { texts, maxNewTokens, options }) {
  const tokenizer = await AutoTokenizer.from_pretrained(id);
  const model = await AutoModelForCausalLM.from_pretrained(id, options);
  const inputs = tokenizer(texts[0]);
  const output = await model.generate({ ...inputs, max_new_tokens: maxNewTokens,
                                        do_sample: false });
  const tokens = Array.from(output.data, Number);
  return { tokens, text: tokenizer.decode(tokens, { skip_special_tokens: true }) };
}

async function embed(id, { texts, pooling, normalize, options }) {
  const extractor = await pipeline('feature-extraction', id, options);
  const vectors = [];
  for (const text of texts) { // one at a time: no padding, each row its own length
    const output = await extractor(text, { pooling, normalize });
    vectors.push(Array.from(output.data));
  }
  return { vectors };
}

async function classify(id, { texts, options }) {
  const classifier = await pipeline('text-classification', id, options);
  const labels = [];
  const scores = [];
  for (const text of texts) {
    const ranked = await classifier(text, { top_k: null });
    labels.push(ranked[0].label);
    scores.push(Object.fromEntries(ranked.map(({ label, score }) => [label, score])));
  }
  return { labels, scores };
}

async function classifyImages(id, { images, options }) {
  const classifier = await pipeline('image-classification', id, options);
  const labels = [];
  const scores = [];
  for (const image of images) {
    const ranked = await classifier(image, { top_k: null });
    labels.push(ranked[0].label);
    scores.push(Object.fromEntries(ranked.map(({ label, score }) => [label, score])));
  }
  return { labels, scores };
}

async function zeroShot(id, { images, labels, template, options }) {
  const classifier = await pipeline('zero-shot-image-classification', id, options);
  const best = [];
  const scores = [];
  for (const image of images) {
    const ranked = await classifier(image, labels, { hypothesis_template: template });
    best.push(ranked[0].label);
    scores.push(Object.fromEntries(ranked.map(({ label, score }) => [label, score])));
  }
  return { labels: best, scores };
}

async function fillMask(id, { texts, options }) {
  const unmasker = await pipeline('fill-mask', id, options);
  const tokens = [];
  const scores = [];
  for (const text of texts) { // each text holds the tokenizer's mask token once
    const ranked = await unmasker(text, { top_k: 5 });
    tokens.push(ranked.map(({ token }) => token));
    scores.push(ranked.map(({ score }) => score));
  }
  return { tokens, scores };
}

async function translate(id, { texts, maxNewTokens, options }) {
  const tokenizer = await AutoTokenizer.from_pretrained(id);
  const model = await AutoModelForSeq2SeqLM.from_pretrained(id, options);
  const translator = await pipeline('translation', id, options);
  const inputs = [];
  const tokens = [];
  const translations = [];
  for (const text of texts) { // one at a time: no padding, each source its own length
    const source = tokenizer(text);
    inputs.push(Array.from(source.input_ids.data, Number));
    const output = await model.generate({ ...source, max_new_tokens: maxNewTokens,
                                          do_sample: false });
    tokens.push(Array.from(output.data, Number).slice(1)); // [0]: the decoder's start token
    const [result] = await translator(text, { max_new_tokens: maxNewTokens, do_sample: false });
    translations.push(result.translation_text);
  }
  return { inputs, tokens, texts: translations };
}

function readWav(path) {
  // a 16-bit PCM mono WAV's samples in [-1, 1] (Node has no AudioContext to decode with)
  const data = readFileSync(path);
  let offset = 12;
  let format = null;
  while (offset + 8 <= data.length) {
    const id = data.toString('ascii', offset, offset + 4);
    const size = data.readUInt32LE(offset + 4);
    if (id === 'fmt ') format = { channels: data.readUInt16LE(offset + 10),
                                  bits: data.readUInt16LE(offset + 22) };
    if (id === 'data') {
      if (!format || format.channels !== 1 || format.bits !== 16) {
        throw new Error(`${path}: give a 16-bit PCM mono WAV`);
      }
      const samples = new Float32Array(size / 2);
      for (let i = 0; i < samples.length; i++) {
        samples[i] = data.readInt16LE(offset + 8 + 2 * i) / 32768;
      }
      return samples;
    }
    offset += 8 + size + (size % 2);
  }
  throw new Error(`${path}: no data chunk`);
}

async function transcribe(id, { audio, maxNewTokens, language, timestamps, options }) {
  const processor = await AutoProcessor.from_pretrained(id);
  const model = await AutoModelForSpeechSeq2Seq.from_pretrained(id, options);
  const recognizer = await pipeline('automatic-speech-recognition', id, options);
  const tokens = [];
  const texts = [];
  for (const path of audio) {
    const samples = readWav(path);
    const { input_features: features } = await processor(samples);
    const output = await model.generate({ inputs: features, language, task: 'transcribe',
                                          return_timestamps: timestamps,
                                          max_new_tokens: maxNewTokens, do_sample: false });
    tokens.push(Array.from(output.data, Number));
    const result = await recognizer(samples, { language, task: 'transcribe',
                                               return_timestamps: timestamps,
                                               max_new_tokens: maxNewTokens });
    texts.push(result.text);
  }
  return { tokens, texts };
}

async function main() {
  const args = parse(process.argv.slice(2));
  env.allowRemoteModels = false; // only the folder: nothing is fetched
  env.localModelPath = `${dirname(args.folder)}/`;
  const id = basename(args.folder);
  const run = { 'text-generation': generate, 'feature-extraction': embed,
               'text-classification': classify, translation: translate,
               'fill-mask': fillMask, 'image-classification': classifyImages,
               'zero-shot-image-classification': zeroShot,
               'automatic-speech-recognition': transcribe }[args.task];
  const result = await run(id, args);
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

main().catch((error) => {
  process.stderr.write(`${String(error?.message ?? error).split('\n')[0]}\n`);
  process.exit(1);
});
