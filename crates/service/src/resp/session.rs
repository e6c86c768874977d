//! One connection's state and its commands: the protocol it chose, who it authenticated as, its name, its
//! subscriptions ([`pubsub`](super::pubsub)). Commands of one read are run in order and their replies
//! written in order into one buffer; consecutive `BF.EXISTS` of one namespace are answered as one batch
//! ([`pipeline`](super::pipeline)).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

use super::bloom;
use super::commands::{self, Needs, Spec, COMMANDS};
use super::pubsub::{Push, Subscribed};
use super::reply::{Outcome, Protocol, Refusal, Replies};
use super::Port;
use crate::access::{Refused, SHUTTING_DOWN};
use crate::auth::{Denied, Role, Scope};

/// A connection's state.
#[derive(Debug)]
pub struct Session {
    pub(super) port: Arc<Port>,
    pub(super) id: u64,
    pub(super) protocol: Protocol,
    /// `Bearer <token>` once `AUTH` or `HELLO ... AUTH` accepted it.
    pub(super) authorization: Option<String>,
    name: Option<Bytes>,
    /// The channels subscribed to, each with its forwarder ([`pubsub`](super::pubsub)).
    pub(super) subscriptions: HashMap<Arc<str>, Subscribed>,
    pub(super) pushes: mpsc::Sender<Push>,
    /// Set by `QUIT`: the replies written so far are sent, then the connection closed.
    pub closing: bool,
}

impl Session {
    pub fn new(port: Arc<Port>, pushes: mpsc::Sender<Push>) -> Self {
        let id = port.next_id.fetch_add(1, Ordering::Relaxed);
        Self {
            port,
            id,
            protocol: Protocol::Resp2,
            authorization: None,
            name: None,
            subscriptions: HashMap::new(),
            pushes,
            closing: false,
        }
    }

    /// Runs `commands` in order, writing their replies into `out`.
    pub async fn run(&mut self, commands: &[Vec<Bytes>], out: &mut BytesMut) {
        let mut at = 0;
        while at < commands.len() && !self.closing {
            let exists = self.exists_run(&commands[at..]);
            let adds = if exists > 1 {
                0
            } else {
                self.adds_run(&commands[at..])
            };
            let run = exists.max(adds);
            if run > 1 {
                let batched = &commands[at..at + run];
                let answered = if exists > 1 {
                    self.exists_batch(batched, out)
                } else {
                    self.adds_batch(batched, out).await
                };
                if !answered {
                    // An item of the run is invalid: each command answers for itself, as unbatched.
                    for args in batched {
                        self.execute(args, out).await;
                    }
                }
                at += run;
            } else {
                self.execute(&commands[at], out).await;
                at += 1;
            }
        }
    }

