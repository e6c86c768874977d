//! Requests whose last DATA frame ends the stream.
//!
//! tonic's request body reports its end only when polled after its one message, so hyper's HTTP/2 client
//! sent each call as three writes to the socket: HEADERS, the message's DATA frame, and an empty DATA frame
//! with END_STREAM (`strace` of 22,000 64-key `BatchMayExist` calls: 3 `writev` per call). Each write on
//! loopback is the kernel delivering a segment to the gate and waking its connection. This body looks one
//! frame ahead, so the message's DATA frame carries END_STREAM: two writes per call (HEADERS still leaves
//! alone: hyper waits for the stream's send window, which h2 grants once HEADERS is out). Measured from one
//! task with coalescing off, 64 keys a call, old and new interleaved: the gate's CPU per call 66.8-70.5 µs
//! against 70.5-80.9; the client's own within the noise (1.14-1.29 µs per key against 1.05-1.35).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::Status;

/// A channel whose requests' bodies end with their last frame.
#[derive(Debug, Clone)]
pub struct WholeRequests(pub Channel);

impl tower_service::Service<http::Request<Body>> for WholeRequests {
    type Response = <Channel as tower_service::Service<http::Request<Body>>>::Response;
    type Error = <Channel as tower_service::Service<http::Request<Body>>>::Error;
    type Future = <Channel as tower_service::Service<http::Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.0
            .call(request.map(|body| Body::new(EndsWithLastFrame::new(body))))
    }
}

/// `inner`, polled one frame ahead.
struct EndsWithLastFrame {
    inner: Body,
    ahead: Option<Result<Frame<Bytes>, Status>>,
    ended: bool,
}

impl EndsWithLastFrame {
    fn new(inner: Body) -> Self {
        Self {
            inner,
            ahead: None,
            ended: false,
        }
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }
}

impl HttpBody for EndsWithLastFrame {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let frame = match this.ahead.take() {
            Some(frame) => frame,
            None if this.ended => return Poll::Ready(None),
            None => match this.poll_inner(cx) {
                Poll::Ready(Some(frame)) => frame,
                other => return other,
            },
        };
        if frame.is_ok() && !this.ended {
            if let Poll::Ready(next) = this.poll_inner(cx) {
                this.ahead = next;
            }
        }
        Poll::Ready(Some(frame))
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ahead.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = if self.ended {
            SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        };
        if let Some(Ok(data)) = self.ahead.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            let ahead = data.map_or(0, |d| d.len() as u64);
            hint.set_lower(hint.lower() + ahead);
            if let Some(upper) = hint.upper() {
                hint.set_upper(upper + ahead);
            }
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    fn frames(chunks: &[&'static str]) -> Body {
        let chunks: Vec<Result<Frame<Bytes>, Status>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            chunks,
        )))
    }

    async fn next(body: &mut EndsWithLastFrame) -> Option<Bytes> {
        poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
            .await
            .map(|frame| frame.unwrap().into_data().unwrap())
    }

    #[tokio::test]
    async fn a_one_message_body_has_ended_when_its_frame_is_out() {
        let mut body = EndsWithLastFrame::new(frames(&["message"]));
        assert!(!body.is_end_stream());
        assert_eq!(next(&mut body).await.as_deref(), Some(&b"message"[..]));
        assert!(body.is_end_stream(), "the last frame must carry the end");
        assert_eq!(body.size_hint().exact(), Some(0));
        assert_eq!(next(&mut body).await, None);
    }

    #[tokio::test]
    async fn longer_bodies_pass_every_frame_in_order_and_end_after_the_last() {
        let mut body = EndsWithLastFrame::new(frames(&["a", "bc", "def"]));
        assert_eq!(next(&mut body).await.as_deref(), Some(&b"a"[..]));
        assert!(!body.is_end_stream());
        // A stream body knows nothing of its size; the frame looked ahead at ("bc") is still to come.
        assert_eq!(body.size_hint().lower(), 2);
        assert_eq!(next(&mut body).await.as_deref(), Some(&b"bc"[..]));
        assert!(!body.is_end_stream());
        assert_eq!(next(&mut body).await.as_deref(), Some(&b"def"[..]));
        assert!(body.is_end_stream());
        assert_eq!(next(&mut body).await, None);
    }
}
