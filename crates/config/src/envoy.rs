//! `tollgate serve --envoy-config DIR`: a configuration whose Envoy rate limit service answers
//! from a folder of envoyproxy/ratelimit YAML files, alone or next to a TOML file, and what the
//! reload reads again and watches.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use super::{Config, ConfigError, Envoy, WatchedFiles};

/// Where `tollgate serve --envoy-config DIR` serves Envoy's rate limit service when no
/// `[server] grpc_listen` says otherwise: envoyproxy/ratelimit's port, on loopback like every
/// default listener.
pub const DEFAULT_GRPC_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8081);

impl Config {
    /// `tollgate serve --envoy-config DIR` alone, the way envoyproxy/ratelimit runs: Envoy's
    /// rate limit service on [`DEFAULT_GRPC_LISTEN`] answering from the envoyproxy/ratelimit
    /// YAML files under `dir`, on the built-in default's listeners and memory store, with no
    /// HTTP policies.
    pub fn envoy_only(dir: &Path) -> Result<Config, ConfigError> {
        let mut config = Config::builtin();
        config.policies = Arc::from(Vec::new());
        config.with_envoy_dir(dir)
    }

    /// `tollgate serve --config FILE --envoy-config DIR`: the file, with Envoy's rate limit
    /// service answering from the envoyproxy/ratelimit YAML files under `dir`; the file may set
    /// `[server] grpc_listen` (where to serve it) without an `[envoy]` table.
    pub fn load_with_envoy_dir(path: &Path, dir: &Path) -> Result<Config, ConfigError> {
        Config::read(path, true)?.with_envoy_dir(dir)
    }

    /// Answers Envoy's rate limit service from the envoyproxy/ratelimit YAML files under `dir`
    /// (subfolders included) in place of `[envoy] config_dir`, on `[server] grpc_listen` or
    /// [`DEFAULT_GRPC_LISTEN`].
    pub fn with_envoy_dir(mut self, dir: &Path) -> Result<Config, ConfigError> {
        let read_from = WatchedFiles::envoy_folder(dir);
        let domains = tollgate_envoy::load_envoy_config_dir(dir).map_err(ConfigError::Envoy)?;
        tollgate_envoy::Config::new()
            .domains(domains.clone())
            .validate()
            .map_err(ConfigError::Envoy)?;
        let failure_mode = match &self.envoy {
            Some(e) => e.failure_mode,
            None => self.store.on_error,
        };
        self.envoy = Some(Envoy {
            config_dir: dir.to_path_buf(),
            domains,
            failure_mode,
            read_from,
        });
        self.grpc_listen.get_or_insert(DEFAULT_GRPC_LISTEN);
        self.envoy_dir = Some(dir.to_path_buf());
        Ok(self)
    }

    /// The configuration read again from where this one came from: its file, its
    /// `--envoy-config` folder, or both.
    pub fn reread(&self) -> Result<Config, ConfigError> {
        match (&self.source, &self.envoy_dir) {
            (Some(file), Some(dir)) => Config::load_with_envoy_dir(file, dir),
            (Some(file), None) => Config::load(file),
            (None, Some(dir)) => Config::envoy_only(dir),
            (None, None) => Ok(Config::builtin()),
        }
    }
}
