// llama.cpp on a GGUF file through node-llama-cpp's prebuilt CPU binary (benchmarks/setup.sh
// installs it with --ignore-scripts: no compile, no download), for benchmarks/gguf_race.py.
// Reads one JSON object from argv[2]: {model, threads, prompt: [ids], tokens, prefill: [ids],
// rounds}; greedy (temperature 0) over the prompt ids as given, no BOS added. Prints JSON:
// the greedy tokens, each round's seconds for prompt + `tokens` new tokens, and each round's
// seconds to evaluate the `prefill` ids alone.
import {getLlama} from "node-llama-cpp";

const job = JSON.parse(process.argv[2]);
const llama = await getLlama({gpu: false, build: "never", maxThreads: job.threads,
                              logLevel: "error"});
const model = await llama.loadModel({modelPath: job.model, gpuLayers: 0});
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
