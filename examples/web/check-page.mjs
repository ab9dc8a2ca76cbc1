// Open each page in headless Chromium and print what it shows, one line of JSON per URL, in
// the order given:
//   {"state":"done"|"error","text":"...","tokens":[...],"error":"...","status":"...",
//    "tokensPerSecond":...,"totalMs":...,"wallMs":...,"attention":...,"run":...}
// where text is the prompt and the answer as shown, tokensPerSecond and totalMs what the page
// measured, wallMs the time this program saw from load to done, attention the map the
// page drew ({layer, tokens, heads}) or null, and run all the page kept of its run
// (window.zooRun: transformers.html's vectors, labels and timings too).
//
//   node check-page.mjs URL [--screenshot PNG] [URL [--screenshot PNG]]... \
//                       [--user-data-dir DIR] [--timeout-ms 60000]
//   node check-page.mjs URL --golden INPUT.json [URL --golden INPUT.json]...
//                                                    (the page's tokenizer, as tokenize.mjs)
//
// One browser serves all the URLs (a launch takes seconds): each URL gets a new page (tab) of
// it, closed once read. `--screenshot PNG` saves the page of the URL just before it; a URL
// without one is not saved. `--golden INPUT.json` likewise belongs to the URL before it: that
// page's line is what its tokenizer gives for INPUT. `--timeout-ms` bounds each page.
//
// Drives the system's Chromium (Debian's /usr/bin/chromium, or $CHROMIUM) with playwright-core;
// it never downloads a browser. The profile is a new empty folder (made here unless given),
// and the browser is closed before exit whatever happens, so no process is left behind.
// Exit 0 when every page finished (done or error shown), its line printed as it finished;
// otherwise 1 with one line on stderr naming the URL that did not, and no line for the rest.

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];
const USAGE = 'usage: node check-page.mjs URL [--screenshot PNG | --golden INPUT.json] ' +
  '[URL [--screenshot PNG | --golden INPUT.json]]... [--user-data-dir DIR] [--timeout-ms MS]';

function parseArgs(argv) {
  const args = { pages: [], userDataDir: null, timeoutMs: 60000 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--user-data-dir') args.userDataDir = argv[++i];
    else if (argv[i] === '--timeout-ms') args.timeoutMs = Number(argv[++i]);
    else if (argv[i] === '--screenshot' || argv[i] === '--golden') {
      // Belongs to the URL before it: a stray or second one would pair it with a wrong page.
      const last = args.pages.at(-1);
      if (!last || last.screenshot || last.golden) {
        throw new Error(`${argv[i]} follows its URL, once per URL; ${USAGE}`);
      }
      if (argv[i] === '--golden') last.golden = JSON.parse(readFileSync(argv[++i], 'utf8'));
      else last.screenshot = argv[++i];
    } else args.pages.push({ url: argv[i], screenshot: null, golden: null });
  }
  if (args.pages.length === 0) throw new Error(USAGE);
  return args;
}

// Wait for the page to finish; on a timeout say what it showed, and its last console lines.
async function waitUntilFinished(page, logged, timeoutMs) {
  try {
    await page.waitForFunction(() => ['done', 'error'].includes(document.body.dataset.state),
                               null, { timeout: timeoutMs });
  } catch {
    const status = await page.textContent('#status').catch(() => '?');
    throw new Error(`page did not finish within ${timeoutMs} ms (status: ${status}; ` +
                    `console: ${logged.slice(-3).join(' | ') || 'empty'})`);
  }
}

// What one page shows once finished, or (with golden) what its tokenizer gives.
async function readPage(page, { url, screenshot, golden }, { timeoutMs }) {
  const logged = []; // the page's console, shown only when something goes wrong
  page.on('console', (message) => logged.push(`${message.type()}: ${message.text()}`));
  page.on('pageerror', (error) => logged.push(`pageerror: ${error.message}`));
  const started = Date.now();
  await page.goto(url);
  if (golden) {
    await page.waitForFunction(() => window.zooGolden, null, { timeout: timeoutMs });
    return page.evaluate((input) => window.zooGolden(input), golden);
  }
  await waitUntilFinished(page, logged, timeoutMs);
  const wallMs = Date.now() - started;
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  const result = await page.evaluate(() => ({
    state: document.body.dataset.state,
    text: document.getElementById('output').textContent,
    tokens: window.zooRun?.tokens ?? [],
    tokensPerSecond: window.zooRun?.tokensPerSecond ?? null,
    totalMs: window.zooRun?.totalMs ?? null,
    error: document.getElementById('error').textContent,
    status: document.getElementById('status').textContent,
    attention: window.zooAttention ?? null,
    run: window.zooRun ?? null,
  }));
  return { ...result, wallMs };
}

// A new page per URL, so nothing one page left running or listening reaches the next; an
// error (closing included) is named by its URL, as the others may have passed.
async function visit(context, spec, args) {
  try {
    const page = await context.newPage();
    try {
      return await readPage(page, spec, args);
    } finally {
      await page.close();
    }
  } catch (error) {
    throw new Error(`${spec.url}: ${String(error?.message ?? error).split('\n')[0]}`);
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const ownProfile = !args.userDataDir;
  const profile = args.userDataDir ?? mkdtempSync(join(tmpdir(), 'zoo-chromium-'));
  try {
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
      headless: true,
      args: ARGS,
    });
    try {
      for (const spec of args.pages) console.log(JSON.stringify(await visit(context, spec, args)));
    } finally {
      await context.close();
    }
  } finally {
    if (ownProfile) rmSync(profile, { recursive: true, force: true });
  }
}

main().catch((error) => {
  process.stderr.write(`error: ${String(error?.message ?? error).split('\n')[0]}\n`);
  process.exit(1);
});
