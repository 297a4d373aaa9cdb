//! The library as an embedding uses it: one long-lived host with an
//! instance pool, a step loaded once and started many times.

use serde_json::Value;
use stephost_core::RunStatus;
use stephost_core::store::Opener;
use stephost_core::store::PoolOptions;
use stephost_ledger::Ledger;
use stephost_runtime::config::Config;
use stephost_runtime::{Host, HostOptions};
use stephost_tests::{SUPPLIER_CONFIG, guests};

/// A host over the SQLite ledger at `db`.
fn open_host(db: &std::path::Path, options: HostOptions) -> Host {
    let pool = Ledger::sqlite(db)
        .open(PoolOptions::default())
        .expect("the ledger");
    Host::open(pool, options).expect("host")
}

const INPUT: &str = r#"{"sku":"WIDGET-7","quantity":10}"#;

/// A host on a ledger in `dir`, and the guest at `path` loaded into it.
fn host_with_step(
    dir: &std::path::Path,
    options: HostOptions,
    path: &str,
) -> (Host, std::sync::Arc<stephost_runtime::engine::Loaded>) {
    let mut host = open_host(&dir.join("runs.db"), options);
    let module = std::fs::read(path).expect("the step's component");
    let step = host.load(&module, path).expect("load");
    (host, step)
}

/// Runs `step` on `input` as `run_id`, checks that it completed, and
/// returns its output.
fn completed_output(
    host: &mut Host,
    step: &std::sync::Arc<stephost_runtime::engine::Loaded>,
    input: &str,
    run_id: &str,
) -> Value {
    let report = host.run_loaded(step, input, Some(run_id)).expect("run");
    assert_eq!(report.status, RunStatus::Completed, "{report:?}");
    serde_json::from_str(report.output.as_deref().expect("output")).expect("JSON output")
}

#[test]
fn a_step_loaded_once_runs_many_times_from_a_pooled_host() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::parse(SUPPLIER_CONFIG).expect("config");
    config.base_dir = dir.path().to_path_buf();
    let options = HostOptions {
        limits: config.limits.clone(),
        effects: config.effects().expect("effects"),
        instance_pool: 2,
        ..HostOptions::default()
    };
    let (mut host, step) = host_with_step(dir.path(), options, guests::SUPPLIER_ORDER);

    // More runs than the pool has slots, one after another: each slot is
    // used again.
    for i in 0..5 {
        let output = completed_output(&mut host, &step, INPUT, &format!("order-{i}"));
        assert_eq!(output["ordered"], true);
    }
    let orders = std::fs::read_to_string(dir.path().join("supplier-orders.jsonl"))
        .expect("the supplier's file");
    assert_eq!(orders.lines().count(), 5);

    // Starting a finished run again returns it, and orders nothing.
    let again = host.run_loaded(&step, INPUT, Some("order-0")).expect("run");
    assert_eq!(again.status, RunStatus::Completed);
    assert_eq!(again.stats.live, 0);
    // The same run id with another input is refused.
    let other = host.run_loaded(
        &step,
        r#"{"sku":"WIDGET-7","quantity":11}"#,
        Some("order-0"),
    );
    assert!(other.is_err(), "{other:?}");
    // Bad input is refused before a run is created.
    let bad = host.run_loaded(&step, "{not json", Some("bad-1"));
    assert!(bad.is_err(), "{bad:?}");
    let orders = std::fs::read_to_string(dir.path().join("supplier-orders.jsonl"))
        .expect("the supplier's file");
    assert_eq!(orders.lines().count(), 5);
}

#[test]
fn a_run_in_a_pooled_slot_sees_nothing_the_run_before_it_left_in_memory() {
    // One slot, so every run reuses the memory of the one before; the slot
    // keeps the pages a run touched mapped, and they must be reset.
    let dir = tempfile::tempdir().expect("temp dir");
    let options = HostOptions {
        instance_pool: 1,
        ..HostOptions::default()
    };
    let (mut host, step) = host_with_step(dir.path(), options, guests::WASI_ONLY);
    for i in 0..3 {
        let output = completed_output(&mut host, &step, r#"{"port":1}"#, &format!("fresh-{i}"));
        // Its statics start from their initial values, and the heap it
        // allocates is zero although the run before filled it with 0xA5.
        assert_eq!(output["runs_in_this_memory"], 1, "run {i}: {output}");
        assert_eq!(output["heap_was_zero"], true, "run {i}: {output}");
    }
}

/// A folder with a new ledger's path in it, and host options for the
/// supplier step whose receiver writes its orders into the folder.
fn supplier_ledger() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    impl Fn() -> HostOptions + Send + Sync + 'static,
) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("runs.db");
    let mut config = Config::parse(SUPPLIER_CONFIG).expect("config");
    config.base_dir = dir.path().to_path_buf();
    let options = move || HostOptions {
        limits: config.limits.clone(),
        effects: config.effects().expect("effects"),
        ..HostOptions::default()
    };
    (dir, db, options)
}

