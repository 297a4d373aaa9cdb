//! Claims are one compare-and-set on a run's version: however many
//! claimants race for the same version, exactly one wins, and the fencing
//! token goes up by one.

use std::sync::{Arc, Barrier};

use stephost::ledger::{Ledger, LedgerError, NewRun, SqliteLedger};

fn race(claimants: usize, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let mut setup = SqliteLedger::open(&db).unwrap();
    setup.put_module("digest", b"\0asm").unwrap();
    for round in 0..rounds {
        setup
            .create_run(NewRun {
                world: stephost::engine::WORLD,
                durable: false,
                run_id: &format!("run-{round}"),
                module_digest: "digest",
                step: None,
                input: "{}",
                now_ms: 1,
            })
            .unwrap();
    }
    let barrier = Arc::new(Barrier::new(claimants));
    let handles: Vec<_> = (0..claimants)
        .map(|who| {
            let barrier = barrier.clone();
            let db = db.clone();
            std::thread::spawn(move || {
                let mut ledger = SqliteLedger::open(&db).unwrap();
                let mut won = Vec::new();
                for round in 0..rounds {
                    barrier.wait();
                    let result = ledger.claim(
                        &format!("run-{round}"),
                        &format!("worker-{who}"),
                        60_000,
                        stephost::clock::now_ms(),
                        &|_| true,
                    );
                    match result {
                        Ok(claim) => won.push((round, claim.fence)),
                        Err(LedgerError::VersionConflict { .. })
                        | Err(LedgerError::ClaimedElsewhere { .. }) => {}
                        Err(other) => panic!("unexpected claim error: {other}"),
                    }
                }
                won
            })
        })
        .collect();
    let mut winners = vec![0usize; rounds];
    for handle in handles {
        for (round, fence) in handle.join().unwrap() {
            winners[round] += 1;
            assert_eq!(fence, 1, "the first claim of a run gets fencing token 1");
        }
    }
    for (round, n) in winners.iter().enumerate() {
        assert_eq!(*n, 1, "round {round}: {n} claimants won");
    }
    for round in 0..rounds {
        let run = setup.run(&format!("run-{round}")).unwrap();
        assert_eq!(run.fence, 1);
        assert_eq!(run.version, 1);
        assert!(run.owner.unwrap().starts_with("worker-"));
    }
}

#[test]
fn two_claimants_racing_for_the_same_version_have_exactly_one_winner() {
    race(2, 100);
}

#[test]
fn sixteen_claimants_racing_for_the_same_version_have_exactly_one_winner() {
    race(16, 100);
}
