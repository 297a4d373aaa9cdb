#!/usr/bin/env node
// Declares a step's name@version in a component, as the Rust SDK does: a
// custom section `stephost-step` that the host pins runs to, next to the
// module digest (`stephost show` prints it as `step`).
//
//     node declare-step.mjs IN.wasm OUT.wasm NAME@VERSION
//
// The section is appended at the component's top level; a component that
// already declares one is refused.

import { readFileSync, writeFileSync } from 'node:fs';

const SECTION = 'stephost-step';

/** Unsigned LEB128 of `n`. */
function leb(n) {
  const out = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n !== 0) byte |= 0x80;
    out.push(byte);
  } while (n !== 0);
  return Buffer.from(out);
}

/** Whether the top level of `bin` has a custom section named `name`. */
function hasSection(bin, name) {
  let pos = 8;
  const read = () => {
    let value = 0;
    let shift = 0;
    for (;;) {
      const byte = bin[pos++];
      value += (byte & 0x7f) * 2 ** shift;
      if ((byte & 0x80) === 0) return value;
      shift += 7;
    }
  };
  while (pos < bin.length) {
    const id = bin[pos++];
    const size = read();
    const end = pos + size;
    if (id === 0) {
      const len = read();
      if (bin.subarray(pos, pos + len).toString('utf8') === name) return true;
    }
    pos = end;
  }
  return false;
}

const [input, output, step] = process.argv.slice(2);
if (!input || !output || !step || !/^[^@\s]+@[^@\s]+$/.test(step) || step.length > 256) {
  console.error('usage: node declare-step.mjs IN.wasm OUT.wasm NAME@VERSION');
  process.exit(2);
}
const bin = readFileSync(input);
if (bin.length < 8 || bin.subarray(0, 4).toString('latin1') !== '\0asm' || bin.readUInt32LE(4) === 1) {
  console.error(`declare-step: ${input} is not a WebAssembly component`);
  process.exit(1);
}
if (hasSection(bin, SECTION)) {
  console.error(`declare-step: ${input} already declares a step`);
  process.exit(1);
}
const name = Buffer.from(SECTION, 'utf8');
const content = Buffer.concat([leb(name.length), name, Buffer.from(step, 'utf8')]);
writeFileSync(output, Buffer.concat([bin, Buffer.from([0]), leb(content.length), content]));
