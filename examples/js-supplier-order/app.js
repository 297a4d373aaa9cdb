// Example step in JavaScript: orders missing stock from a supplier.
//
// The same step as examples/supplier-order (Rust), call for call: input
// `{"sku": "WIDGET-7", "quantity": 10}` (optionally `"approval_ttl_seconds"`),
// output `{"sku", "on_hand", "shortage", "ordered", "receipt"}`.

import { EffectError, step, log } from '../../guest-sdk/js/stephost-step.js';

/** Lower-case hex of `bytes`. */
function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** The input's shape, checked as the Rust step's serde types check it. */
function parseInput(input) {
  if (input === null || typeof input !== 'object' || Array.isArray(input)) {
    throw new Error('invalid input: expected an object with `sku` and `quantity`');
  }
  const { sku, quantity, approval_ttl_seconds: ttl } = input;
  if (typeof sku !== 'string') throw new Error('invalid input: `sku` must be a string');
  if (!Number.isSafeInteger(quantity)) throw new Error('invalid input: `quantity` must be an integer');
  if (ttl != null && !(Number.isSafeInteger(ttl) && ttl >= 0)) {
    throw new Error('invalid input: `approval_ttl_seconds` must be a non-negative integer');
  }
  return { sku, quantity, ttl: ttl ?? null };
}

/** The `inventory.read` response; only `on_hand` is used. */
function readStock(ctx, sku) {
  const stock = ctx.effect('inventory.read', { sku });
  if (stock === null || typeof stock !== 'object' || !Number.isSafeInteger(stock.on_hand)) {
    throw new EffectError('decode', 'inventory.read', 'expected an object with an integer `on_hand`');
  }
  return stock;
}

/** Rust's `{:?}` of a verdict (`Rejected`) for the same error text. */
function debugVerdict(verdict) {
  return verdict.charAt(0).toUpperCase() + verdict.slice(1);
}

export const run = step((ctx, raw) => {
  const input = parseInput(raw);
  if (input.sku === '') {
    throw new Error('sku must not be empty');
  }
  if (input.quantity < 0) {
    throw new Error(`quantity must not be negative, got ${input.quantity}`);
  }

  let stock = readStock(ctx, input.sku);
  if (input.ttl !== null && input.quantity > stock.on_hand) {
    const decision = ctx.approval(
      `order ${input.quantity - stock.on_hand} of ${input.sku}`,
      // Keys in the Rust step's order (serde_json sorts a json! object's
      // keys): the approval is tied to the sha256 of exactly these bytes.
      { on_hand: stock.on_hand, quantity: input.quantity, sku: input.sku },
      input.ttl,
    );
    if (!decision.approved) {
      throw new Error(
        `the order was not approved (${debugVerdict(decision.verdict)} by ${JSON.stringify(decision.by)})`,
      );
    }
    // Re-check the precondition now, not when the approval was asked.
    stock = readStock(ctx, input.sku);
  }
  const shortage = input.quantity - stock.on_hand;
  log.info(`${input.sku}: ${input.quantity} wanted, ${stock.on_hand} on hand`);

  let ordered = false;
  let receipt = null;
  if (shortage > 0) {
    const requestedAtMs = ctx.now().getTime(); // clock first, then random
    const request = {
      sku: input.sku,
      quantity: shortage,
      requested_at_ms: requestedAtMs,
      request_nonce: hex(ctx.randomBytes(8)),
    };
    const key = `order:${input.sku}:${input.quantity}`;
    log.info(`ordering ${shortage} of ${input.sku} (key ${key})`);
    receipt = ctx.effect('supplier.order', request, key);
    ordered = true;
    log.info(`supplier accepted the order: ${JSON.stringify(receipt)}`);
  } else {
    log.info('enough stock, nothing to order');
  }

  return {
    sku: input.sku,
    on_hand: stock.on_hand,
    shortage: Math.max(shortage, 0),
    ordered,
    receipt,
  };
});
