//! The coordinator ↔ worker protocol of cluster mode: frames over one TCP
//! connection per worker, each a JSON header ([`ToWorker`] or
//! [`ToCoordinator`]) and a binary body (a serialized proto, or empty).
//!
//! Frame: `u32` big-endian header length, the header, `u32` big-endian body
//! length, the body. Either side refuses a frame past [`MAX_FRAME_BYTES`].

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// This protocol's version, part of what a worker's Hello must match (with
/// the Weir version): raised with every change of the frames or bodies.
pub const PROTOCOL: u32 = 4;

/// The version string of a Hello: Weir's version and [`PROTOCOL`].
pub fn version() -> String {
    format!(
        "{} (cluster protocol {PROTOCOL})",
        env!("CARGO_PKG_VERSION")
    )
}

/// The body of [`ToWorker::Prepare`]: a `u32` big-endian length, the
/// encoded `PrepareJobRequest`, then the plan's bytes.
pub fn prepare_body(request: &[u8], plan: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + request.len() + plan.len());
    body.extend_from_slice(&(request.len() as u32).to_be_bytes());
    body.extend_from_slice(request);
    body.extend_from_slice(plan);
    body
}

/// The encoded `PrepareJobRequest` and plan of a [`prepare_body`].
///
/// # Errors
/// Says what is missing when the body is shorter than its length prefix.
pub fn split_prepare_body(body: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let len = body
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("no PrepareJobRequest length")?;
    body[4..].split_at_checked(len).ok_or_else(|| {
        format!(
            "a PrepareJobRequest of {len} bytes cut short at {}",
            body.len() - 4
        )
    })
}

/// Largest header or body accepted, in bytes: a pipeline at Weir's
/// `--max_pipeline_bytes` ceiling fits.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// What the coordinator sends a worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToWorker {
    /// The worker is registered under `worker_id`.
    Welcome { worker_id: String },
    /// The worker is refused (bad token, other version); the connection ends.
    Refused { why: String },
    /// Take the job for attempt `attempt` and reserve a timely port. Body:
    /// a `u32` big-endian length and a `PrepareJobRequest` (pipeline after
    /// staging, options, job name), then the coordinator's plan of it
    /// (`weir_plan::Plan::to_bytes`), which the worker runs as it is, bound
    /// to its own Fn API.
    Prepare {
        attempt: String,
        job_id: String,
        workers: usize,
    },
    /// Join the attempt's timely computation as process `process` of
    /// `addresses` and run it. No body.
    Start {
        attempt: String,
        process: usize,
        addresses: Vec<String>,
    },
    /// Cancel the attempt (the job was cancelled, or another worker failed).
    Cancel { attempt: String },
    /// Drain the attempt (Dataflow's drain).
    Drain { attempt: String },
}

/// What a worker sends the coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToCoordinator {
    /// First frame: who the worker is. `token` must match the coordinator's
    /// `--auth_token` when it has one.
    Hello {
        token: Option<String>,
        name: String,
        version: String,
    },
    /// Attempt taken; the worker's timely listener will be at `address`.
    Reserved { attempt: String, address: String },
    /// A job message (stream view) at `importance`
    /// (`JobMessage.MessageImportance`).
    Message {
        attempt: String,
        importance: i32,
        text: String,
    },
    /// An SDK log entry that only the job's logs carry.
    Log {
        attempt: String,
        importance: i32,
        text: String,
    },
    /// The worker's metrics and stage progress so far (sent every few
    /// seconds while the attempt runs). Body: a `MetricResults` with the
    /// metrics in `attempted`.
    Metrics {
        attempt: String,
        #[serde(default)]
        stages: Vec<weir_engine::StageProgress>,
    },
    /// The attempt ended on this worker: `state` is the `JobState.Enum` it
    /// reached (DONE, DRAINED, FAILED, CANCELLED), `error` why it failed.
    /// No body: the worker's final metrics and progress came just before,
    /// in a [`ToCoordinator::Metrics`].
    Finished {
        attempt: String,
        state: i32,
        error: String,
        /// Bytes of encoded elements this worker sent to the attempt's other
        /// workers (GroupByKey and stateful inputs, reshuffles, side inputs).
        #[serde(default)]
        exchanged_bytes: u64,
    },
}

