// Open the page in headless Chromium and print what it shows, as one line of JSON:
//   {"state":"done"|"error","text":"...","tokens":[...],"error":"...","status":"...",
//    "tokensPerSecond":...,"totalMs":...,"wallMs":...,"attention":...}
// where text is the prompt and the answer as shown, tokensPerSecond and totalMs what the page
// measured, wallMs the time this program saw from load to done, and attention the map the
// page drew ({layer, tokens, heads}) or null.
//
//   node check-page.mjs URL [--user-data-dir DIR] [--timeout-ms 60000] [--screenshot PNG]
//   node check-page.mjs URL --golden INPUT.json      (the page's tokenizer, as tokenize.mjs)
//
// Drives the system's Chromium (Debian's /usr/bin/chromium, or $CHROMIUM) with playwright-core;
// it never downloads a browser. The profile is a new empty folder (made here unless given),
// and the browser is closed before exit whatever happens, so no process is left behind.
// Exit 0 when the page finished (done or error shown); 1 with one line on stderr otherwise.

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

function parseArgs(argv) {
  const args = { url: null, userDataDir: null, timeoutMs: 60000, screenshot: null, golden: null };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--user-data-dir') args.userDataDir = argv[++i];
    else if (argv[i] === '--timeout-ms') args.timeoutMs = Number(argv[++i]);
    else if (argv[i] === '--screenshot') args.screenshot = argv[++i];
    else if (argv[i] === '--golden') args.golden = JSON.parse(readFileSync(argv[++i], 'utf8'));
    else args.url = argv[i];
  }
  if (!args.url) {
    throw new Error('usage: node check-page.mjs URL [--user-data-dir DIR] [--timeout-ms MS] ' +
                    '[--screenshot PNG] [--golden INPUT.json]');
  }
  return args;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const ownProfile = !args.userDataDir;
  const profile = args.userDataDir ?? mkdtempSync(join(tmpdir(), 'zoo-chromium-'));
  const logged = []; // the page's console, shown only when something goes wrong
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ARGS,
  });
  try {
    const page = context.pages()[0] ?? await context.newPage();
    page.on('console', (message) => logged.push(`${message.type()}: ${message.text()}`));
    page.on('pageerror', (error) => logged.push(`pageerror: ${error.message}`));
    const started = Date.now();
    await page.goto(args.url);
    if (args.golden) {
      await page.waitForFunction(() => window.zooGolden, null, { timeout: args.timeoutMs });
      console.log(JSON.stringify(await page.evaluate((input) => window.zooGolden(input),
                                                     args.golden)));
      return;
    }
    try {
      await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state),
                                 null, { timeout: args.timeoutMs });
    } catch {
      const status = await page.textContent('#status').catch(() => '?');
      throw new Error(`page did not finish within ${args.timeoutMs} ms (status: ${status}; ` +
                      `console: ${logged.slice(-3).join(' | ') || 'empty'})`);
    }
    const wallMs = Date.now() - started;
    if (args.screenshot) await page.screenshot({ path: args.screenshot, fullPage: true });
    const result = await page.evaluate(() => ({
      state: document.body.dataset.state,
      text: document.getElementById('output').textContent,
      tokens: window.zooRun?.tokens ?? [],
      tokensPerSecond: window.zooRun?.tokensPerSecond ?? null,
      totalMs: window.zooRun?.totalMs ?? null,
      error: document.getElementById('error').textContent,
      status: document.getElementById('status').textContent,
      attention: window.zooAttention ?? null,
    }));
    console.log(JSON.stringify({ ...result, wallMs }));
  } finally {
    await context.close();
    if (ownProfile) rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((error) => {
  process.stderr.write(`error: ${String(error?.message ?? error).split('\n')[0]}\n`);
  process.exit(1);
});
