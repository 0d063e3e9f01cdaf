//! Telling systemd where the service is (`Type=notify` in the packaged unit): ready once the
//! listeners are bound, stopping once a shutdown signal arrived. Without `NOTIFY_SOCKET` (not
//! started by systemd) and off Unix, each call does nothing.

/// The server answers: its listeners serve, its store and state are ready.
pub(crate) fn ready() {
    #[cfg(unix)]
    notify(sd_notify::NotifyState::Ready);
}

/// Shutting down: in-flight requests are being drained.
pub(crate) fn stopping() {
    #[cfg(unix)]
    notify(sd_notify::NotifyState::Stopping);
}

#[cfg(unix)]
fn notify(state: sd_notify::NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(&[state]) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}
