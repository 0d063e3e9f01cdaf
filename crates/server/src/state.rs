//! The memory store kept on disk (`[store] path`): counters and buckets, lockouts, overrides,
//! the lists' live entries and the memory queues' requests, written every `snapshot_every` and once more on a clean stop, and
//! read back at start.
//!
//! A snapshot goes to a temporary file beside the state file, is flushed to the disk (the file,
//! then its folder after the rename), and replaces the state file by rename: a crash at any
//! moment leaves the previous state file or the new one, never a torn one. A crash (SIGKILL,
//! power loss) loses what happened since the last snapshot, at most `snapshot_every`.
//!
//! At start, a state file that cannot be read (unreadable, damaged: every frame has a CRC-32,
//! cut short, of another format version) is moved aside to `<path>.corrupt-<unix seconds>` with
//! a warning that says so, and the server starts empty: it never refuses to start over it, and
//! never overwrites it.

mod file;

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tollgate::store::snapshot::SnapshotError;
use tollgate::{Clock, MemoryStore, SystemClock, Timestamp};

use crate::Shared;
use crate::admin::lists::registry::Record as ListRecord;
use crate::admin::overrides::registry::Record;
use crate::admin::top::unix_secs;
use crate::config::{StoreConfig, StoreKind};
use crate::queue::Kept;
use crate::store::AnyStore;
use file::{Extras, Written};

/// What a state file gave back besides the store, put in place once the server is built.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    overrides: Vec<Record>,
    lists: Vec<ListRecord>,
    queues: Vec<(String, Kept)>,
}

/// The memory store of `config`, restored from its `path` when there is one and it reads; and
/// what else the file held. `None` (build the store as usual) without a path, for Redis, when
/// the file does not exist yet, or when it could not be read (it is moved aside, with a
/// warning).
pub(crate) fn restore(config: &StoreConfig) -> (Option<MemoryStore>, Restored) {
    let (StoreKind::Memory, Some(path)) = (&config.kind, &config.path) else {
        return (None, Restored::default());
    };
    let started = Instant::now();
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(path = %path.display(), "no state file yet: starting empty");
            return (None, Restored::default());
        }
        Err(e) => {
            set_aside(path, &SnapshotError::Io(e));
            return (None, Restored::default());
        }
    };
    let mut builder = MemoryStore::builder();
    if let Some(n) = config.max_keys {
        builder = builder.max_keys(n);
    }
    let now = SystemClock::new().now();
    match file::read(&mut BufReader::with_capacity(1 << 20, file), builder, now) {
        Ok((store, counts, extras)) => {
            if let Some(secret) = &extras.secret
                && config.key_secret.is_none()
                && !tollgate_config::restore_process_secret(secret)
            {
                tracing::warn!(
                    "state file: the key secret could not be restored; keys hashed under it \
                     start afresh"
                );
            }
            // What is still live: entries that ended while the server was down are dropped
            // as they are put in place.
            let secs = unix_secs();
            let overrides = extras
                .overrides
                .iter()
                .filter(|r| r.expires.is_none_or(|end| end > secs))
                .count();
            let list_entries = extras.lists.iter().filter(|r| !r.expired(secs)).count();
            let requests: usize = extras
                .queues
                .iter()
                .map(|(_, k)| k.waiting.len() + k.dead.len())
                .sum();
            tracing::info!(
                path = %path.display(),
                keys = counts.restored,
                expired = counts.expired,
                unreadable = counts.unreadable,
                overrides,
                bans = counts.bans,
                list_entries,
                queued_requests = requests,
                millis = started.elapsed().as_millis() as u64,
                "state restored"
            );
            if counts.evicted > 0 {
                tracing::warn!(
                    keys = counts.evicted,
                    max_keys = config.max_keys,
                    "state file: more keys than [store] max_keys holds; those with the least at \
                     stake were not restored, and the next snapshot leaves them out"
                );
            }
            if counts.unreadable > 0 {
                tracing::warn!(
                    keys = counts.unreadable,
                    "state file: keys of policies whose time zone this build does not know were \
                     not restored"
                );
            }
            let restored = Restored {
                overrides: extras.overrides,
                lists: extras.lists,
                queues: extras.queues,
            };
            (Some(store), restored)
        }
        Err(e) => {
            set_aside(path, &e);
            (None, Restored::default())
        }
    }
}

