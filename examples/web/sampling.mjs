// The next token from one row of logits, as the page picks it. Temperature 0 is greedy: the
// first maximum, as numpy's argmax (so the page's tokens equal `zoo run`'s). Otherwise a draw
// from softmax(logits / temperature) over the top_k highest logits (all of them when top_k is
// 0). Python's sampler draws from numpy's generator, so sampled text differs between the two
// for one seed; greedy is the same everywhere.

export function argmax(row) {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
  return best;
}

export function pick(row, { temperature = 0, topK = 0 } = {}, random = Math.random) {
  if (!(temperature > 0)) return argmax(row);
  let order = Array.from(row.keys()).sort((a, b) => row[b] - row[a]);
  if (topK > 0) order = order.slice(0, topK);
  const top = row[order[0]];
  const weights = order.map((id) => Math.exp((row[id] - top) / temperature));
  let draw = random() * weights.reduce((a, b) => a + b, 0);
  for (let i = 0; i < order.length; i++) {
    draw -= weights[i];
    if (draw < 0) return order[i];
  }
  return order.at(-1); // rounding left a sliver past the last weight
}

// A small seeded generator (mulberry32), so one seed gives one text on every run.
export function seeded(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
