//! Opening what a replica started at the same moment may be creating: the stream, the snapshot bucket.
//!
//! Replicas started together on a fresh server each find nothing and create it; the server may refuse all
//! but one of those creations (a replica of three once exited on "subjects overlap with an existing stream
//! (10065)" creating the snapshot bucket). A refused creation is followed by one more open, which finds
//! what the other replica created; only if that fails too is the creation's error the answer.

use std::future::Future;

/// `open`; if it finds nothing, `create`; if that is refused, `open` once more, else the creation's error.
pub(crate) async fn open_or_create<T, E, Open, Opened, Create, Created>(
    open: Open,
    create: Create,
) -> Result<T, E>
where
    Open: Fn() -> Opened,
    Opened: Future<Output = Option<T>>,
    Create: FnOnce() -> Created,
    Created: Future<Output = Result<T, E>>,
{
    if let Some(found) = open().await {
        return Ok(found);
    }
    match create().await {
        Ok(created) => Ok(created),
        Err(refused) => open().await.ok_or(refused),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// `open_or_create` with an `open` answering `answers` in turn (`None` once they run out) and a
    /// `create` answering `created`: its result and how often it opened.
    async fn run(
        answers: Vec<Option<u32>>,
        created: Result<u32, &'static str>,
    ) -> (Result<u32, &'static str>, usize) {
        let calls = Cell::new(0);
        let result = open_or_create(
            || {
                let n = calls.get();
                calls.set(n + 1);
                let answer = answers.get(n).copied().flatten();
                async move { answer }
            },
            || async move { created },
        )
        .await;
        (result, calls.get())
    }

    #[tokio::test]
    async fn what_exists_is_opened_and_not_created() {
        assert_eq!(
            run(vec![Some(1)], Err("must not be called")).await,
            (Ok(1), 1)
        );
    }

    #[tokio::test]
    async fn what_is_missing_is_created() {
        assert_eq!(run(vec![None], Ok(2)).await, (Ok(2), 1));
    }

    #[tokio::test]
    async fn a_creation_refused_because_another_replica_created_it_opens_theirs() {
        assert_eq!(
            run(vec![None, Some(3)], Err("subjects overlap")).await,
            (Ok(3), 2)
        );
    }

    #[tokio::test]
    async fn a_creation_refused_for_another_reason_is_the_answer() {
        assert_eq!(
            run(vec![None, None], Err("not authorised")).await,
            (Err("not authorised"), 2)
        );
    }
}
