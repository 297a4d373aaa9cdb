//! A throwaway PostgreSQL cluster for tests and the bench: initialised in
//! a temporary folder, listening on 127.0.0.1 and a socket in that folder,
//! and stopped when dropped, or, if the process dies first, by a watchdog
//! that notices its end. As root it runs as the `postgres` user (PostgreSQL
//! refuses to run as root). A cluster may serve TLS with certificates a
//! [`TestCa`] made.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming a PostgreSQL server the tests use
/// instead of a throwaway cluster (a URL whose user may create schemas).
pub const TEST_SERVER_VAR: &str = "STEPHOST_TEST_POSTGRES";

/// The environment variable naming the folder of PostgreSQL's programs
/// (`initdb`, `pg_ctl`); by default the newest `/usr/lib/postgresql/*/bin`.
pub const BIN_DIR_VAR: &str = "STEPHOST_PG_BIN";

/// A running cluster of our own.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// Runs as this user (when we are root).
    user: Option<String>,
    /// Stops the cluster when its stdin closes: at our end, however it comes.
    watchdog: Option<Child>,
}

impl Cluster {
    /// Initialises and starts a cluster in a temporary folder; its
    /// superuser is `stephost`, who connects without a password from this
    /// machine.
    pub fn start() -> io::Result<Cluster> {
        Self::start_in(&std::env::temp_dir())
    }

    /// [`Cluster::start`] with its folder in `parent` (a benchmark keeps
    /// it on the disk it measures, not on a tmpfs).
    pub fn start_in(parent: &Path) -> io::Result<Cluster> {
        Self::start_with(parent, |_| Ok(()))
    }

    /// A cluster that serves TLS with a certificate `ca` signs for
    /// 127.0.0.1 and localhost, and trusts the client certificates `ca`
    /// signs; `hba` are the lines of its `pg_hba.conf` after one that
    /// lets the cluster's socket in (its superuser `stephost`, for
    /// [`Cluster::psql`]).
    pub fn start_tls(ca: &TestCa, hba: &str) -> io::Result<Cluster> {
        let (cert, key) = ca.server(&["127.0.0.1", "localhost"]);
        let root = ca.pem();
        let hba = format!("local all all trust\n{hba}\n");
        Self::start_with(&std::env::temp_dir(), move |data| {
            std::fs::write(data.join("server.crt"), cert)?;
            write_private(&data.join("server.key"), key.as_bytes())?;
            std::fs::write(data.join("root.crt"), root)?;
            std::fs::write(data.join("pg_hba.conf"), hba)?;
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("postgresql.conf"))?;
            conf.write_all(
                b"ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
                  ssl_ca_file = 'root.crt'\n",
            )
        })
    }

    /// A cluster whose data folder `setup` changes before it starts.
    fn start_with(
        parent: &Path,
        setup: impl FnOnce(&Path) -> io::Result<()>,
    ) -> io::Result<Cluster> {
        let bin = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("stephost-pg-")
            .tempdir_in(parent)?;
        let user = is_root().then(|| "postgres".to_string());
        if let Some(user) = &user {
            run(Command::new("chown").arg(user).arg(dir.path()))?;
        }
        let data = dir.path().join("data");
        let mut cluster = Cluster {
            port: free_port()?,
            dir,
            bin,
            user,
            watchdog: None,
        };
        run(cluster.command("initdb").arg("-D").arg(&data).args([
            "-U",
            "stephost",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]))?;
        let mut watchdog = cluster
            .command("sh")
            .arg("-c")
            .arg("read _; \"$0\" -D \"$1/data\" stop -m immediate; rm -rf \"$1\"")
            .arg(cluster.bin.join("pg_ctl"))
            .arg(cluster.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        // Nothing is written to it: it closes when this process ends.
        let _ = watchdog.stdin.as_mut().map(|s| s.flush());
        cluster.watchdog = Some(watchdog);
        setup(&data)?;
        if let Some(user) = &cluster.user {
            run(Command::new("chown").arg("-R").arg(user).arg(&data))?;
        }
        cluster.pg_ctl("start")?;
        Ok(cluster)
    }

    /// The URL of database `postgres` as the superuser.
    pub fn url(&self) -> String {
        format!("postgres://stephost@127.0.0.1:{}/postgres", self.port)
    }

    /// `name` in the cluster's folder, which goes with it: for a test's
    /// own files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of a new, empty schema of its own (a ledger is made there).
    pub fn fresh_ledger(&self) -> String {
        in_schema(&self.url(), &new_schema(&self.socket_url()))
    }

    /// What `sql` prints (unaligned, tuples only), run by the superuser
    /// over the cluster's socket.
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        let output = Command::new("psql")
            .arg(self.socket_url())
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "psql {sql}: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .trim_end()
            .to_string())
    }

    /// The superuser's URL over the cluster's socket.
    fn socket_url(&self) -> String {
        format!(
            "postgresql://stephost@/postgres?host={}&port={}",
            self.dir.path().display(),
            self.port
        )
    }

    /// Stops the server (`-m fast`: sessions are disconnected) and starts
    /// it again, as an operator's restart would.
    pub fn restart(&self) -> io::Result<()> {
        self.pg_ctl("restart")
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn pg_ctl(&self, action: &str) -> io::Result<()> {
        let data = self.dir.path().join("data");
        let options = format!(
            "-k {} -c listen_addresses=127.0.0.1 -p {} -c max_connections=400 -c fsync=on",
            self.dir.path().display(),
            self.port
        );
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .args(["-o", &options, "-m", "fast", "-w", action]))
    }

    /// `program` (one of PostgreSQL's, or `sh`), as the cluster's user.
    fn command(&self, program: &str) -> Command {
        let path = match program {
            "sh" => PathBuf::from("sh"),
            other => self.bin.join(other),
        };
        match &self.user {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(path);
                command
            }
            None => Command::new(path),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl("stop");
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// The server the tests use: [`TEST_SERVER_VAR`]'s, or a throwaway
/// cluster started once per process.
pub struct TestServer {
    url: String,
    _cluster: Option<Cluster>,
}

impl TestServer {
    /// The process's test server, started on first use.
    pub fn shared() -> &'static TestServer {
        static SERVER: OnceLock<TestServer> = OnceLock::new();
        SERVER.get_or_init(|| match std::env::var(TEST_SERVER_VAR) {
            Ok(url) if !url.is_empty() => TestServer {
                url,
                _cluster: None,
            },
            _ => {
                let cluster = Cluster::start().unwrap_or_else(|e| {
                    panic!(
                        "cannot start a throwaway PostgreSQL for the tests: {e}. Install \
                         PostgreSQL (`apt-get install postgresql`, or \
                         scripts/guest-toolchains.sh), or name a server in {TEST_SERVER_VAR}"
                    )
                });
                TestServer {
                    url: cluster.url(),
                    _cluster: Some(cluster),
                }
            }
        })
    }

    /// The server's own cluster, if it started one.
    pub fn cluster(&self) -> Option<&Cluster> {
        self._cluster.as_ref()
    }

    /// The URL of a new, empty schema of its own (its ledger is made there).
    pub fn fresh_ledger(&self) -> String {
        in_schema(&self.url, &new_schema(&self.url))
    }
}

