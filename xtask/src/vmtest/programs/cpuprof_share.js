// Counts the samples of a `--cpu-prof` profile (the newest .cpuprofile in
// the directory given) whose function is hotLoop or coldLoop, for the
// vmtest guest's check of jsspin.js: prints `truth_hot=N truth_cold=M`.
'use strict';
const fs = require('fs');
const path = require('path');
const dir = process.argv[process.argv.length - 1];
const files = fs.readdirSync(dir).filter((name) => name.endsWith('.cpuprofile'));
let hot = 0;
let cold = 0;
if (files.length > 0) {
  const profile = JSON.parse(fs.readFileSync(path.join(dir, files.sort().pop())));
  const names = new Map(profile.nodes.map((node) => [node.id, node.callFrame.functionName]));
  for (const id of profile.samples) {
    const name = names.get(id);
    if (name === 'hotLoop') hot++;
    else if (name === 'coldLoop') cold++;
  }
}
console.log(`truth_hot=${hot} truth_cold=${cold}`);
