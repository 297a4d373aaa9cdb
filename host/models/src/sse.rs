//! An incremental, bounded Server-Sent Events parser (WHATWG rules, as openai-python's `SSEDecoder`).
//!
//! Bytes go in as they arrive, split anywhere (inside a multi-byte UTF-8 character, between the
//! `\r` and `\n` of a CRLF); whole events come out. Lines end with `\n`, `\r\n` or `\r`; a blank line
//! dispatches the event; `:` starts a comment; one space after the field's colon is dropped;
//! several `data:` lines are joined with `\n`; `id`, `retry` and unknown fields are ignored.
//! UTF-8 is decoded per complete line, never per read. An incomplete event at the end of the
//! stream is dropped (the stream assemblers then report the missing terminal event).

/// Default bound on one event (its name, data and the line being read), in bytes.
pub const SSE_EVENT_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if the event had one.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

impl SseEvent {
    /// An event with only data.
    pub fn data(data: impl Into<String>) -> Self {
        SseEvent {
            event: None,
            data: data.into(),
        }
    }

    /// An event with a name and data.
    pub fn named(event: impl Into<String>, data: impl Into<String>) -> Self {
        SseEvent {
            event: Some(event.into()),
            data: data.into(),
        }
    }
}

/// Why the byte stream cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// One event grew past the bound.
    #[error("server-sent event larger than event_bytes_max = {event_bytes_max} bytes")]
    TooLarge {
        /// The bound in force.
        event_bytes_max: usize,
    },
    /// A line is not UTF-8.
    #[error("server-sent event line is not valid UTF-8 (at byte {valid_up_to} of the line)")]
    Utf8 {
        /// Length of the valid prefix of the line.
        valid_up_to: usize,
    },
}

/// The incremental parser. Feed it with [`SseParser::push`].
#[derive(Debug)]
pub struct SseParser {
    event_bytes_max: usize,
    line: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
    /// The previous byte was a `\r` that ended a line; a `\n` right after it belongs to it.
    after_cr: bool,
    /// Nothing has been read yet (a leading byte-order mark is dropped).
    at_start: bool,
    bom_seen: usize,
}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new(SSE_EVENT_BYTES_MAX_DEFAULT)
    }
}

impl SseParser {
    /// A parser refusing events larger than `event_bytes_max` bytes.
    pub fn new(event_bytes_max: usize) -> Self {
        SseParser {
            event_bytes_max,
            line: Vec::new(),
            event: None,
            data: String::new(),
            has_data: false,
            after_cr: false,
            at_start: true,
            bom_seen: 0,
        }
    }

    /// Bytes of the event being read (name, data and the unfinished line).
    pub fn pending_bytes(&self) -> usize {
        self.line.len() + self.data.len() + self.event.as_ref().map_or(0, String::len)
    }

