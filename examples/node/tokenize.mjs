// Check a folder's tokenizer against another language's: encode texts, decode id lists.
//
//   node tokenize.mjs FOLDER INPUT.json
//
// INPUT.json: {"texts": ["...", ...], "ids": [[1, 2], ...]}. Prints one line of JSON:
// {"kind", "encoded": [{"ids": [...], "text": decode(ids)}, ...], "decoded": ["...", ...]}.
// FOLDER needs only byte-tokenizer.json or tokenizer.json (an export or a model folder).
// Bad input prints ONE line `error: ...` on stderr and exits with code 2.

import { readFileSync } from 'node:fs';
import { InputError, firstLine } from './contract.mjs';
import { golden, readTokenizer } from './text.mjs';

async function main() {
  const [folder, input, ...rest] = process.argv.slice(2);
  if (!folder || !input || rest.length) {
    throw new InputError('usage: node tokenize.mjs FOLDER INPUT.json');
  }
  let request;
  try {
    request = JSON.parse(readFileSync(input, 'utf8'));
  } catch (error) {
    throw new InputError(`${input}: ${firstLine(error)}`);
  }
  const tokenizer = await readTokenizer(folder);
  if (tokenizer === null) {
    throw new InputError(`${folder}: no tokenizer (byte-tokenizer.json or tokenizer.json)`);
  }
  console.log(JSON.stringify({ kind: tokenizer.kind, ...golden(tokenizer, request) }));
}

main().catch((error) => {
  process.stderr.write(`error: ${firstLine(error)}\n`);
  process.exit(2);
});
