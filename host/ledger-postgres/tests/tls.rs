//! The ledger over TLS, against a throwaway cluster that serves it with
//! `ssl = on` and a certificate a CA made here signs, and that takes TCP
//! connections only over TLS (`hostssl`): for the user `stephost` with no
//! password, `certuser` with a client certificate, `scramuser` with a
//! password (SCRAM).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use stephost_conformance::TestLedger;
use stephost_core::store::{Pool, PoolOptions};
use stephost_ledger_postgres::PgPool;
use stephost_ledger_postgres::throwaway::{Cluster, TestCa, write_private};

const SCRAM_PASSWORD: &str = "scram-secret";

struct Fixture {
    cluster: Cluster,
    /// The CA that signed the server's certificate and the client's.
    ca: PathBuf,
    /// A CA that signed neither.
    other_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let ca = TestCa::new("stephost test CA");
        let cluster = Cluster::start_tls(
            &ca,
            "hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all scramuser 127.0.0.1/32 scram-sha-256\n\
             hostssl all stephost 127.0.0.1/32 trust",
        )
        .expect("start a throwaway PostgreSQL serving TLS");
        cluster
            .psql(&format!(
                "CREATE ROLE certuser LOGIN SUPERUSER; \
                 CREATE ROLE scramuser LOGIN SUPERUSER PASSWORD '{SCRAM_PASSWORD}'"
            ))
            .expect("create the test roles");
        let write = |name: &str, text: &str| {
            let path = cluster.path(name);
            std::fs::write(&path, text).expect("write a test certificate");
            path
        };
        let (client_cert, client_key) = ca.client("certuser");
        let client_key_path = cluster.path("client.key");
        write_private(&client_key_path, client_key.as_bytes()).expect("write the client key");
        Fixture {
            ca: write("ca.pem", &ca.pem()),
            other_ca: write("other-ca.pem", &TestCa::new("another CA").pem()),
            client_cert: write("client.pem", &client_cert),
            client_key: client_key_path,
            cluster,
        }
    })
}

/// A URL of a new schema of the TLS cluster, as `user` at `host` with
/// `params`, and the application name its connections show.
fn ledger_url(user: &str, host: &str, params: &str) -> (String, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let f = fixture();
    let name = format!("tls_{}", NEXT.fetch_add(1, Ordering::Relaxed));
    f.cluster
        .psql(&format!("CREATE SCHEMA {name}"))
        .expect("create a schema");
    let url = format!(
        "postgres://{user}@{host}:{}/postgres?options=-c%20search_path%3D{name}\
         &application_name={name}&{params}",
        f.cluster.port()
    );
    (url, name)
}

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// The server's sessions of application `name`: (over TLS, not).
fn sessions(name: &str) -> (u32, u32) {
    let count = |ssl: bool| {
        fixture()
            .cluster
            .psql(&format!(
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = '{name}' AND s.ssl = {ssl}"
            ))
            .expect("read pg_stat_ssl")
            .parse()
            .expect("a count")
    };
    (count(true), count(false))
}

