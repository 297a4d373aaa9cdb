//! `supplier-receiver --listen 127.0.0.1:8080 [--state FILE]`: serves the supplier order
//! API until interrupted, printing every request it receives on stderr.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use supplier_receiver::{Config, DEFAULT_CUSTOMER_ORDERS, DEFAULT_ON_HAND, Receiver};

/// A supplier's order API: GET /inventory/{sku}, POST /orders (Idempotency-Key),
/// GET /orders/{operation_id}; and a shop's customer orders and refunds:
/// GET /customer-orders/{order_id}, POST /refunds (Idempotency-Key),
/// GET /refunds/{operation_id}. Stop it with Ctrl-C.
#[derive(Parser)]
#[command(name = "supplier-receiver", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Keep orders in this JSON-lines file (fsync'd) and reload them on start.
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// Stock of one sku, e.g. `--stock WIDGET-7=3`; repeatable.
    #[arg(long, value_name = "SKU=N", value_parser = parse_stock)]
    stock: Vec<(String, i64)>,
    /// Stock of every sku not named by --stock.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ON_HAND)]
    default_on_hand: i64,
    /// A customer order and its amount in cents, e.g. `--customer-order A-1003=1250`;
    /// repeatable, added to the built-in A-1001=4999 and A-1002=25000.
    #[arg(long, value_name = "ID=CENTS", value_parser = parse_stock)]
    customer_order: Vec<(String, i64)>,
    /// Do not print requests.
    #[arg(long)]
    quiet: bool,
}

fn parse_stock(s: &str) -> Result<(String, i64), String> {
    let (sku, n) = s.split_once('=').ok_or("expected NAME=N")?;
    let n = n.parse().map_err(|e| format!("bad quantity {n:?}: {e}"))?;
    Ok((sku.to_string(), n))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = Config {
        listen: args.listen,
        stock: args.stock.into_iter().collect::<HashMap<_, _>>(),
        default_on_hand: args.default_on_hand,
        customer_orders: DEFAULT_CUSTOMER_ORDERS
            .iter()
            .map(|&(id, cents)| (id.to_string(), cents))
            .chain(args.customer_order)
            .collect(),
        state_file: args.state.clone(),
        log: !args.quiet,
        deduplicate: true,
    };
    let receiver = match Receiver::start_with(config) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("supplier-receiver: cannot start: {e}");
            return ExitCode::from(1);
        }
    };
    let state = match &args.state {
        Some(path) => format!(
            "; {} order(s) loaded from {}",
            receiver.business_effects(),
            path.display()
        ),
        None => "; orders kept in memory".into(),
    };
    eprintln!(
        "supplier-receiver: listening on {}{state}; Ctrl-C stops",
        receiver.url()
    );
    // Serve until the process is interrupted; every order is fsync'd when created.
    loop {
        std::thread::park();
    }
}
