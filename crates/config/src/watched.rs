//! The files a configuration was read from, and what they held when it was read: what the
//! reload watch compares the files with.
//!
//! Why keep the bytes read rather than read the files again once the server runs: an edit
//! that lands between the read and the watch's first look (while the store connects and the
//! listeners start, or while a reload reads the files) would become the watch's baseline, and
//! the running configuration would never take it in. Compared with what was read, such an edit
//! is a change like any other.

use std::fmt;
use std::path::{Path, PathBuf};

use super::Config;

/// Each watched file with its bytes (`None`: unreadable), in a fixed order: the configuration
/// file, then the Envoy folder's files.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WatchedFiles(Vec<(PathBuf, Option<Vec<u8>>)>);

impl WatchedFiles {
    /// The file at `path`, holding `bytes`.
    pub(crate) fn push(&mut self, path: &Path, bytes: Option<Vec<u8>>) {
        self.0.push((path.to_path_buf(), bytes));
    }

    /// The envoyproxy/ratelimit files of the folder at `dir`, read now: before the folder is
    /// parsed, so that an edit racing the parse shows as a change.
    pub(crate) fn envoy_folder(dir: &Path) -> WatchedFiles {
        WatchedFiles::read(tollgate_envoy::envoy_config_files(dir).unwrap_or_default())
    }

    /// Reads each of `paths` now.
    fn read(paths: Vec<PathBuf>) -> WatchedFiles {
        WatchedFiles(
            paths
                .into_iter()
                .map(|path| {
                    let bytes = std::fs::read(&path).ok();
                    (path, bytes)
                })
                .collect(),
        )
    }
}

impl fmt::Debug for WatchedFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.0
                    .iter()
                    .map(|(path, bytes)| (path.display(), bytes.as_ref().map(Vec::len))),
            )
            .finish()
    }
}

impl Config {
    /// The files this configuration would be read from now: its file and the
    /// envoyproxy/ratelimit files of its Envoy folder (those present now: a file added or
    /// removed changes the list).
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.source.iter().cloned().collect();
        if let Some(envoy) = &self.envoy {
            files.extend(tollgate_envoy::envoy_config_files(&envoy.config_dir).unwrap_or_default());
        }
        files
    }

    /// Those files as they are now, to compare with [`Config::read_from`]: different when one
    /// was edited, added or removed since this configuration was read.
    pub fn files_now(&self) -> WatchedFiles {
        WatchedFiles::read(self.watched_files())
    }

    /// The files this configuration was read from, as they were then, in the order of
    /// [`Config::watched_files`]. The configuration file's bytes are the very ones parsed; the
    /// Envoy folder's are read just before it is, so an edit racing that read shows as a change
    /// (one reload too many, never one too few).
    pub fn read_from(&self) -> WatchedFiles {
        let mut files = self.read_from.clone();
        if let Some(envoy) = &self.envoy {
            files.0.extend(envoy.read_from.0.iter().cloned());
        }
        files
    }
}
