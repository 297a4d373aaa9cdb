// Write stephost steps in JavaScript.
//
// A step is a function from a JSON input to a JSON output that reaches the
// world only through the host's imports (effects, llm, clock, random, log,
// timers, approvals). The host records every one of these calls in its
// ledger; resume and replay feed the recorded results back, so a step must
// take time and randomness only from here (never Date.now, Math.random or
// crypto) and make the same calls in the same order for the same input.
//
//     import { step, log } from '../../guest-sdk/js/stephost-step.js';
//
//     export const run = step((ctx, input) => {
//       const stock = ctx.effect('inventory.read', { sku: input.sku });
//       log.info(`${input.sku} on hand: ${stock.on_hand}`);
//       return { sku: input.sku, on_hand: stock.on_hand };
//     });
//
// Works with componentize-qjs (QuickJS, `--sync`) and with
// @bytecodealliance/componentize-js (StarlingMonkey); see README.md.

import { call } from 'stephost:step/effects@0.1.0';
import { complete } from 'stephost:step/llm@0.1.0';
import { now as clockNow } from 'stephost:step/clock@0.1.0';
import { getBytes, getU64 } from 'stephost:step/random@0.1.0';
import { emit } from 'stephost:step/log@0.1.0';
import { sleep as timersSleep } from 'stephost:step/timers@0.1.0';
import { request as approvalsRequest } from 'stephost:step/approvals@0.1.0';

// componentize-qjs hands a WIT u64 to JavaScript as a Number (exact only up
// to 2^53) and has no event loop after an export returns;
// componentize-js (StarlingMonkey) hands it over as a BigInt and settles a
// returned Promise. Both take a Number for a u64 argument.
const QUICKJS = typeof globalThis.__cqjs !== 'undefined';

const WHAT = {
  rejected: 'rejected the request',
  denied: 'is denied',
  exhausted: 'failed and its retries are used up',
  invalid: 'got an invalid request',
  encode: 'request could not be encoded as JSON',
  decode: 'response did not decode',
};

/**
 * Why an effect call did not give a response the step can use.
 *
 * `kind` is one of the host's four call-error kinds, `rejected` (the receiver
 * refused; retrying will not help), `denied` (not granted by the host
 * configuration), `exhausted` (retryable failure, retries used up), `invalid`
 * (the host found the request malformed), or one raised in the step:
 * `encode` (the request has no JSON form; nothing was sent) and `decode` (the
 * response is not JSON; the call is recorded as answered). `effect` names the
 * effect (`llm` and `approvals` for those imports), `detail` is the host's or
 * the codec's message, and `message` reads like the Rust SDK's:
 * "effect `supplier.order` rejected the request: out of stock".
 */
export class EffectError extends Error {
  constructor(kind, effect, detail) {
    super(`effect \`${effect}\` ${WHAT[kind] ?? kind}: ${detail}`);
    this.name = 'EffectError';
    this.kind = kind;
    this.effect = effect;
    this.detail = detail;
  }
}

/** The text of a thrown value: an Error's message, or the value as a string. */
function messageOf(e) {
  if (e instanceof Error) return e.message;
  return typeof e === 'string' ? e : String(e);
}

/** A host `call-error` (thrown with `payload: {tag, val}`) as an EffectError. */
function fromCallError(effect, e) {
  const p = e !== null && typeof e === 'object' ? e.payload : undefined;
  if (p && (p.tag === 'rejected' || p.tag === 'denied' || p.tag === 'exhausted' || p.tag === 'invalid')) {
    return new EffectError(p.tag, effect, String(p.val));
  }
  return e;
}

function encode(effect, value) {
  let body;
  try {
    body = JSON.stringify(value);
  } catch (e) {
    throw new EffectError('encode', effect, messageOf(e));
  }
  if (typeof body !== 'string') {
    throw new EffectError('encode', effect, `${typeof value} has no JSON form`);
  }
  return body;
}

function invoke(effect, request, imported) {
  const body = encode(effect, request);
  let response;
  try {
    response = imported(body);
  } catch (e) {
    throw fromCallError(effect, e);
  }
  try {
    return JSON.parse(response);
  } catch (e) {
    throw new EffectError('decode', effect, messageOf(e));
  }
}

/** A non-negative integer below 2^53, for a u64 or u32 argument. */
function count(what, n) {
  const v = typeof n === 'bigint' ? Number(n) : n;
  if (!Number.isSafeInteger(v) || v < 0) {
    throw new TypeError(`${what} must be a non-negative integer, got ${String(n)}`);
  }
  return v;
}

/**
 * Calls the effect `name` with `request` encoded as JSON and returns its
 * decoded JSON response. With a business `key` (for example
 * `"order:WIDGET-7:10"`) a write's operation id is derived from the run, the
 * effect and the key instead of the call's sequence number.
 * Throws EffectError.
 */
export function effect(name, request, key) {
  if (key != null && typeof key !== 'string') {
    throw new TypeError(`the key of effect \`${name}\` must be a string, got ${typeof key}`);
  }
  return invoke(name, request, (body) => call(name, body, key ?? undefined));
}

/** `effect(name, request, key)` in the Rust SDK's argument order. */
export function effectWithKey(name, key, request) {
  return effect(name, request, key);
}

/**
 * A chat completion from the configured model: `request` is an OpenAI-style
 * body without `model`; returns the provider's JSON response. Recorded: a
 * resumed or replayed run gets it back without new tokens. Throws
 * EffectError (effect `llm`).
 */
