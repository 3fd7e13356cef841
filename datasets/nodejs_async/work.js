const { performance } = require('perf_hooks');
const fs = require('fs');
async function step(i) {
  performance.mark(`step${i}-start`);
  let s = 0; for (let k = 0; k < 2e6; k++) s += Math.sqrt(k);
  await new Promise(r => setTimeout(r, 5));
  await fs.promises.readFile(__filename);
  performance.mark(`step${i}-end`);
  performance.measure(`ProfilerStep#${i}`, `step${i}-start`, `step${i}-end`);
  return s;
}
(async () => { for (let i = 0; i < 3; i++) await step(i); })();