/// Writes one frame.
///
/// # Errors
/// The I/O error of the connection.
pub async fn write_frame<W: AsyncWrite + Unpin, M: Serialize>(
    w: &mut W,
    header: &M,
    body: &[u8],
) -> std::io::Result<()> {
    let head = serde_json::to_vec(header).map_err(std::io::Error::other)?;
    let mut buf = Vec::with_capacity(8 + head.len() + body.len());
    buf.extend_from_slice(&(head.len() as u32).to_be_bytes());
    buf.extend_from_slice(&head);
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf).await?;
    w.flush().await
}

/// Largest first frame (a worker's Hello) the coordinator reads before it
/// knows the worker holds the token.
pub const MAX_HELLO_BYTES: usize = 64 << 10;

async fn read_part<R: AsyncRead + Unpin>(
    r: &mut R,
    what: &str,
    max: usize,
) -> std::io::Result<Vec<u8>> {
    let len = r.read_u32().await? as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("cluster frame {what} of {len} bytes is over the {max}-byte limit"),
        ));
    }
    let mut buf = vec![0; len];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Reads one frame: its header and body.
///
/// # Errors
/// The I/O error, or InvalidData for an oversized part or a header that is
/// not a message of this protocol (the message says which).
pub async fn read_frame<R: AsyncRead + Unpin, M: for<'de> Deserialize<'de>>(
    r: &mut R,
) -> std::io::Result<(M, Vec<u8>)> {
    read_frame_within(r, MAX_FRAME_BYTES).await
}

/// [`read_frame`] with parts of at most `max` bytes.
///
/// # Errors
/// As [`read_frame`].
pub async fn read_frame_within<R: AsyncRead + Unpin, M: for<'de> Deserialize<'de>>(
    r: &mut R,
    max: usize,
) -> std::io::Result<(M, Vec<u8>)> {
    let head = read_part(r, "header", max).await?;
    let header = serde_json::from_slice(&head).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a Weir cluster message: {e}"),
        )
    })?;
    let body = read_part(r, "body", max).await?;
    Ok((header, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_bodies_split_back_into_request_and_plan() {
        let body = prepare_body(b"request", b"plan bytes");
        assert_eq!(
            split_prepare_body(&body),
            Ok((&b"request"[..], &b"plan bytes"[..]))
        );
        assert_eq!(
            split_prepare_body(&prepare_body(b"", b"")),
            Ok((&b""[..], &b""[..]))
        );
        assert!(split_prepare_body(&body[..6])
            .unwrap_err()
            .contains("cut short"));
        assert!(split_prepare_body(&body[..3])
            .unwrap_err()
            .contains("no PrepareJobRequest"));
    }

    #[tokio::test]
    async fn frames_round_trip_header_and_body() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let sent = ToWorker::Start {
            attempt: "job-1-a1".into(),
            process: 2,
            addresses: vec![
                "10.0.0.1:2101".into(),
                "10.0.0.2:2101".into(),
                "10.0.0.3:2101".into(),
            ],
        };
        write_frame(&mut a, &sent, b"\x00\x01body").await.unwrap();
        let (got, body): (ToWorker, Vec<u8>) = read_frame(&mut b).await.unwrap();
        assert_eq!(got, sent);
        assert_eq!(body, b"\x00\x01body");
    }

    #[tokio::test]
    async fn headers_are_tagged_json() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(
            &mut a,
            &ToWorker::Cancel {
                attempt: "x".into(),
            },
            &[],
        )
        .await
        .unwrap();
        let head = read_part(&mut b, "header", MAX_FRAME_BYTES).await.unwrap();
        assert_eq!(
            String::from_utf8(head).unwrap(),
            r#"{"kind":"cancel","attempt":"x"}"#
        );
    }

    #[tokio::test]
    async fn oversized_and_foreign_frames_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        a.write_all(&(u32::MAX).to_be_bytes()).await.unwrap();
        let e = read_frame::<_, ToWorker>(&mut b).await.unwrap_err();
        assert!(e.to_string().contains("over the"), "{e}");

        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(&mut a, &serde_json::json!({"kind": "launch_missiles"}), &[])
            .await
            .unwrap();
        let e = read_frame::<_, ToWorker>(&mut b).await.unwrap_err();
        assert!(e.to_string().contains("not a Weir cluster message"), "{e}");
    }
}
