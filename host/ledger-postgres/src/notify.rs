//! Wake-ups without polling: a connection that LISTENs on `stephost_due`,
//! which the `runs` table's trigger notifies when a run that nobody holds
//! becomes due (migrations/0001_ledger.sql). A lost connection is opened
//! again, and the waiting worker woken, since a notification may have been
//! missed meanwhile.

use std::time::Duration;

use futures_util::future::poll_fn;
use stephost_core::store::WakeUp;
use tokio_postgres::AsyncMessage;

use crate::conns::Server;

/// How long a lost listening connection waits before it is opened again,
/// in milliseconds.
pub const RECONNECT_DELAY_MS: u64 = 1_000;

/// Listens until the pool's runtime stops, connected as the pool's other
/// connections are (its TLS too).
pub async fn listen(server: Server, wake: WakeUp) {
    loop {
        if let Ok((client, mut connection)) = server.connect().await {
            let woken = wake.clone();
            let driven = tokio::spawn(async move {
                while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
                    match message {
                        Ok(AsyncMessage::Notification(_)) => woken(),
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            });
            if client.batch_execute("LISTEN stephost_due").await.is_ok() {
                wake();
                let _ = driven.await;
            }
        }
        // Whatever happened meanwhile is looked at again.
        wake();
        tokio::time::sleep(Duration::from_millis(RECONNECT_DELAY_MS)).await;
    }
}
