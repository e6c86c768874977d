//! A pipeline's runs of `BF.EXISTS` of one namespace (what a pipelining client sends) answered in one pass
//! over the filter, the batch path that prefetches — with every reply exactly as the commands run alone
//! would have given.

use bytes::{Bytes, BytesMut};

use super::bloom;
use super::commands;
use super::session::Session;

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
}
