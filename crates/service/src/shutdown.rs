//! The shutdown signal shared by every part of the server.
//!
//! Triggered once (SIGTERM, SIGINT, or a test); every holder can check it without waiting — handlers refuse
//! new calls, health turns `NOT_SERVING` — or wait for it — subscription streams end with `UNAVAILABLE`, the
//! listeners stop accepting.

use tokio::sync::watch;

/// A cloneable, trigger-once shutdown flag.
#[derive(Debug, Clone)]
pub struct Shutdown {
    sender: std::sync::Arc<watch::Sender<bool>>,
    receiver: watch::Receiver<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        let (sender, receiver) = watch::channel(false);
        Self {
            sender: std::sync::Arc::new(sender),
            receiver,
        }
    }
}

impl Shutdown {
    /// Starts the shutdown (idempotent).
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// Whether shutdown has started.
    pub fn is_triggered(&self) -> bool {
        *self.receiver.borrow()
    }

    /// Completes once shutdown has started.
    pub async fn wait(&self) {
        let mut receiver = self.receiver.clone();
        // The sender lives as long as any `Shutdown` clone, including `self`, so this cannot fail.
        let _ = receiver.wait_for(|triggered| *triggered).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_on_trigger() {
        let shutdown = Shutdown::default();
        let waiter = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { shutdown.wait().await })
        };
        assert!(!shutdown.is_triggered());
        shutdown.trigger();
        waiter.await.unwrap();
        assert!(shutdown.is_triggered());
        shutdown.wait().await;
    }
}
