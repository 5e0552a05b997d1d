// A Node.js program with a known call graph, for tests/node.rs: the main
// thread's `handler` calls `hotLoop` with three times the work of
// `coldLoop`, which it also reaches through an async function (resumed
// from the microtask queue), through `Array.prototype.sort`'s comparator
// (a builtin calling back into JavaScript), and through a bound function;
// a worker thread runs the same loops. Prints `warm MICROS` once the JIT
// has settled and `stop MICROS` when SIGTERM or SIGINT ends it (or after
// the seconds given), both on the clock of --cpu-prof's timestamps; then
// `done ROUNDS MICROS CPU_MICROS`: the rounds both threads ran from `warm`
// to `stop`, over how long and how much of the process's CPU time (for
// `cargo xtask bench`'s throughput).
'use strict';
const { Worker, isMainThread, workerData } = require('worker_threads');

const WORK = 200000;

function hotLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s + i * 7) % 1000003;
  }
  return s;
}

function coldLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s ^ (i * 13)) % 999983;
  }
  return s;
}

async function viaAsync() {
  await null;
  return coldLoop(WORK / 4);
}

function viaSort() {
  const items = [5, 3, 8, 1, 9, 2, 7];
  let total = 0;
  items.sort((a, b) => {
    total += coldLoop(WORK / 28);
    return a - b;
  });
  return total;
}

const viaBound = function (n) { return coldLoop(n); }.bind(null);

function handler() {
  return hotLoop(3 * WORK) + coldLoop(WORK / 4) + viaBound(WORK / 4);
}

function micros() {
  return process.hrtime.bigint() / 1000n;
}

function cpuMicros() {
  const { user, system } = process.cpuUsage();
  return user + system;
}

// The worker's rounds, counted where the main thread reads them.
const rounds = new Int32Array(
  isMainThread ? new SharedArrayBuffer(4) : workerData);

if (!isMainThread) {
  let sink = 0;
  for (;;) {
    sink += handler();
    sink += viaSort();
    Atomics.add(rounds, 0, 1);
  }
}

const seconds = Number(process.argv[2] || 0);
let stopping = false;
process.on('SIGTERM', () => { stopping = true; });
process.on('SIGINT', () => { stopping = true; });
const worker = new Worker(__filename, { workerData: rounds.buffer });
const started = Date.now();
let warm = false;
let sink = 0;
let mainRounds = 0;
let warmAt = null;

async function round() {
  sink += handler();
  sink += await viaAsync();
  sink += viaSort();
}

function loop() {
  round().then(() => {
    mainRounds++;
    const ran = Date.now() - started;
    if (!warm && ran > 1500) {
      warm = true;
      const now = micros();
      warmAt = { now, cpu: cpuMicros(), rounds: Atomics.load(rounds, 0) };
      mainRounds = 0;
      console.log(`warm ${now}`);
      if (seconds > 0) {
        setTimeout(() => { stopping = true; }, seconds * 1000);
      }
    }
    if (!stopping) {
      setImmediate(loop);
      return;
    }
    const now = micros();
    console.log(`stop ${now} ${sink > 0}`);
    if (warmAt !== null) {
      const done = mainRounds + Atomics.load(rounds, 0) - warmAt.rounds;
      console.log(`done ${done} ${now - warmAt.now} ${cpuMicros() - warmAt.cpu}`);
    }
    worker.terminate().then(() => process.exit(0));
  });
}
loop();
