//! A [`ChangelogSource`] over a *feed*: something that hands out records a
//! chunk at a time, already decoded and filtered by someone else -- a Kafka
//! client's read_committed consumer, reached through Python (see
//! `py::feed`). The restore engine then applies a Kafka topic exactly as it
//! applies the segment log: same replay and bulk modes, same offsets, same
//! listener.
//!
//! The feed reports its own position after every pull. A Kafka consumer's
//! position steps over transaction markers (and, on a broker that filters
//! them, aborted records), so completion is `position >= end`, never "a
//! record at `end - 1` arrived". A record at or beyond `end` proves that
//! everything below `end` was consumed; it is dropped, not applied.

use std::time::{Duration, Instant};

use crate::source::{ChangeRecord, ChangelogSource, LogError, LogErrorKind, RecordChunk, SkipCounts};

/// Most records asked of a feed per pull.
pub const MAX_PULL_RECORDS: usize = 10_000;

/// What one pull handed over: records in offset order, and where the feed is.
#[derive(Debug, Default)]
pub struct FeedChunk {
    pub records: RecordChunk,
    /// The feed's position after the pull (next offset it would hand out);
    /// `None` when it does not know (a consumer that has not fetched yet).
    pub position: Option<i64>,
    /// The feed reached the end of what the log holds now.
    pub at_end: bool,
}

impl FeedChunk {
    pub fn clear(&mut self) {
        self.records.clear();
        self.position = None;
        self.at_end = false;
    }

    /// Append one record (copies key and value).
    pub fn push(&mut self, offset: i64, timestamp: i64, key: Option<&[u8]>, value: Option<&[u8]>) {
        self.records.push(ChangeRecord::new(offset, timestamp, key, value));
    }

    /// Append one record with its headers (copies them all).
    pub fn push_with_headers<'h>(
        &mut self,
        offset: i64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
    ) {
        self.records.push_with_headers(ChangeRecord::new(offset, timestamp, key, value), headers);
    }
}

/// Something that hands out the committed records of one partition, a chunk per pull.
pub trait ChunkFeed: Send {
    /// Fill `chunk` (cleared by the caller) with at most `max_records` next
    /// records. May block for a short while when nothing is available; an
    /// empty chunk without `at_end` means "nothing yet, ask again".
    fn pull(&mut self, max_records: usize, chunk: &mut FeedChunk) -> Result<(), LogError>;
}

/// A [`ChangelogSource`] over a [`ChunkFeed`] positioned at `start`.
pub struct FeedSource<F: ChunkFeed> {
    feed: F,
    position: i64,
    chunk: FeedChunk,
    bytes_read: u64,
    /// Longest time without progress before giving up.
    stall_timeout: Duration,
    /// Most records asked per pull.
    pull_records: usize,
}

impl<F: ChunkFeed> FeedSource<F> {
    pub fn new(feed: F, start: i64, stall_timeout: Duration) -> Self {
        Self {
            feed,
            position: start,
            chunk: FeedChunk::default(),
            bytes_read: 0,
            stall_timeout,
            pull_records: MAX_PULL_RECORDS,
        }
    }

    /// Ask at most `n` records per pull (tests).
    pub fn with_pull_records(mut self, n: usize) -> Self {
        self.pull_records = n.max(1);
        self
    }
}

