//! A completed bundle's output streams, read back a slice at a time: the
//! bytes a harness spilled to a file while the bundle ran
//! ([`crate::BundleRequest::spill_outputs`]), then the bytes it kept in
//! memory.

use std::io::{Read, Seek};

use weir_model::Coder;

use crate::elements::split_whole;

/// Where a harness writes a bundle's output streams once one holds more than
/// `above_bytes` in memory, so a bundle whose outputs outgrow the memory
/// budget (one element fanning out to millions) does not hold them all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpill {
    /// The folder for the spill files (created when missing). Files are
    /// unlinked as soon as they are opened: they vanish with their handle.
    pub dir: std::path::PathBuf,
    /// Most bytes of one output stream kept in memory before they are
    /// written out (then the next ones gather again).
    pub above_bytes: usize,
}

impl OutputSpill {
    /// The spill of a job whose GroupByKeys keep `budget` bytes in memory:
    /// a quarter of it per output stream, between 1 and 64 MiB.
    pub fn for_budget(dir: std::path::PathBuf, budget: usize) -> Self {
        OutputSpill {
            dir,
            above_bytes: (budget / 4).clamp(1 << 20, 64 << 20),
        }
    }
}

/// The leading bytes of one output stream of a bundle, written to an
/// unlinked file by the harness; the stream goes on with the bytes in
/// [`crate::BundleResult::outputs`].
#[derive(Debug)]
pub struct SpilledOutput {
    /// The open file (its position does not matter: it is read from 0).
    pub file: std::fs::File,
    /// Bytes written to it.
    pub len: u64,
}

/// Reads one output stream of a completed bundle as whole encoded elements,
/// a slice at a time: the spilled file first, then the in-memory tail. An
/// element may straddle the file's end and the tail.
pub(crate) struct OutputReader {
    /// The spilled file and the bytes of it not read yet.
    file: Option<(std::fs::File, u64)>,
    /// The in-memory tail, until it is appended to `buf`.
    tail: Option<Vec<u8>>,
    /// Bytes read and not yet given out from `pos` on.
    buf: Vec<u8>,
    pos: usize,
}

/// How much of a spilled file one read takes at least.
const READ_BYTES: usize = 1 << 20;

impl OutputReader {
    /// A reader of `spilled` (if any) followed by `tail`. Errors: the file
    /// cannot be rewound.
    pub(crate) fn new(spilled: Option<SpilledOutput>, tail: Vec<u8>) -> std::io::Result<Self> {
        Ok(match spilled {
            Some(mut s) if s.len > 0 => {
                s.file.rewind()?;
                OutputReader {
                    file: Some((s.file, s.len)),
                    tail: Some(tail),
                    buf: Vec::new(),
                    pos: 0,
                }
            }
            _ => OutputReader {
                file: None,
                tail: None,
                buf: tail,
                pos: 0,
            },
        })
    }

    /// Whether every element was given out.
    pub(crate) fn is_done(&self) -> bool {
        self.file.is_none()
            && self.tail.as_ref().is_none_or(Vec::is_empty)
            && self.pos >= self.buf.len()
    }

    /// The next whole elements, at most `max_bytes` of them (at least one
    /// unless the stream is done), and the bytes they took. Errors: bytes
    /// that do not decode with the coders (also a partial last element), or
    /// the file could not be read; each names what failed.
    pub(crate) fn next(
        &mut self,
        value_coder: &Coder,
        window_coder: &Coder,
        max_bytes: usize,
    ) -> Result<(Vec<Vec<u8>>, usize), String> {
        loop {
            let more = self.file.is_some() || self.tail.is_some();
            let (elements, used) =
                split_whole(value_coder, window_coder, &self.buf[self.pos..], max_bytes, more)?;
            if !elements.is_empty() || !more {
                self.pos += used;
                return Ok((elements, used));
            }
            self.fill(max_bytes)?;
        }
    }

