//! The commands the RESP port knows: one table that dispatch checks arity and permissions against, and that
//! `COMMAND`, `COMMAND INFO` and `COMMAND DOCS` describe (what `redis-cli` asks for its hints).

use super::reply::Replies;

/// What a command needs before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Nothing: usable before `AUTH` (as in Redis: `AUTH`, `HELLO`, `QUIT`, `RESET`).
    Nothing,
    /// An authenticated connection, when the gate has tokens.
    Connection,
    /// The `read` role on the namespace named by its first argument.
    Read,
    /// The `write` role on the namespace named by its first argument.
    Write,
}

/// A command: its name as Redis clients send it (any case), its arity (negative: at least that many
/// arguments, the name included, as Redis counts), what it needs, and its docs.
#[derive(Debug)]
pub struct Spec {
    pub name: &'static str,
    pub arity: i64,
    pub needs: Needs,
    pub flags: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
}

impl Spec {
    /// Whether `args` (the name included) fit the arity.
    pub fn fits(&self, args: usize) -> bool {
        let args = args as i64;
        if self.arity >= 0 {
            args == self.arity
        } else {
            args >= -self.arity
        }
    }

    /// Position of the first key (the namespace), 0 for none: the `COMMAND` reply's key spec.
    fn first_key(&self) -> i64 {
        i64::from(matches!(self.needs, Needs::Read | Needs::Write))
    }
}

const fn spec(
    name: &'static str,
    arity: i64,
    needs: Needs,
    flags: &'static [&'static str],
    group: &'static str,
    summary: &'static str,
) -> Spec {
    Spec {
        name,
        arity,
        needs,
        flags,
        group,
        summary,
    }
}

const READ: &[&str] = &["readonly", "fast"];
const WRITE: &[&str] = &["write", "denyoom"];
const CONNECTION: &[&str] = &["fast", "loading", "stale"];
const PUBSUB: &[&str] = &["pubsub", "loading", "stale"];

/// Every command, in the order `COMMAND` lists them.
pub static COMMANDS: &[Spec] = &[
    spec("bf.exists", 3, Needs::Read, READ, "bf", "Whether an item may exist in a namespace: 0 = definitely absent."),
    spec("bf.mexists", -3, Needs::Read, READ, "bf", "BF.EXISTS for each of several items."),
    spec("bf.add", 3, Needs::Write, WRITE, "bf", "Adds an item; acknowledged once every replica answers for it."),
    spec("bf.madd", -3, Needs::Write, WRITE, "bf", "Adds several items under one seq."),
    spec("bf.insert", -4, Needs::Write, WRITE, "bf", "BF.MADD with RedisBloom's creation options (the namespace's configuration decides them)."),
    spec("bf.reserve", -4, Needs::Write, WRITE, "bf", "Namespaces are configured, not created: answers `item exists` for a configured one."),
    spec("bf.info", -2, Needs::Read, READ, "bf", "A namespace's filter: capacity, size, windows, items."),
    spec("bf.card", 2, Needs::Read, READ, "bf", "Estimated distinct items held by a namespace's live windows."),
    spec("gate.lookup", 3, Needs::Read, READ, "gate", "An item's answer with its basis and observed_seq, as gRPC MayExist gives them."),
    spec("gate.absent", -3, Needs::Write, WRITE, "gate", "Records that the source did not find an item (RecordAbsent): [MISSING|DELETED] [SEQ observed_seq] [TTL seconds]."),
    spec("subscribe", -2, Needs::Connection, PUBSUB, "pubsub", "Invalidations of a namespace on channel invalidations:<namespace> (or invalidations:<namespace>@<seq>, resuming after seq)."),
    spec("unsubscribe", -1, Needs::Connection, PUBSUB, "pubsub", "Ends invalidation subscriptions."),
    spec("ping", -1, Needs::Connection, CONNECTION, "connection", "PONG, or the argument."),
    spec("echo", 2, Needs::Connection, CONNECTION, "connection", "The argument."),
    spec("hello", -1, Needs::Nothing, CONNECTION, "connection", "Chooses RESP2 or RESP3, optionally authenticating and naming the connection."),
    spec("auth", -2, Needs::Nothing, CONNECTION, "connection", "AUTH token, or AUTH name token: a bearer token of the gate's [[tokens]]."),
    spec("select", 2, Needs::Connection, CONNECTION, "connection", "Only database 0 exists."),
    spec("client", -2, Needs::Connection, CONNECTION, "connection", "CLIENT ID, SETNAME, GETNAME, SETINFO."),
    spec("command", -1, Needs::Connection, CONNECTION, "server", "This table: COMMAND, COMMAND COUNT, COMMAND INFO, COMMAND DOCS, COMMAND LIST."),
    spec("info", -1, Needs::Connection, CONNECTION, "server", "The server's version, the connection's protocol and the namespaces."),
    spec("quit", -1, Needs::Nothing, CONNECTION, "connection", "Closes the connection."),
    spec("reset", 1, Needs::Nothing, CONNECTION, "connection", "Back to RESP2, unauthenticated, unsubscribed, unnamed."),
];

/// The command called `name` (any case).
pub fn find(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// `COMMAND`'s entry for `spec`: name, arity, flags, first key, last key, key step, ACL categories, tips,
/// key specs, subcommands (Redis 7's ten fields).
pub fn write_info(replies: &mut Replies<'_>, spec: &Spec) {
    replies.array(10);
    replies.bulk(spec.name.as_bytes());
    replies.integer(spec.arity);
    replies.set(spec.flags.len());
    for flag in spec.flags {
        replies.simple(flag);
    }
    let key = spec.first_key();
    replies.integer(key);
    replies.integer(key);
    replies.integer(key);
    replies.set(1);
    replies.simple(&format!("@{}", spec.group));
    replies.array(0);
    replies.array(0);
    replies.array(0);
}

/// `COMMAND DOCS`'s entry for `spec`: a map of summary, since and group.
pub fn write_docs(replies: &mut Replies<'_>, spec: &Spec) {
    replies.bulk(spec.name.as_bytes());
    replies.map(3);
    replies.bulk(b"summary");
    replies.bulk(spec.summary.as_bytes());
    replies.bulk(b"since");
    replies.bulk(b"1.0.0");
    replies.bulk(b"group");
    replies.bulk(spec.group.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_found_in_any_case_and_arity_counts_the_name() {
        let exists = find(b"Bf.ExIsTs").unwrap();
        assert!(exists.fits(3) && !exists.fits(2) && !exists.fits(4));
        let madd = find(b"BF.MADD").unwrap();
        assert!(madd.fits(3) && madd.fits(100) && !madd.fits(2));
        assert!(find(b"GET").is_none());
    }

    #[test]
    fn every_namespaced_command_takes_the_namespace_first() {
        for spec in COMMANDS {
            if matches!(spec.needs, Needs::Read | Needs::Write) {
                assert!(spec.arity.abs() >= 2, "{} takes a namespace", spec.name);
            }
        }
    }
}