    /// Feeds bytes; returns the events they complete, in order.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut out = Vec::new();
        while self.at_start && !bytes.is_empty() {
            if bytes[0] == BOM[self.bom_seen] {
                self.bom_seen += 1;
                bytes = &bytes[1..];
                if self.bom_seen == BOM.len() {
                    self.at_start = false;
                }
            } else {
                // Not a BOM after all: the bytes taken so far were content.
                self.line.extend_from_slice(&BOM[..self.bom_seen]);
                self.at_start = false;
            }
        }
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(&mut out)?,
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut out)?;
                }
                _ => {
                    self.line.push(b);
                    if self.pending_bytes() > self.event_bytes_max {
                        return Err(SseError::TooLarge {
                            event_bytes_max: self.event_bytes_max,
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let raw = std::mem::take(&mut self.line);
        if raw.is_empty() {
            if self.has_data {
                out.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event = None;
            self.data.clear();
            self.has_data = false;
            return Ok(());
        }
        let line = String::from_utf8(raw).map_err(|e| SseError::Utf8 {
            valid_up_to: e.utf8_error().valid_up_to(),
        })?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_string()),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {} // id, retry, unknown
        }
        if self.pending_bytes() > self.event_bytes_max {
            return Err(SseError::TooLarge {
                event_bytes_max: self.event_bytes_max,
            });
        }
        Ok(())
    }
}

/// Parses a whole byte stream at once (for recorded bodies and tests).
pub fn parse_all(bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
    SseParser::default().push(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_split_everywhere(bytes: &[u8]) -> Vec<Vec<SseEvent>> {
        (0..=bytes.len())
            .map(|cut| {
                let mut p = SseParser::default();
                let mut events = p.push(&bytes[..cut]).unwrap();
                events.extend(p.push(&bytes[cut..]).unwrap());
                events
            })
            .collect()
    }

    #[test]
    fn events_with_names_data_comments_and_crlf() {
        let bytes = b": keep-alive\r\nevent: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\ndata: a\ndata:b\nid: 7\nretry: 10\n\n";
        assert_eq!(
            parse_all(bytes).unwrap(),
            vec![
                SseEvent::named("ping", "{\"type\":\"ping\"}"),
                SseEvent::data("a\nb")
            ]
        );
    }

    #[test]
    fn lone_cr_ends_lines_too() {
        assert_eq!(
            parse_all(b"data: x\r\rdata: y\r\n\r\n").unwrap(),
            vec![SseEvent::data("x"), SseEvent::data("y")]
        );
    }

    #[test]
    fn only_one_leading_space_is_stripped_and_field_without_colon_is_empty() {
        assert_eq!(
            parse_all(b"data:  two\ndata\n\n").unwrap(),
            vec![SseEvent::data(" two\n")]
        );
    }

    #[test]
    fn blank_lines_without_data_dispatch_nothing() {
        assert_eq!(parse_all(b"\n\n\nevent: x\n\n\n").unwrap(), vec![]);
    }

    #[test]
    fn unfinished_event_at_end_is_not_dispatched() {
        let mut p = SseParser::default();
        assert_eq!(p.push(b"data: {\"half").unwrap(), vec![]);
        assert!(p.pending_bytes() > 0);
    }

    #[test]
    fn split_at_every_byte_inside_utf8_and_crlf_gives_the_same_events() {
        let bytes =
            "event: d\r\ndata: {\"text\":\"héllo — 😀\"}\r\n\r\ndata: [DONE]\r\n\r\n".as_bytes();
        let want = vec![
            SseEvent::named("d", "{\"text\":\"héllo — 😀\"}"),
            SseEvent::data("[DONE]"),
        ];
        for (cut, got) in feed_split_everywhere(bytes).into_iter().enumerate() {
            assert_eq!(got, want, "split at byte {cut}");
        }
        // And one byte at a time.
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for b in bytes {
            got.extend(p.push(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(got, want);
    }

    #[test]
    fn leading_bom_is_dropped_even_when_split() {
        let mut bytes = BOM.to_vec();
        bytes.extend_from_slice(b"data: x\n\n");
        for got in feed_split_everywhere(&bytes) {
            assert_eq!(got, vec![SseEvent::data("x")]);
        }
        // A partial BOM is content, not swallowed.
        let got = parse_all(&[0xEF, b'd', b'\n', b'\n']);
        assert!(matches!(got, Err(SseError::Utf8 { .. })));
    }

    #[test]
    fn event_larger_than_the_bound_is_an_error() {
        let mut p = SseParser::new(16);
        assert_eq!(p.push(b"data: 0123456789\n").unwrap(), vec![]);
        assert_eq!(
            p.push(b"data: 0123456789\n"),
            Err(SseError::TooLarge {
                event_bytes_max: 16
            })
        );
        // A single unterminated line is bounded too.
        let mut p = SseParser::new(16);
        assert!(matches!(
            p.push(&[b'a'; 64]),
            Err(SseError::TooLarge { .. })
        ));
        // Many events each under the bound are fine.
        let mut p = SseParser::new(16);
        let events = p.push(&b"data: 0123456789\n\n".repeat(100)).unwrap();
        assert_eq!(events.len(), 100);
    }

    #[test]
    fn invalid_utf8_line_is_an_error() {
        assert_eq!(
            parse_all(b"data: \xff\n\n"),
            Err(SseError::Utf8 { valid_up_to: 6 })
        );
    }
}
