// A zoo export in the browser through transformers.js (@huggingface/transformers), loaded by
// URL as the Hugging Face model folder it is: no zoo code runs here, only transformers.js's own
// tokenizer, pipelines and generate(). The task is the one the folder's config names:
//
//   config.json with id2label                     text-classification: each line's labels
//   sentence-transformers' modules.json           feature-extraction: each line's vector, by
//                                                  1_Pooling's mode (and Normalize), and the
//                                                  cosine similarity of every pair
//   architectures *ForCausalLM / *LMHeadModel     text-generation: greedy, text as it comes
//   is_encoder_decoder, *MTModel, *ForConditionalGeneration
//                                                  translation: each line, through the
//                                                  seq2seq layout (onnx/encoder_model.onnx +
//                                                  decoder_model_merged.onnx: a MarianMT
//                                                  import's export; the paper's Transformer
//                                                  cards have no config.json)
//
// `dtype` left empty is config.json's transformers.js_config.dtype: the graph the export holds
// (fp32 onnx/model.onnx, or a quantized export's onnx/model_q4.onnx, ...). Timings are
// performance.now() around transformers.js's awaited calls. transformers.js and the WASM of the
// ONNX Runtime Web it bundles are served from ./node_modules; nothing comes from a CDN or the
// Hub. Every failure ends on the page as one line in #error and body[data-state=error].

const TRANSFORMERS = new URL('./node_modules/@huggingface/transformers/dist/transformers.min.js',
                             import.meta.url);
// The ONNX Runtime Web version transformers.js bundles (its own dependency, so nested under it
// here): its JavaScript is in transformers.min.js, its WASM is fetched from wasmPaths.
const ORT_WASM = new URL('./node_modules/@huggingface/transformers/node_modules/onnxruntime-web/' +
                         'dist/', import.meta.url);

const $ = (id) => document.getElementById(id);
const setState = (state, text) => {
  document.body.dataset.state = state;
  $('status').textContent = text;
};

class PageError extends Error {}

let hf; // transformers.js, loaded on first use so a missing node_modules shows on the page

async function loadTransformers() {
  if (hf) return hf;
  try {
    hf = await import(TRANSFORMERS.href);
  } catch (error) {
    throw new PageError(`could not load transformers.js from ${TRANSFORMERS.pathname} ` +
                        `(run npm ci --ignore-scripts in examples/web): ${error.message}`);
  }
  hf.env.allowRemoteModels = false; // the folder at the URL, never the Hub
  hf.env.allowLocalModels = true;
  hf.env.useBrowserCache = false; // a re-exported folder is read again, not an old copy
  const wasm = hf.env.backends.onnx.wasm;
  wasm.wasmPaths = { mjs: new URL('ort-wasm-simd-threaded.asyncify.mjs', ORT_WASM).href,
                     wasm: new URL('ort-wasm-simd-threaded.asyncify.wasm', ORT_WASM).href };
  // Plain http is not cross-origin isolated (no SharedArrayBuffer); one thread also keeps the
  // timings comparable with the ONNX Runtime Web page (index.html).
  wasm.numThreads = 1;
  return hf;
}

async function fetchJson(url, optional = false) {
  let response;
  try {
    response = await fetch(url);
  } catch (error) {
    throw new PageError(`${url}: cannot fetch it: ${error.message}`);
  }
  if (response.status === 404 && optional) return null;
  if (!response.ok) throw new PageError(`${url}: HTTP ${response.status}`);
  try {
    return await response.json();
  } catch (error) {
    throw new PageError(`${url}: not valid JSON: ${error.message}`);
  }
}

// The folder's task and what it needs, from its config (table at the top).
async function taskOf(folder) {
  const configUrl = new URL('config.json', folder);
  const config = await fetchJson(configUrl, true);
  if (config === null) {
    throw new PageError(`${configUrl}: HTTP 404: not a Hugging Face model folder (zoo export ` +
                        'writes config.json where a transformers layout computes the card, ' +
                        'and says why where it does not)');
  }
  if (config.id2label) return { task: 'text-classification' };
  const modules = await fetchJson(new URL('modules.json', folder), true);
  if (modules) return { task: 'feature-extraction', ...await poolingOf(folder, modules) };
  const architecture = config.architectures?.[0] ?? '';
  if (/(ForCausalLM|LMHeadModel)$/.test(architecture)) return { task: 'text-generation' };
  if (config.is_encoder_decoder || /(MTModel|ForConditionalGeneration)$/.test(architecture)) {
    return { task: 'translation' };
  }
  throw new PageError(`${configUrl}: names no task this page runs (architectures: ` +
                      `${architecture || 'none'}; no id2label, no modules.json)`);
}

