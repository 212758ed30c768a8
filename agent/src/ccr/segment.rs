//! The local tier's segment files: a run of records, each one original under its key.
//!
//! A record is `MAGIC`, the key's 16 hex characters, the length of the original as a
//! little-endian `u64`, then the original's bytes. Nothing else is stored: the key is the
//! checksum (a read recomputes it from the bytes), and a record cut short by a crash is
//! recognised by its length running past the end of the file or by a header that does not
//! parse, which ends the segment's scan.

use std::fs::File;
use std::io;
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

/// Appends the records of `originals` to `out`; returns each record with the offset of its
/// original's bytes in `out` (the caller adds where `out` lands in the segment).
pub fn encode(originals: &[(Key, &[u8])], out: &mut Vec<u8>) -> Vec<Record> {
    let extra: usize = originals.iter().map(|(_, b)| b.len()).sum::<usize>()
        + originals.len() * HEADER_LEN as usize;
    out.reserve(extra);
    let mut records = Vec::with_capacity(originals.len());
    for (key, bytes) in originals {
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(key.as_str().as_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        records.push(Record {
            key: *key,
            offset: out.len() as u64,
            len: bytes.len() as u64,
        });
        out.extend_from_slice(bytes);
    }
    records
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
    use std::io::Write;

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_scan() {
        let a = b"first original".to_vec();
        let b = vec![7u8; 1000];
        let originals = [(Key::of(&a), &a[..]), (Key::of(&b), &b[..])];
        let mut buf = Vec::new();
        let encoded = encode(&originals, &mut buf);
        let whole = buf.len() as u64;
        // A third record cut in the middle of its bytes, then garbage.
        let c = vec![9u8; 500];
        encode(&[(Key::of(&c), &c[..])], &mut buf);
        buf.truncate(buf.len() - 100);
        let mut file = tempfile::tempfile().expect("file");
        file.write_all(&buf).expect("write");
        let (found, end) = scan(&file, 0, buf.len() as u64).expect("scan");
        assert_eq!(end, whole);
        assert_eq!(found.len(), 2);
        for ((record, (key, bytes)), written) in found.iter().zip(&originals).zip(&encoded) {
            assert_eq!((record.key, record.offset), (*key, written.offset));
            assert_eq!(read(&file, record).expect("read"), *bytes);
        }
        // Garbage where a header should be ends the scan too.
        file.write_all_at(b"junkjunkjunkjunkjunkjunkjunkjunk", whole)
            .expect("junk");
        assert_eq!(scan(&file, 0, buf.len() as u64).expect("scan").1, whole);
        // A scan resumed from the end of the whole records finds nothing new.
        assert!(scan(&file, whole, whole).expect("scan").0.is_empty());
    }
}
