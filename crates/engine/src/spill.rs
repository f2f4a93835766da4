//! Sorted runs of GroupByKey groups on local disk, for GroupByKeys larger
//! than their memory budget (see [`crate::group_by_key::GroupByKeyBuffer::with_spill`]).
//!
//! A run is one file of records sorted by (window max timestamp, encoded key,
//! encoded window), each record one group: its values' nested encodings
//! back to back, their count and min/max timestamps. Runs are written in the
//! order the buffer filled up, so merging equal groups in run order keeps
//! the values in arrival order. Record layout (integers big-endian):
//! `expiry i64 | key_len u32 | key | window_len u32 | window | min_ts i64 |
//! max_ts i64 | count u64 | values_len u64 | values`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

use weir_model::Timestamp;

/// One group as stored in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) expiry: Timestamp,
    pub(crate) key: Vec<u8>,
    /// The window's encoding under the GroupByKey's window coder.
    pub(crate) window: Vec<u8>,
    pub(crate) min_ts: Timestamp,
    pub(crate) max_ts: Timestamp,
    pub(crate) count: u64,
    pub(crate) values: Vec<u8>,
}

impl Record {
    fn order(&self) -> (Timestamp, &[u8], &[u8]) {
        (self.expiry, &self.key, &self.window)
    }

    /// True when `other` is the same (window, key) group.
    pub(crate) fn same_group(&self, other: &Record) -> bool {
        self.order() == other.order()
    }
}

/// A borrowed record, for writing without copying.
pub(crate) struct RecordRef<'a> {
    pub(crate) expiry: Timestamp,
    pub(crate) key: &'a [u8],
    pub(crate) window: Vec<u8>,
    pub(crate) min_ts: Timestamp,
    pub(crate) max_ts: Timestamp,
    pub(crate) count: u64,
    pub(crate) values: &'a [u8],
}

/// Writes `records` (sorted here) as a new run file in `dir`.
pub(crate) fn write_run(dir: &Path, mut records: Vec<RecordRef<'_>>) -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    records.sort_unstable_by(|a, b| {
        (a.expiry, a.key, a.window.as_slice()).cmp(&(b.expiry, b.key, b.window.as_slice()))
    });
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!(
        "run-{}-{}.gbk",
        std::process::id(),
        NEXT.fetch_add(1, AtomicOrdering::Relaxed)
    ));
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&path)?);
    for r in &records {
        w.write_all(&r.expiry.0.to_be_bytes())?;
        w.write_all(&(r.key.len() as u32).to_be_bytes())?;
        w.write_all(r.key)?;
        w.write_all(&(r.window.len() as u32).to_be_bytes())?;
        w.write_all(&r.window)?;
        w.write_all(&r.min_ts.0.to_be_bytes())?;
        w.write_all(&r.max_ts.0.to_be_bytes())?;
        w.write_all(&r.count.to_be_bytes())?;
        w.write_all(&(r.values.len() as u64).to_be_bytes())?;
        w.write_all(r.values)?;
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_data().ok();
    Ok(path)
}