fn refused(url: &str) -> String {
    match PgPool::open(url, PoolOptions::default()) {
        Ok(_) => panic!("{url} was opened"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn says(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} is not in: {message}");
    }
}

#[test]
fn sslmode_require_connects_over_tls() {
    let (url, name) = ledger_url("stephost", "127.0.0.1", "sslmode=require");
    let pool = PgPool::open(&url, PoolOptions::default()).expect("open over TLS");
    pool.store().unwrap().status_counts().expect("read");
    let (tls, plain) = sessions(&name);
    assert!(tls >= 1, "no session over TLS");
    assert_eq!(plain, 0);
}

#[test]
fn without_sslmode_tls_is_used_when_the_server_offers_it() {
    // libpq's default, prefer.
    let (url, name) = ledger_url("stephost", "127.0.0.1", "");
    let _pool = PgPool::open(&url, PoolOptions::default()).expect("open");
    let (tls, plain) = sessions(&name);
    assert!(tls >= 1, "no session over TLS");
    assert_eq!(plain, 0);
}

#[test]
fn verify_full_with_the_right_ca_makes_every_connection_tls_the_listener_and_group_commit_too() {
    let f = fixture();
    let (url, name) = ledger_url(
        "stephost",
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", path(&f.ca)),
    );
    let pool: Arc<dyn Pool> =
        Arc::new(PgPool::open(&url, PoolOptions { group_commit: true }).expect("open over TLS"));
    // A commit through the group committer's connection, read back by a
    // store's.
    let shared = pool.clone();
    let make = move || TestLedger {
        pool: shared.clone(),
        guard: Box::new(()),
    };
    stephost_conformance::a_durable_commit_is_visible_to_another_store_once_answered(&make);
    // The listening connection: woken once it listens (or once it failed,
    // before it tries again).
    let (woken, wakes) = mpsc::channel();
    pool.watch_due(Arc::new(move || {
        let _ = woken.send(());
    }))
    .unwrap();
    let listening = || {
        f.cluster
            .psql(&format!(
                "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                 WHERE a.application_name = '{name}' AND a.query = 'LISTEN stephost_due' \
                 AND s.ssl"
            ))
            .unwrap()
            == "1"
    };
    let mut tries = 0;
    while !listening() {
        tries += 1;
        assert!(tries <= 5, "the listener has no TLS session");
        // Only a hang becomes a failure here: a wake-up comes at once, or
        // after the listener's reconnect delay.
        wakes
            .recv_timeout(Duration::from_secs(60))
            .expect("the listener wakes its worker");
    }
    let (tls, plain) = sessions(&name);
    assert!(
        tls >= 3,
        "{tls} sessions over TLS: a store's, the committer's, the listener's"
    );
    assert_eq!(plain, 0);
}

#[test]
fn verify_ca_checks_the_ca_and_not_the_host_name() {
    let f = fixture();
    // A name the certificate does not hold, reached at the server's address.
    let host = format!("not-in-the-cert.invalid:{}", f.cluster.port());
    let with = |ca: &PathBuf| {
        format!(
            "postgres://stephost@{host}/postgres?hostaddr=127.0.0.1&sslmode=verify-ca\
             &sslrootcert={}",
            path(ca)
        )
    };
    PgPool::open(&with(&f.ca), PoolOptions::default()).expect("the right CA is enough");
    let e = refused(&with(&f.other_ca));
    says(
        &e,
        &[
            "not signed by a CA in sslrootcert",
            &path(&f.other_ca),
            "UnknownIssuer",
        ],
    );
}

#[test]
fn verify_full_refuses_a_host_name_the_certificate_does_not_hold() {
    let f = fixture();
    let url = format!(
        "postgres://stephost@not-in-the-cert.invalid:{}/postgres?hostaddr=127.0.0.1\
         &sslmode=verify-full&sslrootcert={}",
        f.cluster.port(),
        path(&f.ca)
    );
    says(
        &refused(&url),
        &[
            "not for \"not-in-the-cert.invalid\"",
            "127.0.0.1",
            "sslmode=verify-ca",
        ],
    );
    // And by a name it holds, it connects.
    let by_name = format!(
        "postgres://stephost@localhost:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full\
         &sslrootcert={}",
        f.cluster.port(),
        path(&f.ca)
    );
    PgPool::open(&by_name, PoolOptions::default()).expect("connect as localhost");
}

#[test]
fn a_client_certificate_authenticates_where_the_server_requires_one() {
    let f = fixture();
    let verify = format!("sslmode=verify-full&sslrootcert={}", path(&f.ca));
    let (url, name) = ledger_url(
        "certuser",
        "127.0.0.1",
        &format!(
            "{verify}&sslcert={}&sslkey={}",
            path(&f.client_cert),
            path(&f.client_key)
        ),
    );
    let _pool = PgPool::open(&url, PoolOptions::default()).expect("open with a client cert");
    assert!(sessions(&name).0 >= 1);
    let (without, _) = ledger_url("certuser", "127.0.0.1", &verify);
    says(
        &refused(&without),
        &[
            "requires a valid client certificate",
            "sslcert=PATH and sslkey=PATH",
        ],
    );
    // A key others can read is refused before anything is sent.
    let loose = f.cluster.path("loose.key");
    std::fs::copy(&f.client_key, &loose).unwrap();
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (url, _) = ledger_url(
        "certuser",
        "127.0.0.1",
        &format!(
            "{verify}&sslcert={}&sslkey={}",
            path(&f.client_cert),
            path(&loose)
        ),
    );
    says(&refused(&url), &["readable by others", "chmod 600"]);
}

#[test]
fn scram_authentication_is_bound_to_the_tls_session() {
    let f = fixture();
    // channel_binding=require: SCRAM-SHA-256-PLUS, or no connection.
    let (url, _) = ledger_url(
        &format!("scramuser:{SCRAM_PASSWORD}"),
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}&channel_binding=require",
            path(&f.ca)
        ),
    );
    PgPool::open(&url, PoolOptions::default()).expect("open with SCRAM-SHA-256-PLUS");
}

#[test]
fn sslmode_disable_against_a_server_that_takes_only_tls_fails_saying_so() {
    let (url, _) = ledger_url("stephost", "127.0.0.1", "sslmode=disable");
    says(
        &refused(&url),
        &[
            "no pg_hba.conf entry",
            "only over TLS",
            "sslmode=verify-full",
        ],
    );
}
