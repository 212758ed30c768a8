//! Incremental decoder of the AWS event-stream binary framing (Bedrock `converse-stream`).
//!
//! A message is: total length (u32 BE), headers length (u32 BE), CRC32 of those 8 bytes,
//! headers, payload, CRC32 of everything before it. Both checksums are verified; a frame
//! longer than the bound is refused instead of buffered.

use super::sse::SseEvent;

/// Largest frame accepted.
const MAX_FRAME: usize = 16 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventStreamError {
    #[error("event-stream frame of {0} bytes is out of bounds")]
    FrameSize(usize),
    #[error("event-stream checksum mismatch")]
    Checksum,
    #[error("event-stream headers are malformed")]
    Headers,
}

/// One decoded message: its string headers and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The frame as an event: `event` is the `:event-type`, or `exception:<type>` for an
    /// exception message; `data` is the payload text.
    pub fn to_event(&self) -> SseEvent {
        let event = match self.header(":message-type") {
            Some("exception") | Some("error") => format!(
                "exception:{}",
                self.header(":exception-type")
                    .or(self.header(":error-code"))
                    .unwrap_or("unknown")
            ),
            _ => self.header(":event-type").unwrap_or_default().to_string(),
        };
        SseEvent {
            event: Some(event),
            data: String::from_utf8_lossy(&self.payload).into_owned(),
        }
    }
}

#[derive(Debug, Default)]
pub struct EventStreamDecoder {
    buf: Vec<u8>,
}

fn be32(b: &[u8]) -> usize {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

impl EventStreamDecoder {
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Frame>, EventStreamError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while self.buf.len() - start >= 12 {
            let b = &self.buf[start..];
            let total = be32(&b[0..4]);
            let headers_len = be32(&b[4..8]);
            if !(16..=MAX_FRAME).contains(&total) || headers_len > total - 16 {
                return Err(EventStreamError::FrameSize(total));
            }
            if crc32(&b[0..8]) != be32(&b[8..12]) as u32 {
                return Err(EventStreamError::Checksum);
            }
            if b.len() < total {
                break;
            }
            let frame = &b[..total];
            if crc32(&frame[..total - 4]) != be32(&frame[total - 4..]) as u32 {
                return Err(EventStreamError::Checksum);
            }
            let headers = parse_headers(&frame[12..12 + headers_len])?;
            let payload = frame[12 + headers_len..total - 4].to_vec();
            out.push(Frame { headers, payload });
            start += total;
        }
        self.buf.drain(..start);
        Ok(out)
    }

    /// Bytes of an incomplete frame left at the end of the stream.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

fn parse_headers(mut b: &[u8]) -> Result<Vec<(String, String)>, EventStreamError> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, EventStreamError> {
        if b.len() < n {
            return Err(EventStreamError::Headers);
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head.to_vec())
    };
    while !b.is_empty() {
        let name_len = take(&mut b, 1)?[0] as usize;
        let name = String::from_utf8_lossy(&take(&mut b, name_len)?).into_owned();
        let kind = take(&mut b, 1)?[0];
        let fixed = match kind {
            0 | 1 => Some(0),
            2 => Some(1),
            3 => Some(2),
            4 => Some(4),
            5 | 8 => Some(8),
            9 => Some(16),
            6 | 7 => None,
            _ => return Err(EventStreamError::Headers),
        };
        match fixed {
            Some(n) => {
                take(&mut b, n)?;
            }
            None => {
                let len = take(&mut b, 2)?;
                let len = u16::from_be_bytes([len[0], len[1]]) as usize;
                let value = take(&mut b, len)?;
                if kind == 7 {
                    out.push((name, String::from_utf8_lossy(&value).into_owned()));
                }
            }
        }
    }
    Ok(out)
}

const CRC_TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 == 1 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

/// CRC-32 (IEEE 802.3), as the event-stream framing uses it.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in data {
        crc = CRC_TABLE[((crc ^ u32::from(byte)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Encodes one frame with string headers (tests and the simulator's format).
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    for (k, v) in headers {
        h.push(k.len() as u8);
        h.extend_from_slice(k.as_bytes());
        h.push(7);
        h.extend_from_slice(&(v.len() as u16).to_be_bytes());
        h.extend_from_slice(v.as_bytes());
    }
    let total = 12 + h.len() + payload.len() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude_crc = crc32(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn frames_survive_any_split_and_corruption_is_caught() {
        let a = encode(
            &[(":event-type", "messageStart"), (":message-type", "event")],
            br#"{"role":"assistant"}"#,
        );
        let b = encode(
            &[
                (":message-type", "exception"),
                (":exception-type", "throttlingException"),
            ],
            br#"{"message":"slow down"}"#,
        );
        let all = [a.clone(), b].concat();
        for cut in 0..all.len() {
            let mut d = EventStreamDecoder::default();
            let mut frames = d.feed(&all[..cut]).unwrap();
            frames.extend(d.feed(&all[cut..]).unwrap());
            assert_eq!(frames.len(), 2, "cut {cut}");
            assert_eq!(frames[0].to_event().event.as_deref(), Some("messageStart"));
            assert_eq!(
                frames[1].to_event().event.as_deref(),
                Some("exception:throttlingException")
            );
        }
        let mut bad = a;
        let n = bad.len();
        bad[n - 6] ^= 0xff;
        assert_eq!(
            EventStreamDecoder::default().feed(&bad),
            Err(EventStreamError::Checksum)
        );
        let mut huge = encode(&[], b"x");
        huge[0] = 0x7f;
        let fixed = crc32(&huge[..8]).to_be_bytes();
        huge[8..12].copy_from_slice(&fixed);
        assert!(matches!(
            EventStreamDecoder::default().feed(&huge),
            Err(EventStreamError::FrameSize(_))
        ));
    }
}