// sentence-transformers' Pooling module as transformers.js's feature-extraction options.
async function poolingOf(folder, modules) {
  const pooling = modules.find((module) => module.type?.endsWith('.Pooling'));
  const url = new URL(`${pooling?.path ?? '1_Pooling'}/config.json`, folder);
  const config = await fetchJson(url);
  const mode = config.pooling_mode_mean_tokens ? 'mean' : config.pooling_mode_cls_token ? 'cls'
    : config.pooling_mode_lasttoken ? 'last_token' : null;
  if (mode === null) throw new PageError(`${url}: no pooling mode transformers.js computes`);
  return { pooling: mode, normalize: modules.some((m) => m.type?.endsWith('.Normalize')) };
}

function readForm() {
  const folder = $('model').value.trim();
  const steps = Number($('steps').value);
  if (!folder) throw new PageError('give the export folder URL');
  if (!Number.isInteger(steps) || steps < 1) {
    throw new PageError(`new tokens should be a whole number >= 1, got ${$('steps').value}`);
  }
  return { folder: new URL(folder.endsWith('/') ? folder : `${folder}/`, location.href),
           text: $('text').value, steps, dtype: $('dtype').value || undefined };
}

const lines = (text) => {
  const found = text.split('\n').map((line) => line.trim()).filter(Boolean);
  if (found.length === 0) throw new PageError('give at least one line of text');
  return found;
};

// The dtype transformers.js opened each graph in: one, or per graph where they differ.
function dtypeOf(model) {
  const sessions = Object.entries(model.sessions);
  const dtypes = new Set(sessions.map(([, session]) => session.config.dtype));
  return dtypes.size === 1 ? [...dtypes][0]
    : sessions.map(([name, session]) => `${name} ${session.config.dtype}`).join(', ');
}

const elapsed = (start) => performance.now() - start;
const dot = (a, b) => a.reduce((sum, value, i) => sum + value * b[i], 0);
const fixed = (ms) => `${ms.toFixed(1)} ms`;

// Greedy generation with transformers.js's generate(), the text streamed as tokens come; each
// token's time is taken in the streamer's callback.
async function generate(id, request, options) {
  const started = performance.now();
  const tokenizer = await hf.AutoTokenizer.from_pretrained(id);
  const model = await hf.AutoModelForCausalLM.from_pretrained(id, options);
  const loadMs = elapsed(started);
  const inputs = tokenizer(request.text);
  const promptLength = inputs.input_ids.dims.at(-1);
  $('prompt').textContent = request.text;
  const times = [];
  const streamer = new hf.TextStreamer(tokenizer, {
    skip_prompt: true, skip_special_tokens: true,
    callback_function: (piece) => { $('generated').textContent += piece; },
    token_callback_function: () => times.push(performance.now()),
  });
  const begun = performance.now();
  const output = await model.generate({ ...inputs, max_new_tokens: request.steps,
                                        do_sample: false, streamer });
  const tokens = Array.from(output.data, Number);
  const firstMs = times[0] - begun;
  const rest = times.length - 1;
  const tokensPerSecond = rest > 0 ? (1000 * rest) / (times.at(-1) - times[0]) : null;
  const speed = tokensPerSecond === null ? '' : `, then ${tokensPerSecond.toFixed(1)} tokens/s ` +
    `(${(1000 / tokensPerSecond).toFixed(2)} ms per token)`;
  return {
    tokens, text: tokenizer.decode(tokens, { skip_special_tokens: true }), loadMs,
    firstMs, tokensPerSecond, totalMs: elapsed(started), dtype: dtypeOf(model),
    status: `${times.length} tokens: first ${fixed(firstMs)} (prompt of ${promptLength} ` +
            `tokens)${speed}`,
  };
}

// One text at a time, as a person types them (int8-dynamic's scales depend on the batch).
async function eachLine(id, task, request, options, call) {
  const texts = lines(request.text);
  const started = performance.now();
  const runner = await hf.pipeline(task, id, options);
  const loadMs = elapsed(started);
  const results = [];
  const ms = [];
  for (const text of texts) {
    const begun = performance.now();
    results.push(await call(runner, text));
    ms.push(elapsed(begun));
  }
  const runMs = ms.reduce((a, b) => a + b, 0);
  return { texts, results, ms, loadMs, totalMs: elapsed(started), dtype: dtypeOf(runner.model),
           status: `${texts.length} texts in ${fixed(runMs)} (${ms.map(fixed).join(', ')})` };
}

