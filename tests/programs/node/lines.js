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
'use strict';

function hot(n) {
  let s = 0;
  for (let i = 0; i < 3 * n; i++) { s = (s + i * 7) % 1000003; }
  for (let i = 0; i < 1 * n; i++) { s = (s + i * 7) % 1000003; }
  return s;
}

let stopping = false;
process.on('SIGTERM', () => { stopping = true; });
process.on('SIGINT', () => { stopping = true; });
let sink = 0;
let warm = false;

function loop() {
  sink += hot(15000 + Math.floor(Math.random() * 10000));
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
