//! Incremental Server-Sent Events decoder: bytes in, complete events out.
//!
//! Chunks may split lines, CRLF pairs and multi-byte UTF-8 characters anywhere; only complete
//! lines are decoded. A single line longer than the bound is an error rather than unbounded
//! buffering.

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// The decoder refused the stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("event-stream line longer than {0} bytes")]
    LineTooLong(usize),
}

#[derive(Debug)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    has_data: bool,
    max_line: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new(16 * 1024 * 1024)
    }
}

impl SseDecoder {
    pub fn new(max_line: usize) -> Self {
        Self {
            buf: Vec::new(),
            event: None,
            data: Vec::new(),
            has_data: false,
            max_line,
        }
    }

    /// Feeds a chunk and returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            if let Some(ev) = self.line(&line) {
                out.push(ev);
            }
        }
        self.buf.drain(..start);
        if self.buf.len() > self.max_line {
            return Err(SseError::LineTooLong(self.max_line));
        }
        Ok(out)
    }

    /// Flushes at end of stream: a final event without its blank line still counts.
    pub fn finish(&mut self) -> Option<SseEvent> {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            let line = String::from_utf8_lossy(&rest).into_owned();
            if let Some(ev) = self.line(line.trim_end_matches('\r')) {
                return Some(ev);
            }
        }
        self.dispatch()
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => {
                self.data.push(value.to_string());
                self.has_data = true;
            }
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        let data = std::mem::take(&mut self.data).join("\n");
        Some(SseEvent { event, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(d.feed(c).unwrap());
        }
        out.extend(d.finish());
        out
    }

    #[test]
    fn events_survive_any_split() {
        let text = "event: a\r\ndata: {\"x\":\"é\"}\r\n\r\n: ping\n\ndata: one\ndata: two\n\n";
        let expect = vec![
            SseEvent {
                event: Some("a".into()),
                data: "{\"x\":\"é\"}".into(),
            },
            SseEvent {
                event: None,
                data: "one\ntwo".into(),
            },
        ];
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(all(&[&bytes[..cut], &bytes[cut..]]), expect, "cut at {cut}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(all(&singles), expect);
    }

    #[test]
    fn unterminated_last_event_is_flushed() {
        assert_eq!(
            all(&[b"data: [DONE]"]),
            vec![SseEvent {
                event: None,
                data: "[DONE]".into()
            }]
        );
    }

    #[test]
    fn overlong_lines_are_refused() {
        let mut d = SseDecoder::new(8);
        assert_eq!(d.feed(b"data: 0123456789"), Err(SseError::LineTooLong(8)));
    }
}
