//! SIGTERM and SIGINT as a future: what `serve` and `feed` drain on.

/// Starts listening for SIGTERM and SIGINT now — from here on neither kills the process — and returns what
/// completes on the first of them. Called before serving: a SIGTERM that arrives as soon as the ports answer
/// must drain, not kill.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind, name: &'static str| {
        let mut signal = signal(kind)
            .map_err(|error| tracing::error!(%error, "cannot listen for {name}"))
            .ok();
        async move {
            match &mut signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
            name
        }
    };
    let terminate = listen(SignalKind::terminate(), "SIGTERM");
    let interrupt = listen(SignalKind::interrupt(), "SIGINT");
    async move {
        let name = tokio::select! {
            name = terminate => name,
            name = interrupt => name,
        };
        tracing::info!("{name} received");
    }
}
