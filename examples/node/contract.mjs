// What every program that runs a zoo export needs (docs/onnx-contract.md): the manifest,
// checked as the Python side checks it, int64 tensors, sessions, one-line errors.

import { createHash } from 'node:crypto';
import { createReadStream, existsSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import ort from 'onnxruntime-node';

export const FORMAT_VERSION = 1; // the manifest format this program (and the Python side) reads
export const MODEL_GRAPH = 'onnx/model.onnx'; // the encoder's and decoder's graph, where transformers.js looks

export class InputError extends Error {}

// The file that holds the contract graph `name`: the name itself, or where a quantized export
// stores it under transformers.js's name for its dtype (onnx/model_q4.onnx), as the manifest's
// quantization.stored_as records (docs/onnx-contract.md, section 1).
export const graphFile = (manifest, name) => manifest.quantization?.stored_as?.[name] ?? name;

async function sha256(path) {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk);
  return hash.digest('hex');
}

// The manifest, after the same checks the Python side makes: it exists, is format 1, and
// every file it lists is present with the recorded sha256 (a partial copy fails here, not
// deep inside ONNX Runtime).
export async function readManifest(folder) {
  if (!existsSync(folder) || !statSync(folder).isDirectory()) {
    throw new InputError(`${folder}: no such folder`);
  }
  const path = join(folder, 'manifest.json');
  if (!existsSync(path)) {
    throw new InputError(`${folder}: not an export (no manifest.json); make one with zoo export`);
  }
  let manifest;
  try {
    manifest = JSON.parse(readFileSync(path, 'utf8'));
  } catch (error) {
    throw new InputError(`${path}: not valid JSON: ${error.message}`);
  }
  if (manifest.format_version !== FORMAT_VERSION) {
    throw new InputError(`${path}: format_version=${JSON.stringify(manifest.format_version)}, ` +
                         `this program reads ${FORMAT_VERSION}`);
  }
  for (const field of ['family', 'card', 'graphs', 'files']) {
    if (!manifest[field]) throw new InputError(`${path}: field '${field}' missing`);
  }
  for (const [name, entry] of Object.entries(manifest.files)) {
    const file = join(folder, name);
    if (!existsSync(file)) throw new InputError(`${file}: listed in manifest.json but missing`);
    if ((await sha256(file)) !== entry.sha256) {
      throw new InputError(`${file}: sha256 does not match manifest.json (changed after export)`);
    }
  }
  return manifest;
}

// Integer inputs are int64: ONNX Runtime for JavaScript wants them as BigInt64Array.
export const int64 = (values, dims) => new ort.Tensor('int64', BigInt64Array.from(values, BigInt), dims);

export async function open(folder, file) {
  const path = join(folder, file);
  let session;
  try {
    // Severity 3 (errors only): ONNX Runtime's warnings would break the one-line contract.
    session = await ort.InferenceSession.create(path, { logSeverityLevel: 3 });
  } catch (error) {
    throw new InputError(`${path}: ONNX Runtime cannot load it: ${firstLine(error)}`);
  }
  return session;
}

export const firstLine = (error) => String(error?.message ?? error).trim().split('\n')[0];
