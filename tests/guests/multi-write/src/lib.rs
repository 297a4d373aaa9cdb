//! Test guest: `{"count": N, "effect": "orders"}` makes N sequential writes to
//! the effect (no business key), reads the clock and random once more, and
//! also uses the WASI clock and a default-hashed `HashMap`. See [`writes::run`].

mod writes;

use serde_json::Value;
use stephost_guest::{Ctx, Error};

fn run(ctx: &mut Ctx, input: writes::Input) -> Result<Value, Error> {
    writes::run(ctx, input, None)
}

stephost_guest::export_step!(run);