impl<F: ChunkFeed> ChangelogSource for FeedSource<F> {
    fn position(&self) -> i64 {
        self.position
    }

    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError> {
        let mut bytes = 0usize;
        let mut deadline = Instant::now() + self.stall_timeout;
        while self.position < end {
            // Never ask for more records than offsets remain (plus one, so that a
            // record past the end or the end-of-partition event fills the pull).
            let left = usize::try_from(end - self.position).unwrap_or(usize::MAX);
            let want = left.saturating_add(1).min(self.pull_records);
            self.chunk.clear();
            self.feed.pull(want, &mut self.chunk)?;
            let before = self.position;
            let mut applied = 0usize;
            for r in self.chunk.records.iter() {
                if r.offset < self.position {
                    continue; // already applied (a feed re-delivering after a seek)
                }
                if r.offset >= end {
                    // Everything below `end` was consumed.
                    self.position = self.position.max(end);
                    break;
                }
                let n = r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len);
                bytes += n;
                self.bytes_read += n as u64;
                applied += 1;
                sink(r);
                self.position = r.offset + 1;
            }
            if let Some(p) = self.chunk.position {
                // The consumer's position steps over markers; it may be past `end`
                // when it fetched beyond it (those records were dropped above).
                self.position = self.position.max(p.min(end));
            }
            if self.position >= end {
                return Ok(false);
            }
            if self.position > before {
                deadline = Instant::now() + self.stall_timeout;
                // Fill the chunk up to `max_bytes`, but never wait for more once a
                // pull came back short (the feed had no more at hand).
                if applied > 0 && (bytes >= max_bytes || self.chunk.records.len() < want) {
                    return Ok(true);
                }
            } else if self.chunk.at_end {
                // Nothing more below `end` now: the caller sees position < end.
                return Ok(false);
            } else if Instant::now() >= deadline {
                // The feed never failed, it only brought nothing: a cluster that does not answer.
                return Err(LogError::new(
                    LogErrorKind::Unavailable,
                    format!(
                        "no record arrived for {:.1} s at offset {} (reading up to {end}); is the broker reachable?",
                        self.stall_timeout.as_secs_f64(),
                        self.position
                    ),
                ));
            }
        }
        Ok(false)
    }

    fn skipped(&self) -> SkipCounts {
        // A Kafka client never hands out control records or (on a broker that
        // filters them) aborted records, so it cannot count them.
        SkipCounts::default()
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A feed over a vector of `(offset, key, value)` with markers as gaps,
    /// reporting `position` like a consumer: after the last record handed
    /// out, or the log end once everything was handed out.
    struct VecFeed {
        recs: Vec<(i64, Vec<u8>, Option<Vec<u8>>)>,
        end: i64,
        next: usize,
    }

    impl ChunkFeed for VecFeed {
        fn pull(&mut self, max_records: usize, chunk: &mut FeedChunk) -> Result<(), LogError> {
            for (o, k, v) in self.recs.iter().skip(self.next).take(max_records) {
                chunk.push(*o, *o * 10, Some(k), v.as_deref());
                self.next += 1;
            }
            if self.next == self.recs.len() {
                chunk.at_end = true;
                chunk.position = Some(self.end);
            } else {
                chunk.position = chunk.records.records.last().map(|r| r.offset + 1);
            }
            Ok(())
        }
    }

    fn feed() -> VecFeed {
        // offsets 0..5 data, 5 a marker, 6..9 data, 9 a marker: log end 10
        let mut recs = Vec::new();
        for o in (0..5).chain(6..9) {
            recs.push((o, format!("k{o}").into_bytes(), if o == 7 { None } else { Some(vec![o as u8]) }));
        }
        VecFeed { recs, end: 10, next: 0 }
    }

    fn drain(src: &mut dyn ChangelogSource, end: i64) -> Vec<i64> {
        let mut out = Vec::new();
        while src.next_chunk(end, 1, &mut |r| out.push(r.offset)).unwrap() {}
        out
    }

    #[test]
    fn steps_over_a_final_marker_and_completes() {
        let mut src = FeedSource::new(feed(), 0, Duration::from_secs(1)).with_pull_records(3);
        assert_eq!(drain(&mut src, 10), vec![0, 1, 2, 3, 4, 6, 7, 8]);
        assert_eq!(src.position(), 10);
    }

    #[test]
    fn stops_at_end_and_drops_records_beyond_it() {
        let mut src = FeedSource::new(feed(), 0, Duration::from_secs(1));
        assert_eq!(drain(&mut src, 6), vec![0, 1, 2, 3, 4]);
        assert!(src.position() >= 6);
    }

    #[test]
    fn end_beyond_the_log_leaves_position_short() {
        let mut src = FeedSource::new(feed(), 0, Duration::from_secs(1));
        assert_eq!(drain(&mut src, 12).len(), 8);
        assert_eq!(src.position(), 10, "the engine reports the log ended before the end offset");
    }

    struct Silent;
    impl ChunkFeed for Silent {
        fn pull(&mut self, _: usize, _: &mut FeedChunk) -> Result<(), LogError> {
            Ok(())
        }
    }

    #[test]
    fn a_silent_feed_times_out_naming_the_offset() {
        let mut src = FeedSource::new(Silent, 4, Duration::from_millis(20));
        let e = src.next_chunk(10, 1 << 20, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("offset 4"), "{e}");
        // No answer, not a refusal: an application waits it out within its task_timeout.
        assert_eq!(e.kind, LogErrorKind::Unavailable);
    }
}
