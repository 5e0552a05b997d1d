// A Node.js program for tests/node_lines.rs: `hot` runs two loops, each on
// a line of its own, the first three times as long as the second, so
// three quarters of the time in `hot` is on the first loop's line. The
// loops run the same code (both bounds a multiplication): `--cpu-prof`
// sees a Sparkplug frame's line only while the CPU is in its code, not in
// the builtins it calls (V8 takes the caller's frame then), so its share
// is the truth only if both loops spend the same part of their time in
// builtins. Each call's length is drawn at random (the share stays 3:1):
// a call of fixed length is a period, and one that divides hostprof's
// sampling period (499 Hz: about 8 calls of 250 us on a CI machine)
// makes every sample fall at the same point of the call, so the share
// drifted between 0.67 and 0.81 from run to run. Prints
// `warm MICROS` once started and exits on SIGTERM or SIGINT (then
// `--cpu-prof` writes its profile).
//
// With `osr` as its argument, `hot` is first called once, repeating its
// loops until the process has had OSR_CPU_SECONDS more of CPU: V8 then
// optimizes it while it runs and enters that code by on-stack
// replacement, code the function itself never points at.
'use strict';

const OSR_CPU_SECONDS = 4;

function cpuMicros() {
  const usage = process.cpuUsage();
  return usage.user + usage.system;
}

function hot(n, until) {
  let s = 0;
  do {
    for (let i = 0; i < 3 * n; i++) { s = (s + i * 7) % 1000003; }
    for (let i = 0; i < 1 * n; i++) { s = (s + i * 7) % 1000003; }
  } while (until > 0 && cpuMicros() < until);
  return s;
}

let stopping = false;
process.on('SIGTERM', () => { stopping = true; });
process.on('SIGINT', () => { stopping = true; });
let sink = 0;
let warm = false;

function loop() {
  if (!warm && process.argv[2] === 'osr') {
    warm = true;
    console.log(`warm ${process.hrtime.bigint() / 1000n}`);
    sink += hot(15000 + Math.floor(Math.random() * 10000), cpuMicros() + OSR_CPU_SECONDS * 1e6);
  }
  sink += hot(15000 + Math.floor(Math.random() * 10000), 0);
  if (!warm) {
    warm = true;
    console.log(`warm ${process.hrtime.bigint() / 1000n}`);
  }
  if (stopping) {
    console.log(`stop ${sink > 0}`);
    process.exit(0);
  }
  setImmediate(loop);
}
loop();
