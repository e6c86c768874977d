//! A single server's wall clock stepped while it runs (libfaketime, the monotonic clock untouched): nothing
//! expires because of it, the step is counted, and nothing the log recorded during it shortens a key's life
//! after a restart on the right clock. (Read straight from the wall clock, a step of two hours expired
//! every key of a one-hour namespace on the next maintenance tick, and an `Add` during it was logged two
//! hours ahead.)

use crate::common;

use common::binary::{serve, start, Served};
use common::faketime::SteppedClock;
use common::{try_http_get, wait_until, PATIENCE};
use existence_gate::proto::existence_gate_client::ExistenceGateClient;
use existence_gate::proto::{AddRequest, Answer, BatchMayExistRequest};

const CONFIG: &str =
    "[namespaces.users]\nexpected_keys = 100000\nretention = \"1h\"\nwindows = 4\n";

async fn started(dir: &std::path::Path, clock: &SteppedClock) -> Served {
    let mut command = serve();
    command
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("--data-dir")
        .arg(dir.join("data"));
    clock.apply(&mut command);
    start(command).await
}

async fn client(served: &Served) -> ExistenceGateClient<tonic::transport::Channel> {
    ExistenceGateClient::connect(format!("http://{}", served.grpc_addr))
        .await
        .unwrap()
}

async fn add(served: &Served, keys: &[String]) {
    client(served)
        .await
        .add(AddRequest {
            namespace: "users".to_string(),
            keys: keys.iter().map(|k| k.as_bytes().to_vec().into()).collect(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// How many of `keys` answer ABSENT.
async fn absent(served: &Served, keys: &[String]) -> usize {
    let reply = client(served)
        .await
        .batch_may_exist(BatchMayExistRequest {
            namespace: "users".to_string(),
            keys: keys.iter().map(|k| k.as_bytes().to_vec().into()).collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    reply.answers().filter(|a| *a == Answer::Absent).count()
}

/// Waits until the server has counted `steps` wall-clock steps: each is seen on a maintenance tick, the same
/// tick that then expires windows, so once the next step is counted the tick after the previous one ran.
async fn counted_steps(served: &Served, steps: u32) {
    let addr = served.http_addr.parse().unwrap();
    wait_until(
        PATIENCE,
        &format!("{steps} clock steps counted"),
        async || {
            let (_, metrics) = try_http_get(addr, "/metrics").await.ok()?;
            let counted = metrics
                .lines()
                .find(|line| line.starts_with("existence_clock_steps_total"))
                .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())?;
            (counted >= f64::from(steps)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_live_step_of_the_wall_clock_expires_nothing_now_or_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let Some(clock) = SteppedClock::new(dir.path()) else {
        return;
    };
    std::fs::write(dir.path().join("config.toml"), CONFIG).unwrap();
    let mut served = started(dir.path(), &clock).await;
    let mut keys: Vec<String> = (0..200).map(|i| format!("before-{i}")).collect();
    add(&served, &keys).await;
    clock.set("+2h");
    counted_steps(&served, 1).await;
    let during = vec!["during".to_string()];
    add(&served, &during).await;
    keys.extend(during);
    // A second step proves the tick that saw the first (and expired windows after it) has run.
    clock.set("+3h");
    counted_steps(&served, 2).await;
    assert_eq!(absent(&served, &keys).await, 0, "keys expired by a step");
    clock.set("+0");
    counted_steps(&served, 3).await;
    assert_eq!(
        absent(&served, &keys).await,
        0,
        "keys expired by a step back"
    );
    served.child.kill().await.unwrap();
    let restarted = started(dir.path(), &clock).await;
    assert_eq!(
        absent(&restarted, &keys).await,
        0,
        "keys lost across a restart on the right clock"
    );
}