    /// Appends more of the stream to `buf` (dropping what was given out):
    /// at least `want` bytes of the file, or as many as `buf` holds (so an
    /// element larger than a read takes few reads), else the tail.
    fn fill(&mut self, want: usize) -> Result<(), String> {
        self.buf.drain(..self.pos);
        self.pos = 0;
        match &mut self.file {
            Some((file, left)) => {
                let n = (*left).min(want.max(READ_BYTES).max(self.buf.len()) as u64);
                let start = self.buf.len();
                self.buf.resize(start + n as usize, 0);
                file.read_exact(&mut self.buf[start..])
                    .map_err(|e| format!("cannot read a spilled bundle output back: {e}"))?;
                *left -= n;
                if *left == 0 {
                    self.file = None;
                }
            }
            None => {
                if let Some(tail) = self.tail.take() {
                    if self.buf.is_empty() {
                        self.buf = tail;
                    } else {
                        self.buf.extend_from_slice(&tail);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use weir_model::{PaneInfo, Timestamp, Window, WindowedValue};

    use super::*;

    /// An encoded element in the global window at `timestamp` (ms) whose
    /// value is `len` bytes of `byte`, length-prefixed (Bytes).
    fn element(timestamp: i64, byte: u8, len: usize) -> Vec<u8> {
        let mut value = Vec::new();
        weir_model::varint::encode_varint(len as i64, &mut value);
        value.extend(std::iter::repeat_n(byte, len));
        let mut out = Vec::new();
        WindowedValue {
            timestamp: Timestamp(timestamp),
            windows: vec![Window::Global],
            pane: PaneInfo::NO_FIRING,
            value,
        }
        .encode(&mut out);
        out
    }

    /// `n` elements with `len`-byte values.
    fn elements(n: usize, len: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| element(i as i64, i as u8, len)).collect()
    }

    fn spilled(bytes: &[u8]) -> SpilledOutput {
        let mut file = tempfile().unwrap();
        file.write_all(bytes).unwrap();
        SpilledOutput {
            file,
            len: bytes.len() as u64,
        }
    }

    /// An unlinked file in the temp folder.
    fn tempfile() -> std::io::Result<std::fs::File> {
        let path = std::env::temp_dir().join(format!(
            "weir-outputs-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        Ok(file)
    }

    fn read_all(mut r: OutputReader, max_bytes: usize) -> Result<Vec<Vec<u8>>, String> {
        let mut out = Vec::new();
        while !r.is_done() {
            let (elements, used) = r.next(&Coder::Bytes, &Coder::GlobalWindow, max_bytes)?;
            assert!(!elements.is_empty(), "a slice gives at least one element");
            assert_eq!(used, elements.iter().map(Vec::len).sum::<usize>());
            out.extend(elements);
        }
        Ok(out)
    }

    /// Every split of a stream between file and tail (also through an
    /// element) reads back the same elements in order, at any slice size.
    #[test]
    fn spilled_file_then_tail_read_back_whole_elements_in_order() {
        let want = elements(50, 100);
        let bytes = want.concat();
        for cut in [0, 1, 17, 110, bytes.len() / 2, bytes.len() - 1, bytes.len()] {
            for max_bytes in [1, 250, 1 << 20] {
                let r = OutputReader::new(Some(spilled(&bytes[..cut])), bytes[cut..].to_vec()).unwrap();
                assert_eq!(read_all(r, max_bytes).unwrap(), want, "cut {cut}, slices of {max_bytes}");
            }
        }
        let r = OutputReader::new(None, bytes.clone()).unwrap();
        assert_eq!(read_all(r, 300).unwrap(), want);
    }

    /// An element larger than a read is read whole.
    #[test]
    fn an_element_larger_than_one_read_is_whole() {
        let big = element(0, 7, 3 * READ_BYTES);
        let want = [elements(2, 10), vec![big], elements(3, 5)].concat();
        let bytes = want.concat();
        let r = OutputReader::new(Some(spilled(&bytes[..bytes.len() - 20])), bytes[bytes.len() - 20..].to_vec()).unwrap();
        assert_eq!(read_all(r, 64).unwrap(), want);
    }

    /// A partial last element fails, named as truncated, file or not.
    #[test]
    fn a_partial_last_element_is_an_error() {
        let bytes = elements(3, 10).concat();
        let short = &bytes[..bytes.len() - 2];
        let err = read_all(OutputReader::new(Some(spilled(short)), vec![]).unwrap(), 1 << 20).unwrap_err();
        assert!(err.starts_with("truncated input"), "{err}");
        let err = read_all(OutputReader::new(None, short.to_vec()).unwrap(), 1 << 20).unwrap_err();
        assert!(err.starts_with("truncated input"), "{err}");
    }

    #[test]
    fn spill_threshold_follows_the_budget() {
        let dir = std::path::PathBuf::from("/d");
        assert_eq!(OutputSpill::for_budget(dir.clone(), 10 << 20).above_bytes, (10 << 20) / 4);
        assert_eq!(OutputSpill::for_budget(dir.clone(), 1 << 10).above_bytes, 1 << 20);
        assert_eq!(OutputSpill::for_budget(dir, 8 << 30).above_bytes, 64 << 20);
    }
}
