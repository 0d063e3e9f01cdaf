//! `tollgate`: the rate limiter's command line. `serve` runs the server (built-in default or
//! `--config FILE`), `validate FILE` checks a configuration and prints its effective policies,
//! `completions` and `man` print the shell completions and the man page, and `replay` runs access
//! logs through a configuration (see `replay.rs`).

mod generate;
mod logging;
mod replay;
mod stdout;
mod systemd;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tollgate_server::{Config, ConfigError, Listeners};

/// Tollgate: a rate limiter as a decision API, a reverse proxy and a forward-auth target.
#[derive(Parser, Debug)]
#[command(name = "tollgate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server: with no arguments on the built-in default (memory store, one policy of
    /// 100 requests a minute per x-api-key or IP, API on 127.0.0.1:8080, admin on :9090).
    Serve {
        /// A TOML configuration file (reloaded on SIGHUP and when it changes).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// A folder of envoyproxy/ratelimit YAML files (subfolders included): serve Envoy's
        /// rate limit service from them, on 127.0.0.1:8081 unless the configuration file sets
        /// [server] grpc_listen. Alone, it needs no TOML. Reloaded when a file changes,
        /// appears or goes.
        // The text is `--help`'s, where "[server]" names a TOML table, not a doc link.
        #[allow(rustdoc::broken_intra_doc_links)]
        #[arg(long, value_name = "DIR")]
        envoy_config: Option<PathBuf>,
    },
    /// Check a configuration file: print its effective policies, or every error with
    /// file:line:column, and exit non-zero.
    Validate {
        /// The TOML configuration file.
        file: PathBuf,
    },
    /// Print the completion script for a shell, e.g.
    /// `tollgate completions bash > /etc/bash_completion.d/tollgate`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (`tollgate man | man -l -`), or with --dir write the pages of
    /// tollgate and of each subcommand into a folder.
    Man {
        /// The folder to write tollgate.1, tollgate-serve.1, ... into.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run access logs through a configuration on their own clock: what would have been
    /// denied, which keys, at what peak rates; with --sweep, the same for other quotas.
    Replay(Box<replay::ReplayArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (program, result) = match cli.command {
        Command::Validate { file } => ("tollgate", validate(&file)),
        Command::Replay(args) => ("tollgate replay", success(replay::run(*args))),
        Command::Serve {
            config,
            envoy_config,
        } => ("tollgate", success(serve(config, envoy_config))),
        Command::Completions { shell } => ("tollgate", success(generate::completions(shell))),
        Command::Man { dir } => ("tollgate", success(generate::man(dir.as_deref()))),
    };
    exit(program, result)
}

/// A command's `Ok(())` as the status of success.
fn success(result: anyhow::Result<()>) -> anyhow::Result<ExitCode> {
    result.map(|()| ExitCode::SUCCESS)
}

/// The exit status of a command that ended with `result`: its error printed on standard error
/// after `program` (each cause once, see [`chain`]), status 1; a closed standard output ends
/// it quietly with status 0 (see `stdout.rs`).
fn exit(program: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) if stdout::closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!, which panics when standard error cannot be written either.
            let _ = writeln!(std::io::stderr(), "{program}: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, `: `-separated, leaving out a cause whose text the message before
/// it already ends with (most of the server's errors say their cause themselves, and printed
/// whole it came twice: "... (os error 2): No such file or directory (os error 2)").
fn chain(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// `tollgate validate FILE`: the effective configuration on standard output, status 0; or
/// every error on standard error, status 1.
fn validate(file: &Path) -> anyhow::Result<ExitCode> {
    let config = match Config::load(file) {
        Ok(config) => config,
        Err(ConfigError::Invalid(d)) => {
            let n = d.0.len();
            let s = if n == 1 { "" } else { "s" };
            let _ = writeln!(std::io::stderr(), "{d}\n{}: {n} error{s}", file.display());
            return Ok(ExitCode::FAILURE);
        }
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    // What only building the engine finds (a file that validates but that the server would
    // refuse at start) is found here too.
    let store = tollgate::MemoryStore::new();
    if let Err(e) = tollgate_server::http_engine(&config, store, tollgate::SystemClock::new()) {
        let _ = writeln!(
            std::io::stderr(),
            "{}: cannot build the policy engine: {e}",
            file.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    stdout::write(effective(&config)).context("cannot write the effective configuration")?;
    Ok(ExitCode::SUCCESS)
}

/// What `validate` prints of a valid configuration: its policies, lists, Envoy domains and
/// listeners over TLS, one a line.
fn effective(config: &Config) -> String {
    // Writing to a String cannot fail: the results are left unused.
    let mut text = String::new();
    for p in config.policies.iter() {
        let _ = writeln!(text, "{p}");
    }
    if config.policies.is_empty() {
        text.push_str("(no policies: every request is admitted)\n");
    }
    for l in &config.lists {
        let n = l.entries.len();
        let _ = writeln!(
            text,
            "list {:?}: {}, {n} {}",
            l.name,
            l.action.as_str(),
            if n == 1 { "entry" } else { "entries" }
        );
    }
    if let Some(envoy) = &config.envoy {
        for d in &envoy.domains {
            let _ = writeln!(
                text,
                "envoy domain {:?} from {}",
                d.name(),
                envoy.config_dir.display()
            );
        }
    }
    let proxy_tls = config.proxy.as_ref().and_then(|p| p.tls.as_ref());
    for (table, tls) in [
        ("[server]", config.tls.as_ref()),
        ("[admin]", config.admin_tls.as_ref()),
        ("[proxy]", proxy_tls),
    ] {
        if let Some(tls) = tls {
            let _ = writeln!(text, "{table} over TLS: {}", tls_text(tls));
        }
    }
    text
}

/// A listener's TLS files, as `validate` lists them.
fn tls_text(tls: &tollgate_server::config::TlsConfig) -> String {
    let mut text = format!(
        "certificate {}, key {}",
        tls.cert.display(),
        tls.key.display()
    );
    if let Some(ca) = &tls.client_ca {
        text.push_str(&format!(
            "; clients need a certificate from {}",
            ca.display()
        ));
    }
    text
}

/// `https` for a listener over TLS, `http` otherwise.
fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}

/// The configuration `serve` runs: the file, the `--envoy-config` folder, both, or the
/// built-in default.
fn serve_config(path: Option<&Path>, envoy: Option<&Path>) -> Result<Config, ConfigError> {
    match (path, envoy) {
        (Some(p), None) => Config::load(p),
        (Some(p), Some(dir)) => Config::load_with_envoy_dir(p, dir),
        (None, Some(dir)) => Config::envoy_only(dir),
        (None, None) => Ok(Config::builtin()),
    }
}

fn serve(path: Option<PathBuf>, envoy: Option<PathBuf>) -> anyhow::Result<()> {
    let config = match serve_config(path.as_deref(), envoy.as_deref()) {
        Ok(c) => c,
        Err(ConfigError::Invalid(d)) => anyhow::bail!("invalid configuration:\n{d}"),
        Err(e) => return Err(e.into()),
    };
    // Set up from [log], so it is read before anything is logged.
    logging::init(&config.log);
    run(path, envoy, config)
}

#[tokio::main]
async fn run(path: Option<PathBuf>, envoy: Option<PathBuf>, config: Config) -> anyhow::Result<()> {
    let shutdown = shutdown_signal();
    let listeners = Listeners::bind(&config)
        .await
        .context("cannot bind the listeners")?;
    let addrs = listeners.local_addrs();
    // Each serving listener holds up to max_connections, and a proxied connection one more to
    // the upstream; the admin listener (scrapes and probes) and the rest (store, files,
    // listeners) fit in the margin.
    let per_listener = u64::try_from(config.limits.max_connections).unwrap_or(u64::MAX);
    let sockets = [addrs.api, addrs.grpc, addrs.resp, addrs.proxy, addrs.proxy]
        .iter()
        .filter(|a| a.is_some())
        .count() as u64;
    raise_open_file_limit(per_listener.saturating_mul(sockets).saturating_add(256));
    let (api, admin, proxy) = (addrs.api, addrs.admin, addrs.proxy);
    let source = match (&path, &envoy) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(dir)) => format!("envoyproxy/ratelimit files in {}", dir.display()),
        (None, None) => "the built-in default".to_owned(),
    };
    // The banner, written whole; a reader that went away (`tollgate serve | head -1`) does not
    // stop the server (println! would panic), and writing to a String cannot fail.
    let mut banner = String::new();
    let _ = writeln!(
        banner,
        "tollgate {} serving {source}",
        env!("CARGO_PKG_VERSION")
    );
    for p in config.policies.iter() {
        let _ = writeln!(banner, "  policy {p}");
    }
    let (api_s, admin_s) = (
        scheme(config.tls.is_some()),
        scheme(config.admin_tls.is_some()),
    );
    let proxy_s = scheme(config.proxy.as_ref().is_some_and(|p| p.tls.is_some()));
    let grpc_s = if config.tls.is_some() {
        "grpcs"
    } else {
        "grpc"
    };
    if let Some(a) = api {
        let _ = writeln!(
            banner,
            "  decision API  {api_s}://{a}  (POST /v1/check, /v1/forward-auth)"
        );
    }
    if let Some(a) = admin {
        let _ = writeln!(
            banner,
            "  admin         {admin_s}://{a}  (/metrics /healthz /readyz /v1/policies)"
        );
    }
    if let Some(a) = proxy {
        let _ = writeln!(banner, "  proxy         {proxy_s}://{a}");
    }
    if let Some(a) = addrs.grpc {
        let _ = writeln!(
            banner,
            "  envoy RLS     {grpc_s}://{a}  (envoy.service.ratelimit.v3.RateLimitService)"
        );
    }
    if let Some(a) = addrs.resp {
        let _ = writeln!(
            banner,
            "  redis proto   redis://{a}  (TOLLGATE.CHECK, CL.THROTTLE)"
        );
    }
    // With --envoy-config alone there are no HTTP policies to try.
    if let (Some(a), Some(policy)) = (api, config.policies.first()) {
        let _ = writeln!(
            banner,
            "try:\n  curl -i -X POST {api_s}://{a}/v1/check -H 'content-type: application/json' -d '{{\"policy\":\"{}\",\"key\":\"customer-42\",\"cost\":1}}'",
            policy.name()
        );
    }
    // At once: the addresses (which port 0 leaves to the system) are known from the bind, and
    // connections made from now on are held until the server answers them.
    let _ = stdout::write(banner);
    let stopping = async {
        shutdown.await;
        systemd::stopping();
    };
    // Ready, to a service manager, once the server answers: the store connected, the state
    // restored (which may first wait for another server's lock on the state file).
    tollgate_server::run_serving(config, listeners, stopping, systemd::ready).await?;
    Ok(())
}

/// Raises the soft limit on open files to the hard one, as Go's runtime does for every program:
/// many systems start processes at 1,024 descriptors, where a server that may hold 10,000
/// connections per listener would fail to accept past the first thousand. Logs a warning when
/// even the hard limit is below `needed`, which only the administrator can raise.
#[cfg(unix)]
fn raise_open_file_limit(needed: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    /// The kernel refuses more than `fs.nr_open` (1,048,576 by default), "unlimited" included.
    const NR_OPEN: u64 = 1 << 20;
    let limit = getrlimit(Resource::Nofile);
    let Some(soft) = limit.current else {
        return;
    };
    let target = limit.maximum.unwrap_or(NR_OPEN).min(NR_OPEN);
    if soft < target {
        let raised = Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!(error = %e, soft, target, "could not raise the open file limit");
        }
    }
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    if now < needed {
        tracing::warn!(
            limit = now,
            needed,
            "the open file limit is below what max_connections allows: connections past it wait \
             for a free descriptor; raise it (ulimit -n, or LimitNOFILE= in a systemd unit) or \
             lower [server] max_connections"
        );
    }
}

#[cfg(not(unix))]
fn raise_open_file_limit(_needed: u64) {}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled: a SIGTERM that arrives while the server starts is then a clean
/// shutdown, not the signal's default (an exit that drains nothing and tells systemd nothing).
///
/// A second signal during the drain stops the process at once, with status 1: an operator who
/// presses Ctrl-C twice, or a supervisor that asks again, means now. What was decided since the
/// last snapshot of `[store] path` is then not saved.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = term.recv() => {}
                    }
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = interrupt.recv() => {}
                            _ = term.recv() => {}
                        }
                        tracing::warn!("a second signal: stopping now, without draining");
                        std::process::exit(1);
                    });
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