#[test]
fn a_worker_takes_the_next_run_as_soon_as_one_ends_not_after_its_poll_interval() {
    let (dir, db, options) = supplier_ledger();
    let mut host = open_host(&db, options());
    let module = std::fs::read(guests::SUPPLIER_ORDER).expect("the supplier step");
    for i in 0..3 {
        host.submit(
            &module,
            "supplier_order.wasm",
            INPUT,
            Some(&format!("order-{i}")),
        )
        .expect("submit");
    }
    // One run at a time, and ten minutes between looks for runnable runs:
    // a worker that slept out the interval while its run was executing
    // would take twenty minutes for the next two. (Its own thread, not a
    // scoped one, so that such a worker fails the test instead of holding it.)
    let worker = stephost_runtime::worker::WorkerOptions {
        concurrency: 1,
        poll_ms: 600_000,
        notified_poll_ms: 600_000,
        exit_when_idle: true,
        ..Default::default()
    };
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let never = std::sync::atomic::AtomicBool::new(false);
        let _ = done.send(stephost_runtime::worker::run(
            &Ledger::sqlite(&db),
            &options,
            &worker,
            &never,
        ));
    });
    let report = finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the worker finished three short runs within two minutes")
        .expect("the worker ran");
    assert_eq!(report.completed, 3, "{report:?}");
    let orders = std::fs::read_to_string(dir.path().join("supplier-orders.jsonl"))
        .expect("the supplier's file");
    assert_eq!(orders.lines().count(), 3);
}

#[test]
fn a_worker_runs_the_next_run_on_the_host_a_failed_run_gave_back() {
    // One run at a time, so every run after the first is executed by the
    // host (and ledger connection) of the run before: a trap in one must
    // leave nothing behind for the next.
    let (dir, db, options) = supplier_ledger();
    let mut host = open_host(&db, options());
    let supplier = std::fs::read(guests::SUPPLIER_ORDER).expect("the supplier step");
    let panicker = std::fs::read(guests::PANICKER).expect("the panicking step");
    let runs = [
        ("1-order", &supplier, "supplier_order.wasm"),
        ("2-panics", &panicker, "panicker.wasm"),
        ("3-order", &supplier, "supplier_order.wasm"),
        ("4-order", &supplier, "supplier_order.wasm"),
    ];
    // Submitted in this order, and named so that it is also the order of
    // their ids (runs submitted within one millisecond are taken by id).
    for (id, module, what) in runs {
        host.submit(module, what, INPUT, Some(id)).expect("submit");
    }
    let worker = stephost_runtime::worker::WorkerOptions {
        concurrency: 1,
        exit_when_idle: true,
        ..Default::default()
    };
    let never = std::sync::atomic::AtomicBool::new(false);
    let report = stephost_runtime::worker::run(&Ledger::sqlite(&db), &options, &worker, &never)
        .expect("the worker ran");
    assert_eq!((report.completed, report.failed), (3, 1), "{report:?}");
    let first = host.store().calls("1-order", 1, usize::MAX).expect("calls");
    for id in ["3-order", "4-order"] {
        let run = host.store().run(id).expect("run");
        assert_eq!(run.status, RunStatus::Completed, "{id}: {:?}", run.error);
        let calls = host.store().calls(id, 1, usize::MAX).expect("calls");
        let shape = |c: &[stephost_core::CallRecord]| {
            c.iter()
                .map(|c| (c.seq, c.interface.clone(), c.function.clone(), c.state))
                .collect::<Vec<_>>()
        };
        assert_eq!(shape(&calls), shape(&first), "{id} recorded its own calls");
    }
    let orders = std::fs::read_to_string(dir.path().join("supplier-orders.jsonl"))
        .expect("the supplier's file");
    assert_eq!(orders.lines().count(), 3);
}
