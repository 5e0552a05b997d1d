// The vmtest guest's Node.js program: the main thread's work is handler,
// which gives hotLoop three parts and coldLoop one; the guest's suite
// checks that hostprof names them as JavaScript frames (V8's walk in the
// kernel) and that hotLoop's share of the two is `--cpu-prof`'s. Each
// call's length is drawn at random, so samples at a fixed rate do not
// lock to a point of the call. Exits on SIGINT or SIGTERM, so that
// `--cpu-prof` writes its profile.
'use strict';

function hotLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s + i * 7) % 1000003;
  }
  return s;
}

function coldLoop(n) {
  let s = 1;
  for (let i = 0; i < n; i++) {
    s = (s + i * 5) % 1000033;
  }
  return s;
}

function handler() {
  const n = 10000 + Math.floor(Math.random() * 10000);
  return hotLoop(3 * n) + coldLoop(n);
}

let stopping = false;
process.on('SIGINT', () => { stopping = true; });
process.on('SIGTERM', () => { stopping = true; });
let sink = 0;

function loop() {
  // About 25 ms of work (native speed; a TCG guest's under a second)
  // between looks at the signals: the event loop's turn is then a small
  // part of the main thread's time.
  for (let k = 0; k < 100; k++) {
    sink += handler();
  }
  if (stopping) {
    process.exit(sink > 0 ? 0 : 1);
  }
  setImmediate(loop);
}
loop();
