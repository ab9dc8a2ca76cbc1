// The export's tokenizer in Node.js: examples/web/tokenizer.mjs (one file for Node and the
// page) with files read from the folder and @huggingface/tokenizers from this folder's
// node_modules.

import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { InputError } from './contract.mjs';
import { loadTokenizer } from '../web/tokenizer.mjs';

export { golden, textStream } from '../web/tokenizer.mjs';

// The folder's tokenizer, or null where it has none; a broken file is an InputError.
export async function readTokenizer(folder) {
  const read = async (name) => {
    const path = join(folder, name);
    return existsSync(path) ? readFileSync(path, 'utf8') : null;
  };
  try {
    return await loadTokenizer(read, async () => Tokenizer);
  } catch (error) {
    throw new InputError(`${folder}/${error.message}`);
  }
}
