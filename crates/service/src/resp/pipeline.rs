//! A pipeline's runs of commands of one namespace (what a pipelining client sends), each run as one call
//! with every reply exactly as the commands run alone would have given: `BF.EXISTS`s answered in one pass
//! over the filter, the batch path that prefetches; `BF.ADD`s and `BF.MADD`s as one `Add`, one seq, one
//! log record and one writer lock for the run instead of one each.

use bytes::{Bytes, BytesMut};

use super::bloom::{self, AddRun};
use super::commands;
use super::session::Session;

/// Whether `args` is a `BF.ADD` or `BF.MADD` whose arity is right (one that is not runs alone, for its
/// own error).
fn is_add(args: &[Bytes]) -> bool {
    match args {
        [name, _, _] if name.eq_ignore_ascii_case(b"bf.add") => true,
        [name, _, _, ..] => name.eq_ignore_ascii_case(b"bf.madd"),
        _ => false, // an empty request (`*0`, a blank line) among them too
    }
}

impl Session {
    /// How many commands from the front of `commands` are `BF.EXISTS` of the same namespace (0 or 1 when
    /// batching does not apply).
    pub(super) fn exists_run(&self, commands: &[Vec<Bytes>]) -> usize {
        let is_exists =
            |args: &Vec<Bytes>| args.len() == 3 && args[0].eq_ignore_ascii_case(b"bf.exists");
        if !self.subscriptions.is_empty() || !commands.first().is_some_and(is_exists) {
            return 0;
        }
        let namespace = &commands[0][1];
        commands
            .iter()
            .take_while(|args| is_exists(args) && args[1] == *namespace)
            .count()
    }

    /// Answers a run of `BF.EXISTS` of one namespace with one batch lookup; `false` (nothing written) if an
    /// item is invalid, for the caller to run each command alone. Batching must change no reply: the
    /// gate refuses a batch with one empty or over-long key whole (naming `keys[i]`), and the commands
    /// beside it, which a client sent on their own, would have failed with it — a different outcome
    /// depending on how TCP split the pipeline.
    pub(super) fn exists_batch(&mut self, run: &[Vec<Bytes>], out: &mut BytesMut) -> bool {
        let spec = commands::find(b"bf.exists").expect("in the table");
        let keys: Vec<&[u8]> = run.iter().map(|args| &args[2][..]).collect();
        let answers = match self.admit(spec, &run[0]) {
            // The connection's token and the namespace: the same refusal for every command of the run.
            Err(refusal) => {
                self.port.metrics.record(spec, run.len() as u64, false);
                let mut replies = self.replies(out);
                for _ in run {
                    replies.error(refusal.kind, &refusal.message);
                }
                return true;
            }
            Ok(namespace) => match bloom::exists_many(&self.port, &namespace, &keys) {
                Ok(answers) => answers,
                Err(_) => return false,
            },
        };
        self.port.metrics.record(spec, run.len() as u64, true);
        let mut replies = self.replies(out);
        for may_exist in answers {
            replies.boolean(may_exist);
        }
        true
    }

    /// How many commands from the front of `commands` are `BF.ADD`s and `BF.MADD`s of the same namespace
    /// with at most `max_batch_keys` items between them (0 or 1 when batching does not apply).
    pub(super) fn adds_run(&self, commands: &[Vec<Bytes>]) -> usize {
        if !self.subscriptions.is_empty() || !commands.first().is_some_and(|args| is_add(args)) {
            return 0;
        }
        let namespace = &commands[0][1];
        let mut items = 0;
        commands
            .iter()
            .take_while(|args| {
                items += args.len().saturating_sub(2);
                is_add(args) && args[1] == *namespace && items <= self.port.max_batch_keys()
            })
            .count()
    }

    /// Runs a run of `BF.ADD`s and `BF.MADD`s of one namespace as one `Add`; `false` (nothing written, nothing
    /// added) if the gate refused it as invalid (an empty or over-long item), for the caller to run each
    /// command alone: the commands beside that item, sent on their own, would have succeeded. Any other
    /// refusal (the namespace, the token, unavailable) is every command's, as each alone would have met it.
    /// An item in several commands is new (1) in the first only, as when they run one after another.
    pub(super) async fn adds_batch(&mut self, run: &[Vec<Bytes>], out: &mut BytesMut) -> bool {
        let (add, madd) = (
            commands::find(b"bf.add").expect("in the table"),
            commands::find(b"bf.madd").expect("in the table"),
        );
        let single = |args: &Vec<Bytes>| args[0].eq_ignore_ascii_case(b"bf.add");
        let spec = |args: &Vec<Bytes>| if single(args) { add } else { madd };
        let outcome = match self.admit(spec(&run[0]), &run[0]) {
            Err(refusal) => Err(refusal),
            Ok(namespace) => {
                let items: Vec<&[Bytes]> = run.iter().map(|args| &args[2..]).collect();
                match bloom::add_run(&self.port, &namespace, &items).await {
                    AddRun::Invalid => return false,
                    AddRun::Refused(refusal) => Err(refusal),
                    AddRun::Added(new) => Ok(new),
                }
            }
        };
        for args in run {
            self.port.metrics.record(spec(args), 1, outcome.is_ok());
        }
        let mut replies = self.replies(out);
        match outcome {
            Err(refusal) => run
                .iter()
                .for_each(|_| replies.error(refusal.kind, &refusal.message)),
            Ok(new) => {
                let mut new = new.into_iter();
                for args in run {
                    if single(args) {
                        replies.boolean(new.next().expect("an answer per item"));
                    } else {
                        replies.array(args.len() - 2);
                        new.by_ref()
                            .take(args.len() - 2)
                            .for_each(|new| replies.boolean(new));
                    }
                }
            }
        }
        true
    }
}
