// llama.cpp on a GGUF file through node-llama-cpp's prebuilt CPU binary (benchmarks/setup.sh
// installs it with --ignore-scripts: no compile, no download), for benchmarks/gguf_race.py.
// Reads one JSON object from argv[2]: {model, threads, prompt: [ids], tokens, prefill: [ids],
// rounds}; greedy (temperature 0) over the prompt ids as given, no BOS added. Prints JSON:
// the greedy tokens, each round's seconds for prompt + `tokens` new tokens, and each round's
// seconds to evaluate the `prefill` ids alone.
//
// With `batch: [[ids], ...]` instead (benchmarks/serve_bench.py, issue 45): one context with a
// sequence per prompt, every prompt started at once so that llama.cpp batches their steps;
// greedy, each until `tokens` new tokens or an end-of-generation token (counted; with
// `ignore_eog`, on to `tokens` past it: every sequence stays in the batch). Prints JSON: each
// sequence's tokens, seconds to its first token and to its last, and the wall time, per round
// (the first round is the warm-up, left out).
import {getLlama} from "node-llama-cpp";

const job = JSON.parse(process.argv[2]);
const llama = await getLlama({gpu: false, build: "never", maxThreads: job.threads,
                              logLevel: "error"});
const model = await llama.loadModel({modelPath: job.model, gpuLayers: 0});
if (job.batch) {
    await batched();
    process.exit(0);
}
const context = await model.createContext({
    threads: {ideal: job.threads, min: job.threads}, batchSize: 512,
    contextSize: Math.max(job.prompt.length + job.tokens, job.prefill.length) + 8,
});
const sequence = context.getSequence();

async function greedy() {
    const out = [];
    for await (const token of sequence.evaluate(job.prompt, {temperature: 0})) {
        out.push(token);
        if (out.length >= job.tokens) break;
    }
    await sequence.clearHistory();
    return out;
}

const tokens = await greedy();  // also the warm-up
const seconds = [];
const prefill = [];
for (let round = 0; round < job.rounds; round++) {
    let start = performance.now();
    await greedy();
    seconds.push((performance.now() - start) / 1000);
    if (job.prefill.length) {
        start = performance.now();
        await sequence.evaluateWithoutGeneratingNewTokens(job.prefill);
        prefill.push((performance.now() - start) / 1000);
        await sequence.clearHistory();
    }
}
console.log(JSON.stringify({tokens, seconds, prefill, threads: job.threads}));
await context.dispose();
await model.dispose();
await llama.dispose();

async function batched() {
    const longest = Math.max(...job.batch.map(ids => ids.length));
    const context = await model.createContext({
        sequences: job.batch.length, threads: {ideal: job.threads, min: job.threads},
        batchSize: 512, contextSize: longest + job.tokens + 8,  // a sequence's: 16 x this in all
    });
    const sequences = job.batch.map(() => context.getSequence());
    async function one(sequence, ids, start) {
        const tokens = [];
        let first = 0;
        for await (const token of sequence.evaluate(ids, {temperature: 0, yieldEogToken: true})) {
            if (!tokens.length) first = (performance.now() - start) / 1000;
            tokens.push(token);  // an end-of-generation token counted, as the zoo's usage does
            if ((model.isEogToken(token) && !job.ignore_eog) || tokens.length >= job.tokens)
                break;
        }
        const last = (performance.now() - start) / 1000;
        await sequence.clearHistory();
        return {tokens, first, last};
    }
    const rounds = [];
    for (let round = 0; round <= job.rounds; round++) {  // round 0: the warm-up
        const start = performance.now();
        const rows = await Promise.all(sequences.map((sequence, i) => one(sequence,
                                                                           job.batch[i], start)));
        rounds.push({seconds: (performance.now() - start) / 1000, rows});
    }
    console.log(JSON.stringify({threads: job.threads, sequences: sequences.length,
                                context_size: context.contextSize, rounds: rounds.slice(1)}));
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}