/// Makes a new, empty schema on the server at `url`; its name.
fn new_schema(url: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let schema = format!(
        "t{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let status = Command::new("psql")
        .arg(url)
        .args(["-q", "-v", "ON_ERROR_STOP=1", "-c"])
        .arg(format!("CREATE SCHEMA {schema}"))
        .stdout(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => schema,
        other => panic!("cannot create schema {schema} on the test server: {other:?}"),
    }
}

/// `url` with `schema` first in its search path.
fn in_schema(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}

/// A certificate authority made for a test, and the certificates it signs
/// (ECDSA P-256, SHA-256).
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("a key for a test CA");
        TestCa {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key)
                .expect("a test CA's certificate"),
        }
    }

    /// Its certificate (PEM).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for a server known by `names` (host names or IP
    /// addresses) and its key (PEM).
    pub fn server(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params =
            rcgen::CertificateParams::new(names.clone()).expect("a test certificate's names");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0].as_str());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A certificate for PostgreSQL's user `user` (its common name, as
    /// `cert` authentication reads it) and its key (PEM).
    pub fn client(&self, user: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, user);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: rcgen::CertificateParams) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("a key for a test certificate");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a test certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes `bytes` to a new file at `path` that only its owner can read.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

fn bin_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(BIN_DIR_VAR) {
        return Ok(PathBuf::from(dir));
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", root.display())))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no PostgreSQL under {} (set {BIN_DIR_VAR})", root.display()),
        )
    })
}

fn is_root() -> bool {
    // The owner of /proc/self is this process's user.
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn run(command: &mut Command) -> io::Result<()> {
    let output = command.output()?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{:?} failed ({}): {}{}",
        command,
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )))
}