/// Reads a run's records in order.
pub(crate) struct RunReader {
    path: PathBuf,
    file: BufReader<File>,
    /// The next record, not consumed yet.
    pub(crate) head: Option<Record>,
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_bytes(r: &mut impl Read, n: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

impl RunReader {
    pub(crate) fn open(path: PathBuf) -> std::io::Result<Self> {
        let file = BufReader::with_capacity(256 << 10, File::open(&path)?);
        let mut r = RunReader {
            path,
            file,
            head: None,
        };
        r.advance()?;
        Ok(r)
    }

    /// Takes the head record and reads the next one.
    pub(crate) fn pop(&mut self) -> std::io::Result<Option<Record>> {
        let head = self.head.take();
        if head.is_some() {
            self.advance()?;
        }
        Ok(head)
    }

    fn advance(&mut self) -> std::io::Result<()> {
        let mut first = [0u8; 8];
        match self.file.read_exact(&mut first) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.head = None;
                let _ = std::fs::remove_file(&self.path);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let f = &mut self.file;
        let expiry = Timestamp(i64::from_be_bytes(first));
        let klen = read_u32(f)? as usize;
        let key = read_bytes(f, klen)?;
        let wlen = read_u32(f)? as usize;
        let window = read_bytes(f, wlen)?;
        let min_ts = Timestamp(read_u64(f)? as i64);
        let max_ts = Timestamp(read_u64(f)? as i64);
        let count = read_u64(f)?;
        let vlen = read_u64(f)? as usize;
        let values = read_bytes(f, vlen)?;
        self.head = Some(Record {
            expiry,
            key,
            window,
            min_ts,
            max_ts,
            count,
            values,
        });
        Ok(())
    }
}

impl Drop for RunReader {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A k-way merge over runs: yields groups in (expiry, key, window) order,
/// equal groups of several runs combined in run order.
pub(crate) struct Merger {
    pub(crate) runs: Vec<RunReader>,
}

impl Merger {
    /// The expiry of the next group, if any.
    pub(crate) fn next_expiry(&self) -> Option<Timestamp> {
        self.runs
            .iter()
            .filter_map(|r| r.head.as_ref().map(|h| h.expiry))
            .min()
    }

    /// True when every run is exhausted.
    pub(crate) fn is_empty(&self) -> bool {
        self.runs.iter().all(|r| r.head.is_none())
    }

    /// The next group, all runs' parts of it combined in run order.
    pub(crate) fn pop(&mut self) -> std::io::Result<Option<Record>> {
        // Few runs (one per budget's worth of input): a scan of the heads;
        // the first of equal heads is the earliest run.
        let Some(best) = self
            .runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.head.as_ref().map(|h| (i, h.order())))
            .min_by(|a, b| a.1.cmp(&b.1))
            .map(|(i, _)| i)
        else {
            return Ok(None);
        };
        let mut out = self.runs[best].pop()?.expect("head present");
        for i in best + 1..self.runs.len() {
            let same = self.runs[i]
                .head
                .as_ref()
                .is_some_and(|h| h.same_group(&out));
            if same {
                let part = self.runs[i].pop()?.expect("head present");
                out.values.extend_from_slice(&part.values);
                out.count += part.count;
                out.min_ts = out.min_ts.min(part.min_ts);
                out.max_ts = out.max_ts.max(part.max_ts);
            }
        }
        self.runs.retain(|r| r.head.is_some());
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(expiry: i64, key: &'a [u8], values: &'a [u8]) -> RecordRef<'a> {
        RecordRef {
            expiry: Timestamp(expiry),
            key,
            window: vec![],
            min_ts: Timestamp(expiry - 5),
            max_ts: Timestamp(expiry - 1),
            count: values.len() as u64,
            values,
        }
    }

    #[test]
    fn runs_merge_in_order_combining_equal_groups_in_run_order() {
        let dir = std::env::temp_dir().join(format!("weir-spill-test-{}", std::process::id()));
        let a = write_run(
            &dir,
            vec![rec(20, b"k", b"\x01"), rec(10, b"b", b"\x02\x03")],
        )
        .unwrap();
        let b = write_run(&dir, vec![rec(10, b"a", b"\x04"), rec(20, b"k", b"\x05")]).unwrap();
        let mut m = Merger {
            runs: vec![
                RunReader::open(a.clone()).unwrap(),
                RunReader::open(b.clone()).unwrap(),
            ],
        };
        assert_eq!(m.next_expiry(), Some(Timestamp(10)));
        let mut got = Vec::new();
        while let Some(r) = m.pop().unwrap() {
            got.push((r.expiry.0, r.key, r.values, r.count));
        }
        assert_eq!(
            got,
            vec![
                (10, b"a".to_vec(), vec![4], 1),
                (10, b"b".to_vec(), vec![2, 3], 2),
                (20, b"k".to_vec(), vec![1, 5], 2),
            ]
        );
        assert!(m.is_empty());
        assert!(!a.exists() && !b.exists(), "exhausted runs are deleted");
        let _ = std::fs::remove_dir(&dir);
    }
}
