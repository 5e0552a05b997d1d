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
//
// `hotLoop` and `coldLoop` carry a branch never taken that makes them too
// large for TurboFan to inline (over 460 bytes of bytecode): node 20's
// --cpu-prof, the tests' ground truth, puts much of an inlined callee's
// time on its caller (a third of the hot share, some runs), while the
// callers, small, are still inlined into node's `processImmediate`.
'use strict';
const { Worker, isMainThread, workerData } = require('worker_threads');

const WORK = 200000;

function hotLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s + i * 7) % 1000003;
  }
  if (n < 0) {
    // Never run: makes the function too large for TurboFan to inline.
    s = (s * 31 + 1) % 65521; s = (s ^ 5) % 65519;
    s = (s * 32 + 8) % 65521; s = (s ^ 18) % 65519;
    s = (s * 33 + 15) % 65521; s = (s ^ 31) % 65519;
    s = (s * 34 + 22) % 65521; s = (s ^ 44) % 65519;
    s = (s * 35 + 29) % 65521; s = (s ^ 57) % 65519;
    s = (s * 36 + 36) % 65521; s = (s ^ 70) % 65519;
    s = (s * 37 + 43) % 65521; s = (s ^ 83) % 65519;
    s = (s * 38 + 50) % 65521; s = (s ^ 96) % 65519;
    s = (s * 39 + 57) % 65521; s = (s ^ 109) % 65519;
    s = (s * 40 + 64) % 65521; s = (s ^ 122) % 65519;
    s = (s * 41 + 71) % 65521; s = (s ^ 135) % 65519;
    s = (s * 42 + 78) % 65521; s = (s ^ 148) % 65519;
    s = (s * 43 + 85) % 65521; s = (s ^ 161) % 65519;
    s = (s * 44 + 92) % 65521; s = (s ^ 174) % 65519;
    s = (s * 45 + 99) % 65521; s = (s ^ 187) % 65519;
    s = (s * 46 + 106) % 65521; s = (s ^ 200) % 65519;
    s = (s * 47 + 113) % 65521; s = (s ^ 213) % 65519;
    s = (s * 48 + 120) % 65521; s = (s ^ 226) % 65519;
    s = (s * 49 + 127) % 65521; s = (s ^ 239) % 65519;
    s = (s * 50 + 134) % 65521; s = (s ^ 252) % 65519;
    s = (s * 51 + 141) % 65521; s = (s ^ 265) % 65519;
    s = (s * 52 + 148) % 65521; s = (s ^ 278) % 65519;
    s = (s * 53 + 155) % 65521; s = (s ^ 291) % 65519;
    s = (s * 54 + 162) % 65521; s = (s ^ 304) % 65519;
  }
  return s;
}

function coldLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s ^ (i * 13)) % 999983;
  }
  if (n < 0) {
    // Never run: makes the function too large for TurboFan to inline.
    s = (s * 31 + 1) % 65521; s = (s ^ 5) % 65519;
    s = (s * 32 + 8) % 65521; s = (s ^ 18) % 65519;
    s = (s * 33 + 15) % 65521; s = (s ^ 31) % 65519;
    s = (s * 34 + 22) % 65521; s = (s ^ 44) % 65519;
    s = (s * 35 + 29) % 65521; s = (s ^ 57) % 65519;
    s = (s * 36 + 36) % 65521; s = (s ^ 70) % 65519;
    s = (s * 37 + 43) % 65521; s = (s ^ 83) % 65519;
    s = (s * 38 + 50) % 65521; s = (s ^ 96) % 65519;
    s = (s * 39 + 57) % 65521; s = (s ^ 109) % 65519;
    s = (s * 40 + 64) % 65521; s = (s ^ 122) % 65519;
    s = (s * 41 + 71) % 65521; s = (s ^ 135) % 65519;
    s = (s * 42 + 78) % 65521; s = (s ^ 148) % 65519;
    s = (s * 43 + 85) % 65521; s = (s ^ 161) % 65519;
    s = (s * 44 + 92) % 65521; s = (s ^ 174) % 65519;
    s = (s * 45 + 99) % 65521; s = (s ^ 187) % 65519;
    s = (s * 46 + 106) % 65521; s = (s ^ 200) % 65519;
    s = (s * 47 + 113) % 65521; s = (s ^ 213) % 65519;
    s = (s * 48 + 120) % 65521; s = (s ^ 226) % 65519;
    s = (s * 49 + 127) % 65521; s = (s ^ 239) % 65519;
    s = (s * 50 + 134) % 65521; s = (s ^ 252) % 65519;
    s = (s * 51 + 141) % 65521; s = (s ^ 265) % 65519;
    s = (s * 52 + 148) % 65521; s = (s ^ 278) % 65519;
    s = (s * 53 + 155) % 65521; s = (s ^ 291) % 65519;
    s = (s * 54 + 162) % 65521; s = (s ^ 304) % 65519;
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