    pub(super) fn replies<'a>(&self, out: &'a mut BytesMut) -> Replies<'a> {
        Replies {
            out,
            protocol: self.protocol,
        }
    }

    /// Runs one command.
    pub(super) async fn execute(&mut self, args: &[Bytes], out: &mut BytesMut) {
        let Some(name) = args.first() else {
            return; // An empty request (`*0`, a blank line) is nothing, as in Redis.
        };
        let Some(spec) = commands::find(name) else {
            let mut error = format!(
                "unknown command '{}', with args beginning with: ",
                String::from_utf8_lossy(&name[..name.len().min(128)])
            );
            for arg in args.iter().skip(1).take(8) {
                error.push_str(&format!(
                    "'{}' ",
                    String::from_utf8_lossy(&arg[..arg.len().min(64)])
                ));
            }
            self.replies(out).error("ERR", &error);
            return;
        };
        let outcome = match self.admit(spec, args) {
            Ok(namespace) => self.dispatch(spec, namespace, args, out).await,
            Err(refusal) => Err(refusal),
        };
        self.port.metrics.record(spec, 1, outcome.is_ok());
        if let Err(refusal) = outcome {
            self.replies(out).error(refusal.kind, &refusal.message);
        }
    }

    /// Checks arity, the subscribed context and permissions; returns the namespace a namespaced command
    /// names (resolved: `""` is `default`).
    pub(super) fn admit(&self, spec: &Spec, args: &[Bytes]) -> Result<String, Refusal> {
        if !spec.fits(args.len()) {
            return Err(Refusal::err(format!(
                "wrong number of arguments for '{}' command",
                spec.name
            )));
        }
        if !self.subscriptions.is_empty()
            && self.protocol == Protocol::Resp2
            && !matches!(
                spec.name,
                "subscribe" | "unsubscribe" | "ping" | "quit" | "reset"
            )
        {
            return Err(Refusal::err(format!(
                "Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are \
                 allowed in this context",
                spec.name
            )));
        }
        let role = match spec.needs {
            Needs::Nothing => return Ok(String::new()),
            Needs::Connection => return self.authenticated().map(|()| String::new()),
            Needs::Read => Role::Read,
            Needs::Write => Role::Write,
        };
        let namespace = bloom::namespace(&args[1])?;
        self.check(role, &namespace)?;
        Ok(namespace)
    }

    /// Whether the connection must still authenticate: the gate has tokens, and `AUTH` accepted none yet.
    pub fn awaiting_auth(&self) -> bool {
        self.port.access.authorizer().is_enabled() && self.authorization.is_none()
    }

    /// Whether the connection may run commands: the gate has no tokens, or `AUTH` accepted one.
    fn authenticated(&self) -> Outcome {
        if self.awaiting_auth() {
            return Err(Refusal {
                kind: "NOAUTH",
                message: "Authentication required.".to_string(),
            });
        }
        Ok(())
    }

    /// Whether the connection's token grants `role` on `namespace`, and the server is not shutting down
    /// (the admission rules of the gRPC port, [`Access::check`](crate::access::Access::check)).
    pub(super) fn check(&self, role: Role, namespace: &str) -> Outcome {
        self.authenticated()?;
        let scope = Scope::Namespace(namespace);
        self.port
            .access
            .check(self.authorization.as_deref(), role, scope)
            .map_err(|refused| match refused {
                Refused::ShuttingDown => Refusal {
                    kind: "TRYAGAIN",
                    message: SHUTTING_DOWN.to_string(),
                },
                Refused::Denied(Denied::Unauthenticated(reason)) => Refusal {
                    kind: "NOAUTH",
                    message: reason.to_string(),
                },
                Refused::Denied(Denied::PermissionDenied(reason)) => Refusal {
                    kind: "NOPERM",
                    message: reason,
                },
            })
    }

    async fn dispatch(
        &mut self,
        spec: &Spec,
        namespace: String,
        args: &[Bytes],
        out: &mut BytesMut,
    ) -> Outcome {
        let port = Arc::clone(&self.port);
        let mut replies = self.replies(out);
        match spec.name {
            "bf.exists" => bloom::exists(&port, &namespace, &args[2], &mut replies),
            "bf.mexists" => bloom::mexists(&port, &namespace, &args[2..], &mut replies),
            "bf.add" => bloom::add(&port, &namespace, &args[2..], false, &mut replies).await,
            "bf.madd" => bloom::add(&port, &namespace, &args[2..], true, &mut replies).await,
            "bf.insert" => bloom::insert(&port, &namespace, &args[2..], &mut replies).await,
            "bf.reserve" => bloom::reserve(&port, &namespace, &args[2..]),
            "bf.info" => bloom::info(&port, &namespace, &args[2..], &mut replies),
            "bf.card" => bloom::card(&port, &namespace, &mut replies),
            "gate.lookup" => bloom::lookup(&port, &namespace, &args[2], &mut replies),
            "gate.absent" => bloom::absent(&port, &namespace, &args[2..], &mut replies).await,
            "subscribe" => self.subscribe(&args[1..], out).await,
            "unsubscribe" => {
                self.unsubscribe(&args[1..], out);
                Ok(())
            }
            "ping" if args.len() > 2 => {
                Err(Refusal::err("wrong number of arguments for 'ping' command"))
            }
            "ping" => {
                self.ping(args.get(1), out);
                Ok(())
            }
            "echo" => {
                replies.bulk(&args[1]);
                Ok(())
            }
            "hello" => self.hello(&args[1..], out),
            "auth" => {
                self.auth(&args[1..])?;
                self.replies(out).simple("OK");
                Ok(())
            }
            "select" if &args[1][..] == b"0" => {
                replies.simple("OK");
                Ok(())
            }
            "select" => Err(Refusal::err("DB index is out of range")),
            "client" => self.client(&args[1..], out),
            "command" => command(&args[1..], &mut replies),
            "info" => {
                replies.bulk(self.info().as_bytes());
                Ok(())
            }
            "quit" => {
                self.closing = true;
                replies.simple("OK");
                Ok(())
            }
            "reset" => {
                self.reset();
                self.replies(out).simple("RESET");
                Ok(())
            }
            other => unreachable!("{other} is in the command table but not dispatched"),
        }
    }

    fn ping(&self, message: Option<&Bytes>, out: &mut BytesMut) {
        let mut replies = self.replies(out);
        if !self.subscriptions.is_empty() && self.protocol == Protocol::Resp2 {
            // Redis's form for a subscribed RESP2 connection.
            replies.array(2);
            replies.bulk(b"pong");
            replies.bulk(message.map_or(&b""[..], |m| &m[..]));
            return;
        }
        match message {
            Some(message) => replies.bulk(message),
            None => replies.simple("PONG"),
        }
    }

    /// `HELLO [protover [AUTH name token] [SETNAME name]]`.
    fn hello(&mut self, args: &[Bytes], out: &mut BytesMut) -> Outcome {
        let protocol = match args.first().map(|v| &v[..]) {
            None => self.protocol,
            Some(b"2") => Protocol::Resp2,
            Some(b"3") => Protocol::Resp3,
            Some(_) => {
                return Err(Refusal {
                    kind: "NOPROTO",
                    message: "unsupported protocol version".to_string(),
                })
            }
        };
        let mut name = None;
        let mut rest = args.iter().skip(1);
        while let Some(option) = rest.next() {
            if option.eq_ignore_ascii_case(b"auth") {
                let (Some(user), Some(token)) = (rest.next(), rest.next()) else {
                    return Err(Refusal::err("Syntax error in HELLO option 'auth'"));
                };
                self.auth(&[user.clone(), token.clone()])?;
            } else if option.eq_ignore_ascii_case(b"setname") {
                let Some(value) = rest.next() else {
                    return Err(Refusal::err("Syntax error in HELLO option 'setname'"));
                };
                name = Some(client_name(value)?);
            } else {
                return Err(Refusal::err(format!(
                    "Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        if self.authenticated().is_err() {
            return Err(Refusal {
                kind: "NOAUTH",
                message: "HELLO must be called with the client already authenticated, otherwise the HELLO \
                          <proto> AUTH <user> <pass> option can be used to authenticate the client and select \
                          the RESP protocol version at the same time"
                    .to_string(),
            });
        }
        if name.is_some() {
            self.name = name;
        }
        self.protocol = protocol;
        let mut replies = self.replies(out);
        replies.map(7);
        replies.bulk(b"server");
        replies.bulk(b"existence-gate");
        replies.bulk(b"version");
        replies.bulk(env!("CARGO_PKG_VERSION").as_bytes());
        replies.bulk(b"proto");
        replies.integer(if protocol == Protocol::Resp3 { 3 } else { 2 });
        replies.bulk(b"id");
        replies.integer(self.id as i64);
        replies.bulk(b"mode");
        replies.bulk(b"standalone");
        replies.bulk(b"role");
        replies.bulk(b"master");
        replies.bulk(b"modules");
        replies.array(0);
        Ok(())
    }

    /// `AUTH token` or `AUTH name token`: the token must be one of the gate's `[[tokens]]`; a name, when
    /// given, must be that token's `name` (or `default`, what clients send for a password alone). Without
    /// tokens, as Redis without passwords: `AUTH token` is refused, `AUTH default anything` accepted.
    fn auth(&mut self, args: &[Bytes]) -> Outcome {
        let (user, token) = match args {
            [token] => (None, token),
            [user, token] => (Some(user), token),
            _ => return Err(Refusal::err("syntax error")),
        };
        let wrong = || Refusal {
            kind: "WRONGPASS",
            message: "invalid username-password pair or user is disabled.".to_string(),
        };
        let authorizer = self.port.access.authorizer();
        if !authorizer.is_enabled() {
            // As Redis without passwords: its `default` user takes any password, and no other user exists.
            return match user {
                None => Err(Refusal::err(
                    "AUTH <password> called without any password configured for the default user. Are you \
                     sure your configuration is correct?",
                )),
                Some(user) if &user[..] == b"default" => Ok(()),
                Some(_) => Err(wrong()),
            };
        }
        let token = std::str::from_utf8(token).map_err(|_| wrong())?;
        let authorization = format!("Bearer {token}");
        let name = authorizer
            .token_name(Some(&authorization))
            .map_err(|_| wrong())?;
        if let Some(user) = user {
            if &user[..] != b"default" && user[..] != *name.as_bytes() {
                return Err(wrong());
            }
        }
        self.authorization = Some(authorization);
        Ok(())
    }

    /// `CLIENT ID | SETNAME name | GETNAME | SETINFO LIB-NAME|LIB-VER value`.
    fn client(&mut self, args: &[Bytes], out: &mut BytesMut) -> Outcome {
        let subcommand = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        let mut replies = Replies {
            out,
            protocol: self.protocol,
        };
        match (subcommand.as_str(), &args[1..]) {
            ("id", []) => replies.integer(self.id as i64),
            ("setname", [name]) => {
                self.name = Some(client_name(name)?).filter(|n| !n.is_empty());
                replies.simple("OK");
            }
            ("getname", []) => match &self.name {
                Some(name) => replies.bulk(name),
                None => replies.null(),
            },
            ("setinfo", [attribute, _value])
                if attribute.eq_ignore_ascii_case(b"lib-name")
                    || attribute.eq_ignore_ascii_case(b"lib-ver") =>
            {
                replies.simple("OK")
            }
            ("id" | "setname" | "getname" | "setinfo", _) => {
                return Err(Refusal::err(format!(
                    "wrong number of arguments for 'client|{subcommand}' command"
                )))
            }
            _ => {
                return Err(Refusal::err(format!(
                    "unknown subcommand '{subcommand}'. Try CLIENT HELP."
                )))
            }
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.subscriptions.clear();
        self.protocol = Protocol::Resp2;
        self.authorization = None;
        self.name = None;
    }

    /// `INFO`. The namespaces are those the connection's token may use at all: refusals never reveal which
    /// namespaces exist to a token scoped to others (docs/security.md), and neither does `INFO`.
    fn info(&self) -> String {
        let authorizer = self.port.access.authorizer();
        let visible = |name: &str| {
            !authorizer.is_enabled()
                || [Role::Read, Role::Write, Role::Admin, Role::Mirror]
                    .into_iter()
                    .any(|role| authorizer.allows(self.authorization.as_deref(), role, name))
        };
        let namespaces: Vec<String> = self
            .port
            .gate
            .namespaces()
            .iter()
            .map(|n| n.name().to_string())
            .filter(|name| visible(name))
            .collect();
        format!(
            "# Server\r\n\
             existence_gate_version:{}\r\n\
             redis_version:7.2.0\r\n\
             redis_mode:standalone\r\n\
             # Clients\r\n\
             connected_clients:{}\r\n\
             # Connection\r\n\
             client_id:{}\r\n\
             protocol:{}\r\n\
             # Namespaces\r\n\
             namespaces:{}\r\n",
            env!("CARGO_PKG_VERSION"),
            self.port.connections(),
            self.id,
            if self.protocol == Protocol::Resp3 {
                3
            } else {
                2
            },
            namespaces.join(",")
        )
    }
}

/// A connection name as Redis allows it: no spaces, newlines or other special characters.
fn client_name(name: &Bytes) -> Result<Bytes, Refusal> {
    if name.iter().any(|&b| b <= b' ' || b > b'~') {
        return Err(Refusal::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(name.clone())
}

/// `COMMAND [COUNT | LIST | INFO name ... | DOCS [name ...]]`.
fn command(args: &[Bytes], replies: &mut Replies<'_>) -> Outcome {
    let Some(subcommand) = args.first() else {
        replies.array(COMMANDS.len());
        for spec in COMMANDS {
            commands::write_info(replies, spec);
        }
        return Ok(());
    };
    let named = |names: &[Bytes]| -> Vec<Option<&'static Spec>> {
        if names.is_empty() {
            COMMANDS.iter().map(Some).collect()
        } else {
            names.iter().map(|n| commands::find(n)).collect()
        }
    };
    match String::from_utf8_lossy(subcommand)
        .to_ascii_lowercase()
        .as_str()
    {
        "count" => replies.integer(COMMANDS.len() as i64),
        "list" => {
            replies.array(COMMANDS.len());
            for spec in COMMANDS {
                replies.bulk(spec.name.as_bytes());
            }
        }
        "info" => {
            let specs = named(&args[1..]);
            replies.array(specs.len());
            for spec in specs {
                match spec {
                    Some(spec) => commands::write_info(replies, spec),
                    None => replies.null(),
                }
            }
        }
        "docs" => {
            let specs: Vec<&Spec> = named(&args[1..]).into_iter().flatten().collect();
            replies.map(specs.len());
            for spec in specs {
                commands::write_docs(replies, spec);
            }
        }
        other => {
            return Err(Refusal::err(format!(
                "unknown subcommand '{other}'. Try COMMAND HELP."
            )))
        }
    }
    Ok(())
}