/// Moves a state file that cannot be used to `<path>.corrupt-<unix seconds>`, saying so.
fn set_aside(path: &Path, why: &SnapshotError) {
    let secs = unix_secs();
    let mut aside = PathBuf::from(format!("{}.corrupt-{secs}", path.display()));
    let mut n = 1;
    while aside.exists() {
        aside = PathBuf::from(format!("{}.corrupt-{secs}-{n}", path.display()));
        n += 1;
    }
    let why = match why {
        SnapshotError::Version(v) => format!(
            "it was written in format version {v}, and this build reads version {}",
            file::FORMAT
        ),
        other => other.to_string(),
    };
    match std::fs::rename(path, &aside) {
        Ok(()) => tracing::warn!(
            path = %path.display(),
            moved_to = %aside.display(),
            "the state file could not be read ({why}); it was moved aside to {}, and Tollgate \
             starts with empty state",
            aside.display()
        ),
        Err(e) => tracing::error!(
            path = %path.display(),
            error = %e,
            "the state file could not be read ({why}) nor moved aside; Tollgate starts with \
             empty state, and its next snapshot replaces the file"
        ),
    }
}

/// Puts the restored overrides, list entries and queued requests in place (the server's queues are open).
pub(crate) fn apply(shared: &Shared, restored: Restored) {
    if !restored.overrides.is_empty() {
        shared
            .overrides
            .restore(restored.overrides, &shared.engine());
    }
    if !restored.lists.is_empty() {
        shared.lists.restore(restored.lists, &shared.engine());
    }
    for (name, kept) in restored.queues {
        let n = kept.waiting.len() + kept.dead.len();
        if !shared.queues.import_memory(&name, kept) {
            tracing::warn!(
                policy = %name,
                requests = n,
                "state file: queued requests of a policy that no longer queues were not \
                 restored; the next snapshot leaves them out"
            );
        }
    }
}

/// One snapshot at a time in this process: the periodic one and the last one at a stop would
/// race to rename (the state lock keeps other processes out).
static WRITING: Mutex<()> = Mutex::new(());

/// Writes the state to `[store] path`, if the server keeps one; what was written.
pub(crate) async fn save(shared: &Shared) -> Option<Result<Written, String>> {
    let config = shared.engine().config().store.clone();
    let path = config.path.clone()?;
    let AnyStore::Memory(store) = &shared.store else {
        return None;
    };
    let extras = Extras {
        secret: config
            .key_secret
            .is_none()
            .then(|| tollgate_config::process_secret().to_vec()),
        overrides: shared.overrides.records(unix_secs()),
        lists: shared.lists.list(unix_secs()),
        queues: shared.queues.export_memory(),
    };
    let store = store.clone();
    let now = SystemClock::new().now();
    let written =
        tokio::task::spawn_blocking(move || write_atomically(&path, now, &store, &extras))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
    Some(written)
}

/// The state, written to a temporary file, flushed, renamed over `path`, and the folder flushed.
fn write_atomically(
    path: &Path,
    now: Timestamp,
    store: &MemoryStore,
    extras: &Extras,
) -> Result<Written, String> {
    let _one = WRITING.lock().unwrap_or_else(PoisonError::into_inner);
    let (dir, tmp) = temporary(path);
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let out = create_new(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
    let written = fill(out, &tmp, now, store, extras).and_then(|written| {
        std::fs::rename(&tmp, path).map_err(|e| format!("rename to {}: {e}", path.display()))?;
        Ok(written)
    });
    if written.is_err() {
        // A partial file helps nobody, and would take the disk that made it fail.
        let _ = std::fs::remove_file(&tmp);
    }
    let written = written?;
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("flush {}: {e}", dir.display()))?;
    Ok(written)
}

/// Writes the state into `out` (the file at `tmp`) and flushes it to the disk.
fn fill(
    out: File,
    tmp: &Path,
    now: Timestamp,
    store: &MemoryStore,
    extras: &Extras,
) -> Result<Written, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{what} {}: {e}", tmp.display());
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let written = file::write(&mut out, now, store, extras).map_err(|e| fail("write", &e))?;
    out.flush().map_err(|e| fail("write", &e))?;
    let out = out.into_inner().map_err(|e| fail("write", &e.error()))?;
    out.sync_all().map_err(|e| fail("flush", &e))?;
    Ok(written)
}

/// A new file at `path`, readable by this user only. Never an existing one: a file or a
/// symbolic link planted there (by whoever can write the folder) is refused, not followed.
fn create_new(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Writes the state every `[store] snapshot_every` until `stop` turns true. The snapshot
/// metrics are exported from the call on (before the task first runs).
pub(crate) fn spawn_keeper(shared: &Arc<Shared>, stop: watch::Receiver<bool>) {
    let keeps = shared.engine().config().store.path.is_some();
    if keeps && matches!(shared.store, AnyStore::Memory(_)) {
        shared.metrics.keeps_state();
        tokio::spawn(keep(Arc::clone(shared), stop));
    }
}

async fn keep(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let config = shared.engine().config().store.clone();
    if config.path.is_none() || !matches!(shared.store, AnyStore::Memory(_)) {
        return;
    }
    let every = config.snapshot_every.max(Duration::from_secs(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        let saved = save(&shared).await;
        if let Some(result) = &saved {
            shared.metrics.snapshot(result.is_ok().then(unix_secs));
        }
        match saved {
            Some(Ok(w)) => tracing::debug!(
                keys = w.keys,
                bans = w.bans,
                overrides = w.overrides,
                list_entries = w.list_entries,
                queued_requests = w.requests,
                millis = started.elapsed().as_millis() as u64,
                "state snapshot written"
            ),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "state snapshot failed; the previous one stays")
            }
            None => return,
        }
    }
}

