//! Test harness: real `redis-server` processes on free loopback ports (standalone, or a Cluster
//! of 3 masters with a replica each), killed when dropped or when the test process exits, and
//! a TCP proxy that delays replies. Tests never talk to a server they did not start.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_redis::{ClockSource, OnError, RedisConfig, RedisStore};

mod slow_proxy;
#[allow(unused_imports)]
pub use slow_proxy::SlowProxy;

/// Fails (never skips) when Redis is not installed, saying how to install it.
pub fn require_redis() {
    for tool in ["redis-server", "redis-cli"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "`{tool}` not found: the tollgate-redis tests start real Redis servers. Install them \
             with `apt-get install -y redis-server redis-tools` (no service needs to run)."
        );
    }
}

/// A port free on 127.0.0.1 (and, for Cluster nodes, its bus port + 10000 too).
fn free_port(cluster: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if !cluster {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One `redis-server` process. A bash wrapper owns it and kills it as soon as its stdin closes,
/// so the server dies with the test process even when a `static` server is never dropped.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// Extra `redis-cli` arguments (TLS servers: `--tls --cacert ...`).
    cli: Vec<String>,
    wrapper: Option<Child>,
    pid: Option<u32>,
    /// Whether the server said it accepts connections (so a kill waits for its port to close).
    ready: bool,
}

impl RedisServer {
    /// A standalone server, answering PING when this returns.
    pub fn start() -> Self {
        Self::start_with(free_port(false), Vec::new())
    }

    fn start_with(port: u16, extra: Vec<String>) -> Self {
        require_redis();
        Self::first_start(port, |port| RedisServer {
            port,
            dir: Self::dir_for(port),
            extra: extra.clone(),
            cli: Vec::new(),
            wrapper: None,
            pid: None,
            ready: false,
        })
    }

    fn dir_for(port: u16) -> PathBuf {
        std::env::temp_dir().join(format!("tollgate-redis-test-{}-{port}", std::process::id()))
    }

    /// Starts the server `make` describes on `port`, or on another free port when that one was
    /// taken before the server could bind it (by another test's server, between `free_port`
    /// and now).
    fn first_start(mut port: u16, make: impl Fn(u16) -> RedisServer) -> Self {
        let cluster = make(port).extra.iter().any(|a| a == "--cluster-enabled");
        for _ in 0..5 {
            let mut server = make(port);
            if server.try_spawn() {
                return server;
            }
            server.kill();
            port = free_port(cluster);
        }
        panic!("redis-server found no free port in 5 tries");
    }

    /// Starts the server again on its port, which it had a moment ago.
    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "redis-server on port {} did not start; see {}",
            self.port,
            self.dir.join("redis.log").display()
        );
    }

    /// Starts the server and waits until its log says it accepts connections: `false` when it
    /// exits first (its port taken). A connection alone could reach another test's server on
    /// the port, which goes away with that test.
    fn try_spawn(&mut self) -> bool {
        let mut args = tollgate_testkit::redis::plain_args(self.port);
        args.extend(
            [
                "--daemonize",
                "no",
                "--dir",
                self.dir.to_str().unwrap(),
                "--logfile",
                "redis.log",
            ]
            .map(str::to_owned),
        );
        args.extend(self.extra.iter().cloned());
        std::fs::create_dir_all(&self.dir).unwrap();
        // A revived node's directory holds its last log, which said "Ready" already.
        let log = self.dir.join("redis.log");
        let _ = std::fs::remove_file(&log);
        // The wrapper also removes the server's directory, which a `static` server never
        // gets to do in `Drop`.
        // A `keep` file in it keeps the directory (a Cluster node's nodes.conf) for a restart.
        let script = r#"redis-server "$@" & R=$!; echo $R; read _; kill -9 $R 2>/dev/null; wait $R 2>/dev/null; [ -e "$TG_REDIS_DIR/keep" ] || rm -rf "$TG_REDIS_DIR""#;
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg("redis-wrapper")
            .env("TG_REDIS_DIR", &self.dir)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bash");
        let mut out = child.stdout.take().unwrap();
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while out.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        self.pid = String::from_utf8_lossy(&line).trim().parse().ok();
        self.wrapper = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            if said.contains("Ready to accept connections") {
                self.ready = true;
                return true;
            }
            // Until the wrapper reaps it, a server that exited is a zombie, state `Z`.
            let running = self.pid.is_some_and(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| !rest.starts_with('Z'))
                })
            });
            if !running || Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A server that speaks only TLS on its port, with `cert`/`key` signed by `ca` (PEM files).
    pub fn start_tls(ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Self {
        require_redis();
        let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
        Self::first_start(free_port(false), |port| RedisServer {
            port,
            dir: Self::dir_for(port),
            extra: vec![
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                path(cert),
                "--tls-key-file".into(),
                path(key),
                "--tls-ca-cert-file".into(),
                path(ca),
                "--tls-auth-clients".into(),
                "no".into(),
            ],
            cli: vec!["--tls".into(), "--cacert".into(), path(ca)],
            wrapper: None,
            pid: None,
            ready: false,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the server answers PING right now.
    pub fn pings(&self) -> bool {
        self.command(&["PING"]).is_some_and(|r| r.contains("PONG"))
    }

    /// Runs a command with `redis-cli` against this server; `None` if it cannot connect.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.cli)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// `INFO commandstats` calls of `command` (lowercase, e.g. "evalsha").
    pub fn command_calls(&self, command: &str) -> u64 {
        let info = self.command(&["INFO", "commandstats"]).unwrap_or_default();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Kills the server (SIGKILL, like a crash) and waits until its port refuses.
    pub fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        if let Some(mut w) = self.wrapper.take() {
            drop(w.stdin.take());
            let _ = w.wait();
        }
        if !std::mem::take(&mut self.ready) {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server (SIGKILL) but keeps its directory, so [`revive`](Self::revive) starts
    /// it again as the same Cluster node (its `nodes.conf`: its id, epoch and slots).
    pub fn kill_keeping_config(&mut self) {
        std::fs::write(self.dir.join("keep"), b"").unwrap();
        self.kill();
    }

    /// Starts a server killed by [`kill_keeping_config`](Self::kill_keeping_config) again.
    pub fn revive(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("keep"));
        self.spawn();
    }

    /// Whether this server's process is running (not killed).
    pub fn alive(&self) -> bool {
        self.pid.is_some()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Cluster of 3 masters with one replica each, `cluster_state:ok` on every node.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with_replicas(1)
    }

    /// A Cluster of 3 masters with `replicas` replicas each (0: a master lost is its slots
    /// lost, and the Cluster goes to `cluster_state:fail`).
    pub fn start_with_replicas(replicas: usize) -> Self {
        require_redis();
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(
                    free_port(true),
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                    ]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
                )
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    /// Polls until every live node reports `cluster_state:ok` and every replica is in sync
    /// with its master (a replica that never synced refuses to take over).
    pub fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().filter(|n| n.pid.is_some()).all(|n| {
                n.command(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok"))
                    && n.command(&["INFO", "replication"]).is_some_and(|i| {
                        i.contains("role:master") || i.contains("master_link_status:up")
                    })
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node currently master of `slot`.
    pub fn master_of(&mut self, slot: u16) -> &mut RedisServer {
        let port = self
            .master_port(slot)
            .expect("no live master owns the slot");
        self.nodes.iter_mut().find(|n| n.port == port).unwrap()
    }

    /// The port of the master of `slot` as the first live node sees it (gossip may lag).
    pub fn master_port(&self, slot: u16) -> Option<u16> {
        let live = self.nodes.iter().find(|n| n.pid.is_some())?;
        let text = live.command(&["CLUSTER", "NODES"])?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !f.get(2)?.contains("master") || f.get(2)?.contains("fail") {
                return None;
            }
            let owns = f[8..].iter().any(|r| match r.split_once('-') {
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => r.parse::<u16>().is_ok_and(|s| s == slot),
            });
            if !owns {
                return None;
            }
            f[1].split(['@', ':']).nth(1)?.parse::<u16>().ok()
        })
    }
}

/// A store on `url` with a local clock (the conformance suite's), no deny cache. It fails
/// closed (`on_error = deny`): a script error must not pass unseen behind a local fallback
/// that happens to decide alike.
pub async fn local_store(url: &str) -> RedisStore {
    let mut config = RedisConfig::standalone(url);
    config.clock = ClockSource::Local;
    config.on_error = OnError::Deny;
    config.deny_cache_size = 0;
    config.timeout = Duration::from_secs(2);
    RedisStore::new(config).await.unwrap()
}

/// A store on a Cluster with a local clock, no deny cache, failing closed.
pub async fn local_cluster_store(seeds: &[String]) -> RedisStore {
    let mut config = RedisConfig::cluster(seeds);
    config.clock = ClockSource::Local;
    config.on_error = OnError::Deny;
    config.deny_cache_size = 0;
    config.timeout = Duration::from_secs(2);
    RedisStore::new(config).await.unwrap()
}

/// A store with the given failure mode and timeout (Redis clock, default deny cache).
pub async fn store_with(url: &str, on_error: OnError, timeout: Duration) -> RedisStore {
    let mut config = RedisConfig::standalone(url);
    config.on_error = on_error;
    config.timeout = timeout;
    RedisStore::new(config).await.unwrap()
}

/// Polls `condition` every 20 ms until it holds or `within` passes; returns whether it held.
pub async fn eventually<F, Fut>(within: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
