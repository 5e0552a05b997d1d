// The vmtest guest's Node.js program: the main thread spends its time in
// hotLoop, called from handler; the guest's suite checks that hostprof
// names hotLoop as a JavaScript frame (V8's walk in the kernel).
'use strict';

function hotLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s + i * 7) % 1000003;
  }
  return s;
}

function handler() {
  return hotLoop(200000);
}

let sink = 0;
for (;;) {
  sink += handler();
}