/// The last snapshot, at a clean stop, once every listener has drained; why it failed, if it
/// did.
pub(crate) async fn save_at_stop(shared: &Shared) -> Result<(), String> {
    let started = Instant::now();
    let saved = save(shared).await;
    if let Some(result) = &saved {
        shared.metrics.snapshot(result.is_ok().then(unix_secs));
    }
    match saved {
        Some(Ok(w)) => tracing::info!(
            keys = w.keys,
            bans = w.bans,
            overrides = w.overrides,
            list_entries = w.list_entries,
            queued_requests = w.requests,
            millis = started.elapsed().as_millis() as u64,
            "state saved"
        ),
        Some(Err(e)) => {
            tracing::error!(error = %e, "state could not be saved at stop; the last snapshot stays");
            return Err(format!("the state could not be saved at stop: {e}"));
        }
        None => {}
    }
    Ok(())
}

/// Whether the memory store's state file can be written where `[store] path` says: its folder
/// made if missing, and a file created there (the snapshots' temporary file, removed again).
/// A path nothing can be written to would otherwise lose the state at every restart, with a
/// warning in the log each `snapshot_every`.
pub(crate) fn check_writable(config: &StoreConfig) -> Result<(), String> {
    let (StoreKind::Memory, Some(path)) = (&config.kind, &config.path) else {
        return Ok(());
    };
    if path.is_dir() {
        return Err(format!(
            "{} is a folder; name the state file in it, e.g. {}",
            path.display(),
            path.join("state").display()
        ));
    }
    // A snapshot replaces the file by rename: a symbolic link would be replaced by a file (its
    // target left stale), a FIFO would hang the start, a device would be moved aside.
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && !meta.is_file()
    {
        let what = if meta.file_type().is_symlink() {
            "a symbolic link; name the file it points to"
        } else {
            "not a regular file"
        };
        return Err(format!("{} is {what}", path.display()));
    }
    let (dir, tmp) = temporary(path);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("cannot make the folder {}: {e}", dir.display()))?;
    create_new(&tmp).map_err(|e| {
        format!(
            "cannot write the state file's folder {}: {e}",
            dir.display()
        )
    })?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// How long a start waits for another process to let go of the state file: one stopping
/// (draining, then saving) as this one starts, in a rolling restart.
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The state file's lock: held by the server that reads and writes the file, from before it
/// reads it until after its last snapshot. Two processes writing one state file would
/// replace each other's snapshots, and lose counts either way.
#[derive(Debug)]
pub(crate) struct StateLock {
    _file: Option<File>,
}

/// Takes the lock of `config`'s state file (a file beside it, `.<name>.lock`), waiting up to
/// [`LOCK_WAIT`] for a process that holds it (a previous instance saving its last snapshot),
/// then removes what failed snapshots left behind. Without a state file, nothing.
pub(crate) async fn lock(config: &StoreConfig) -> Result<StateLock, String> {
    let (StoreKind::Memory, Some(path)) = (&config.kind, &config.path) else {
        return Ok(StateLock { _file: None });
    };
    let (dir, _) = temporary(path);
    let lock = dir.join(format!(".{}.lock", file_name(path)));
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options
        .open(&lock)
        .map_err(|e| format!("cannot open the state file's lock {}: {e}", lock.display()))?;
    let started = Instant::now();
    let mut warned = false;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(
                        path = %path.display(),
                        "another process holds the state file; waiting up to {}s for it to \
                         stop and save",
                        LOCK_WAIT.as_secs()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(format!(
                    "{} is in use by another process, still after {}s: two servers cannot \
                     share one state file; give each its own [store] path",
                    path.display(),
                    LOCK_WAIT.as_secs()
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!("cannot lock {}: {e}", lock.display()));
            }
        }
    }
    remove_stale_temporaries(&dir, path);
    Ok(StateLock { _file: Some(file) })
}

/// Removes the temporary files of snapshots that never finished (a crash mid-write): only the
/// lock's holder writes them, and it holds the lock now.
fn remove_stale_temporaries(dir: &Path, path: &Path) {
    let prefix = format!(".{}.tmp", file_name(path));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix)
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The folder of the state file at `path`, and a temporary file a snapshot is written to there
/// before it replaces the state file: named for this process and this snapshot, so none is
/// ever an existing file.
fn temporary(path: &Path) -> (PathBuf, PathBuf) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{n}",
        file_name(path),
        std::process::id()
    ));
    (dir, tmp)
}

/// The state file's name, for the files beside it.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned())
}