async function embed(id, request, options, { pooling, normalize }) {
  const run = await eachLine(id, 'feature-extraction', request, options,
                             async (extractor, text) => Array.from(
                               (await extractor(text, { pooling, normalize })).data));
  const vectors = run.results;
  const norms = vectors.map((v) => Math.sqrt(dot(v, v)));
  const cosine = vectors.map((a, i) => vectors.map(
    (b, j) => dot(a, b) / (Math.max(norms[i], 1e-12) * Math.max(norms[j], 1e-12))));
  showTable(run.texts, cosine);
  return { ...run, vectors, cosine, pooling, normalize,
           status: `${run.status}; ${pooling} pooling${normalize ? ', normalized' : ''}` };
}

async function classify(id, request, options) {
  const run = await eachLine(id, 'text-classification', request, options,
                             (classifier, text) => classifier(text, { top_k: null }));
  const scores = run.results.map((ranked) => Object.fromEntries(
    ranked.map(({ label, score }) => [label, score])));
  $('generated').textContent = run.texts.map((text, i) => `${text}\n  ` + run.results[i]
    .map(({ label, score }) => `${label} ${score.toFixed(3)}`).join(', ')).join('\n');
  return { ...run, labels: run.results.map((ranked) => ranked[0].label), scores };
}

// An encoder-decoder: transformers.js's translation pipeline on each line.
async function translate(id, request, options) {
  const run = await eachLine(id, 'translation', request, options,
                             async (translator, text) => (await translator(
                               text, { max_new_tokens: request.steps }))[0].translation_text);
  $('generated').textContent = run.texts.map((text, i) => `${text}\n  ${run.results[i]}`)
    .join('\n');
  return { ...run, translations: run.results };
}

function showTable(texts, cosine) {
  const table = document.createElement('table');
  const head = table.insertRow();
  head.insertCell().textContent = 'cosine';
  texts.forEach((_, j) => { head.insertCell().textContent = `[${j}]`; });
  cosine.forEach((row, i) => {
    const tr = table.insertRow();
    tr.insertCell().textContent = `[${i}] ${texts[i]}`;
    row.forEach((value) => { tr.insertCell().textContent = value.toFixed(4); });
  });
  $('similarity').replaceChildren(table);
}

async function run(request) {
  await loadTransformers();
  const found = await taskOf(request.folder);
  // transformers.js finds a model as localModelPath + id: the folder's parent and its name.
  hf.env.localModelPath = new URL('..', request.folder).pathname;
  const id = decodeURIComponent(request.folder.pathname.split('/').at(-2));
  const options = { dtype: request.dtype, device: 'wasm' };
  setState('running', `${found.task}: loading ${request.folder.pathname} with transformers.js ` +
                      `${hf.env.version}...`);
  const result = found.task === 'text-generation' ? await generate(id, request, options)
    : found.task === 'feature-extraction' ? await embed(id, request, options, found)
      : found.task === 'text-classification' ? await classify(id, request, options)
        : await translate(id, request, options);
  window.zooRun = { task: found.task, ...result };
  setState('done', `${found.task}, transformers.js ${hf.env.version}, WASM (1 thread), dtype ` +
                   `${result.dtype}: loaded in ${fixed(result.loadMs)}; ${result.status}`);
}

function showError(error) {
  const message = String(error?.message ?? error).trim().split('\n')[0];
  $('error').textContent = `error: ${message}`;
  setState('error', 'failed');
}

async function start() {
  $('error').textContent = '';
  $('prompt').textContent = '';
  $('generated').textContent = '';
  $('similarity').replaceChildren();
  window.zooRun = null;
  try {
    await run(readForm());
  } catch (error) {
    showError(error);
  }
}

// URL parameters fill the form (model, text: one per line or repeated, steps, dtype); run=1
// starts at once.
const params = new URLSearchParams(location.search);
for (const field of ['model', 'steps', 'dtype']) {
  if (params.has(field)) $(field).value = params.get(field);
}
if (params.has('text')) $('text').value = params.getAll('text').join('\n');
$('form').addEventListener('submit', (event) => {
  event.preventDefault();
  start();
});
if (params.get('run') === '1') start();