export function llm(request) {
  return invoke('llm', request, complete);
}

/**
 * The host's clock in nanoseconds since the Unix epoch, as a BigInt. Under
 * QuickJS the binding passes it through a double, so it is exact only to
 * about 256 ns (the recorded value is exact, and replay rounds it alike).
 */
export function nowNs() {
  return BigInt(clockNow());
}

/** The host's clock as a Date (milliseconds, truncated like Rust's as_millis). */
export function now() {
  return new Date(Number(nowNs() / 1000000n));
}

/** `n` random bytes from the host, as a Uint8Array. */
export function randomBytes(n) {
  const bytes = getBytes(count('randomBytes length', n));
  return bytes instanceof Uint8Array ? bytes : Uint8Array.from(bytes);
}

/**
 * A random 64-bit number from the host, as a BigInt. Under QuickJS, whose
 * binding cannot pass a u64 exactly, it is made of `random.get-bytes(8)`
 * (big-endian) instead of `random.get-u64`, and recorded as that.
 */
export function randomU64() {
  if (QUICKJS) {
    let v = 0n;
    for (const b of randomBytes(8)) v = (v << 8n) | BigInt(b);
    return v;
  }
  return BigInt(getU64());
}

/**
 * Sleeps durably for `ms` milliseconds: the wake time is recorded, a restart
 * neither loses nor repeats it, and a replay returns at once.
 */
export function sleep(ms) {
  timersSleep(count('sleep duration (ms)', typeof ms === 'number' ? Math.floor(ms) : ms));
}

/**
 * Asks a person to approve `subject`; `details` (encoded as JSON) is the
 * object approved. The run waits, out of memory, until someone runs
 * `stephost approve` / `stephost reject` or `ttlSeconds` pass (verdict
 * `expired`). Returns `{verdict, by, note, at, approved}` with verdict
 * `approved` | `rejected` | `expired`, `by` (empty when expired), `note`
 * (or null), `at` a Date and `approved` a boolean. Re-check the business
 * precondition after it before acting. Throws EffectError (effect
 * `approvals`).
 */
export function approval(subject, details, ttlSeconds) {
  const body = encode('approvals', details);
  const ttl = Math.max(1, count('approval ttlSeconds', typeof ttlSeconds === 'number' ? Math.floor(ttlSeconds) : ttlSeconds));
  let d;
  try {
    d = approvalsRequest(String(subject), body, ttl);
  } catch (e) {
    throw fromCallError('approvals', e);
  }
  return {
    verdict: d.verdict,
    by: d.by,
    note: d.note ?? null,
    at: new Date(Number(d.atMs)),
    approved: d.verdict === 'approved',
  };
}

function logText(args) {
  return args
    .map((a) => {
      if (typeof a === 'string') return a;
      if (a instanceof Error) return a.message;
      if (a !== null && typeof a === 'object') {
        try {
          return JSON.stringify(a, (_, v) => (typeof v === 'bigint' ? v.toString() : v));
        } catch {
          return String(a);
        }
      }
      return String(a);
    })
    .join(' ');
}

/**
 * The run's log: `log.info('ordering', 7, 'of', sku)`. Arguments are joined
 * with spaces, objects as compact JSON. Log lines are not ledger calls; a
 * replay marks them as replayed.
 */
export const log = Object.freeze({
  trace: (...args) => emit('trace', logText(args)),
  debug: (...args) => emit('debug', logText(args)),
  info: (...args) => emit('info', logText(args)),
  warn: (...args) => emit('warn', logText(args)),
  error: (...args) => emit('error', logText(args)),
});

/** Everything a step function reaches the host with; the first argument of a step. */
export const ctx = Object.freeze({
  effect,
  effectWithKey,
  llm,
  now,
  nowNs,
  randomBytes,
  randomU64,
  sleep,
  approval,
  log,
});

function output(value) {
  let text;
  try {
    text = JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? v.toString() : v));
  } catch (e) {
    throw `invalid output: ${messageOf(e)}`;
  }
  if (typeof text !== 'string') throw `invalid output: ${typeof value} has no JSON form`;
  return text;
}

/**
 * Turns `(ctx, input) => output` into the step's exported `run`:
 * `export const run = step(fn)`. The JSON input is parsed (a parse error ends
 * the run with `invalid input: ...`), the returned value is the run's output,
 * encoded as compact JSON, and a thrown error's message (an Error's
 * `message`, or a thrown string) is the run's error.
 *
 * Every stephost import is synchronous, so a step needs no `await`. An async
 * function works with componentize-js (StarlingMonkey settles the Promise);
 * componentize-qjs --sync cannot wait for one, so there the Promise ends the
 * run with an error that says so.
 */
export function step(fn) {
  return function run(input) {
    let parsed;
    try {
      parsed = JSON.parse(input);
    } catch (e) {
      throw `invalid input: ${messageOf(e)}`;
    }
    let result;
    try {
      result = fn(ctx, parsed);
    } catch (e) {
      // Thrown as a string: that is the result's error for both engines
      // (StarlingMonkey aborts on an Error object thrown out of an export).
      throw messageOf(e);
    }
    if (result !== null && typeof result === 'object' && typeof result.then === 'function') {
      if (QUICKJS) {
        throw 'the step function returned a Promise, which componentize-qjs --sync cannot wait for: ' +
          'write it as a plain function (every stephost import is synchronous)';
      }
      return Promise.resolve(result).then(output, (e) => {
        throw messageOf(e);
      });
    }
    return output(result);
  };
}
