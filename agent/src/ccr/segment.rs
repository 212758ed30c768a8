//! The local tier's segment files: a run of records, each one original under its key.
//!
//! A record is `MAGIC`, the key's 16 hex characters, the length of the original as a
//! little-endian `u64`, then the original's bytes. Nothing else is stored: the key is the
//! checksum (a read recomputes it from the bytes), and a record cut short by a crash is
//! recognised by its length running past the end of the file or by a header that does not
//! parse, which ends the segment's scan.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, IoSlice, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use super::{KEY_LEN, Key};

/// The first bytes of every record.
pub const MAGIC: [u8; 4] = *b"ccr1";
/// Bytes before a record's original.
pub const HEADER_LEN: u64 = (MAGIC.len() + KEY_LEN + 8) as u64;
/// File names of segments start with this; no key does, and neither does a temp file.
pub const PREFIX: &str = "seg-";

/// One record found by a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: Key,
    /// Where the original's bytes start in the segment.
    pub offset: u64,
    pub len: u64,
}

/// A record's header: `MAGIC`, the key, the original's length.
pub fn header(key: &Key, len: u64) -> [u8; HEADER_LEN as usize] {
    let mut head = [0u8; HEADER_LEN as usize];
    head[..MAGIC.len()].copy_from_slice(&MAGIC);
    head[MAGIC.len()..MAGIC.len() + KEY_LEN].copy_from_slice(key.as_str().as_bytes());
    head[MAGIC.len() + KEY_LEN..].copy_from_slice(&len.to_le_bytes());
    head
}

/// Records to append in one write: each header, then its original, the originals borrowed
/// where the write can lend them ([`Batch::into_owned`] for one that cannot).
#[derive(Default)]
pub struct Batch<'a> {
    heads: Vec<[u8; HEADER_LEN as usize]>,
    originals: Vec<Cow<'a, [u8]>>,
    /// Each record with the offset of its original's bytes from the batch's start (the
    /// caller adds where the batch lands in the segment).
    pub records: Vec<Record>,
    len: u64,
}

impl<'a> Batch<'a> {
    pub fn push(&mut self, key: Key, original: Cow<'a, [u8]>) {
        let len = original.len() as u64;
        self.heads.push(header(&key, len));
        self.records.push(Record {
            key,
            offset: self.len + HEADER_LEN,
            len,
        });
        self.originals.push(original);
        self.len += HEADER_LEN + len;
    }

    /// Bytes the batch writes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The batch with its originals copied: for a write on another thread.
    pub fn into_owned(self) -> Batch<'static> {
        Batch {
            heads: self.heads,
            originals: self
                .originals
                .into_iter()
                .map(|o| Cow::Owned(o.into_owned()))
                .collect(),
            records: self.records,
            len: self.len,
        }
    }

    /// Writes the batch at `at` in `file` (one `writev` for up to the system's limit of
    /// pieces; no copy of the originals).
    pub fn write_at(&self, mut file: &File, at: u64) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = self
            .heads
            .iter()
            .zip(&self.originals)
            .flat_map(|(head, original)| [IoSlice::new(head), IoSlice::new(original)])
            .collect();
        let mut rest = &mut slices[..];
        file.seek(SeekFrom::Start(at))?;
        while !rest.is_empty() {
            match file.write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The whole records between `from` and `to` (the file's length as the caller saw it), and
/// where the last whole one ends: the next scan starts there.
pub fn scan(file: &File, from: u64, to: u64) -> io::Result<(Vec<Record>, u64)> {
    let mut records = Vec::new();
    let mut at = from;
    let mut header = [0u8; HEADER_LEN as usize];
    while at + HEADER_LEN <= to {
        file.read_exact_at(&mut header, at)?;
        let Some(record) = parse_header(&header, at) else {
            break;
        };
        if record.offset + record.len > to {
            break;
        }
        at = record.offset + record.len;
        records.push(record);
    }
    Ok((records, at))
}

fn parse_header(header: &[u8; HEADER_LEN as usize], at: u64) -> Option<Record> {
    let (magic, rest) = header.split_at(MAGIC.len());
    if magic != MAGIC {
        return None;
    }
    let (key, len) = rest.split_at(KEY_LEN);
    let key = Key::parse(std::str::from_utf8(key).ok()?)?;
    let len = u64::from_le_bytes(len.try_into().ok()?);
    Some(Record {
        key,
        offset: at + HEADER_LEN,
        len,
    })
}

/// Reads one original: a single positioned read.
pub fn read(file: &File, record: &Record) -> io::Result<Vec<u8>> {
    let len = usize::try_from(record.len).map_err(io::Error::other)?;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, record.offset)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_scan() {
        let a = b"first original".to_vec();
        let b = vec![7u8; 1000];
        let originals = [(Key::of(&a), &a[..]), (Key::of(&b), &b[..])];
        let mut batch = Batch::default();
        for (key, bytes) in originals {
            batch.push(key, Cow::Borrowed(bytes));
        }
        let file = tempfile::tempfile().expect("file");
        batch.write_at(&file, 0).expect("write");
        let whole = batch.len();
        // A third record cut in the middle of its bytes, then garbage.
        let c = vec![9u8; 500];
        let mut third = Batch::default();
        third.push(Key::of(&c), Cow::Owned(c.clone()));
        third.write_at(&file, whole).expect("write");
        let end_of_file = whole + third.len() - 100;
        file.set_len(end_of_file).expect("cut");
        let (found, end) = scan(&file, 0, end_of_file).expect("scan");
        assert_eq!(end, whole);
        assert_eq!(found.len(), 2);
        for ((record, (key, bytes)), written) in found.iter().zip(&originals).zip(&batch.records) {
            assert_eq!((record.key, record.offset), (*key, written.offset));
            assert_eq!(read(&file, record).expect("read"), *bytes);
        }
        // Garbage where a header should be ends the scan too.
        file.write_all_at(b"junkjunkjunkjunkjunkjunkjunkjunk", whole)
            .expect("junk");
        assert_eq!(scan(&file, 0, end_of_file).expect("scan").1, whole);
        // A scan resumed from the end of the whole records finds nothing new.
        assert!(scan(&file, whole, whole).expect("scan").0.is_empty());
    }

    #[test]
    fn a_batch_past_the_systems_limit_of_pieces_is_written_whole() {
        // 1,500 records: 3,000 pieces, more than one `writev` takes (1,024 on Linux).
        let originals: Vec<Vec<u8>> = (0..1_500u32).map(|i| i.to_le_bytes().repeat(3)).collect();
        let mut batch = Batch::default();
        for o in &originals {
            batch.push(Key::of(o), Cow::Borrowed(&o[..]));
        }
        let file = tempfile::tempfile().expect("file");
        batch.write_at(&file, 7).expect("write");
        let (found, end) = scan(&file, 7, 7 + batch.len()).expect("scan");
        assert_eq!(end, 7 + batch.len());
        assert_eq!(found.len(), originals.len());
        for (record, o) in found.iter().zip(&originals) {
            assert_eq!(read(&file, record).expect("read"), *o);
        }
    }
}
