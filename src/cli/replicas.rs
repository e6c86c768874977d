//! `replicas list` and `replicas remove ID`: the replicated mode's membership (`Admin.ListReplicas`,
//! `Admin.RemoveReplica`), through any replica.

use clap::{Args, Subcommand};
use serde_json::json;

use crate::cli::admin::table;
use crate::cli::output;
use crate::client::connection::{ConnectArgs, Gate};
use crate::client::failure;
use crate::proto::{ListReplicasRequest, RemoveReplicaRequest};

/// `replicas`.
#[derive(Debug, Args)]
pub struct ReplicasArgs {
    #[command(subcommand)]
    pub command: ReplicasCommand,
}

/// What to do with the membership.
#[derive(Debug, Subcommand)]
pub enum ReplicasCommand {
    /// List the members as the replica asked has applied them: id, where it runs, the seq of its join and
    /// the applied seq it last reported.
    List {
        #[command(flatten)]
        connect: ConnectArgs,
        /// Print the members as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a replica that is gone for good, so writers stop waiting the fallback for its reports. A
    /// removed replica that still runs answers no ABSENT until it is restarted.
    Remove {
        #[command(flatten)]
        connect: ConnectArgs,
        /// The replica's --replica-id, as `replicas list` shows it.
        id: String,
    },
}

/// Runs a `replicas` subcommand.
pub async fn replicas(args: ReplicasArgs) -> Result<(), String> {
    match args.command {
        ReplicasCommand::List { connect, json } => list(&connect, json).await,
        ReplicasCommand::Remove { connect, id } => remove(&connect, id).await,
    }
}

async fn list(connect: &ConnectArgs, as_json: bool) -> Result<(), String> {
    let gate = Gate::connect(connect).await?;
    let reply = gate
        .admin()
        .list_replicas(ListReplicasRequest {})
        .await
        .map_err(|status| failure::refused("ListReplicas", &status))?
        .into_inner();
    if as_json {
        let members: Vec<_> = reply
            .replicas
            .iter()
            .map(|m| {
                json!({
                    "id": m.id,
                    "nonce": format!("{:016x}", m.nonce),
                    "joined_seq": m.joined_seq,
                    "origin": m.origin,
                    "reported_seq": m.reported_seq,
                    "this_replica": m.this_replica,
                })
            })
            .collect();
        return output::line(
            &json!({ "replicas": members, "applied_seq": reply.applied_seq }).to_string(),
        );
    }
    let rows: Vec<Vec<String>> = reply
        .replicas
        .iter()
        .map(|m| {
            vec![
                format!("{}{}", m.id, if m.this_replica { " *" } else { "" }),
                m.origin.clone(),
                m.joined_seq.to_string(),
                m.reported_seq.to_string(),
            ]
        })
        .collect();
    let text = table(&["REPLICA", "ORIGIN", "JOINED AT", "REPORTED"], &rows);
    output::line(&format!(
        "{}{} members as of seq {} (* = the replica answering)",
        text,
        reply.replicas.len(),
        reply.applied_seq
    ))
}

async fn remove(connect: &ConnectArgs, id: String) -> Result<(), String> {
    let gate = Gate::connect(connect).await?;
    let reply = gate
        .admin()
        .remove_replica(RemoveReplicaRequest { id: id.clone() })
        .await
        .map_err(|status| failure::refused("RemoveReplica", &status))?
        .into_inner();
    output::line(&format!(
        "removed replica {id:?} at seq {}: writers stop waiting for it once every replica has applied it",
        reply.seq
    ))
}
