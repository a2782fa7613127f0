//! Read-ahead: a [`ChangelogSource`] run on its own thread, so reading,
//! CRC-checking and decoding the next chunks overlaps with applying the
//! current one. The chunks cross the thread as owned buffers (one arena per
//! chunk); at most `depth` of them wait, so memory stays bounded. Applied
//! chunks go back to the reader to be filled again: a fresh buffer per chunk
//! cost a page fault and the zeroing of every page it touched.

use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::thread::JoinHandle;

use crate::source::{ChangeRecord, ChangelogSource, LogError, RecordChunk, SkipCounts};

/// One chunk of decoded records, owned, with the source's state after it.
struct Chunk {
    records: RecordChunk,
    more: bool,
    position: i64,
    skipped: SkipCounts,
    bytes_read: u64,
}

type Msg = Result<Chunk, (LogError, i64)>;

/// A source read ahead by a background thread. It reads up to the `end`
/// given at [`ReadAhead::spawn`]; `next_chunk` ignores its own `end` and
/// `max_bytes` (callers pass the same ones anyway).
pub struct ReadAhead {
    rx: Option<Receiver<Msg>>,
    /// Applied chunks' buffers, back to the reader.
    spent: Sender<RecordChunk>,
    thread: Option<JoinHandle<()>>,
    position: i64,
    skipped: SkipCounts,
    bytes_read: u64,
    done: bool,
}

impl ReadAhead {
    pub fn spawn(mut source: Box<dyn ChangelogSource>, end: i64, chunk_bytes: usize, depth: usize) -> Self {
        let position = source.position();
        let (tx, rx) = sync_channel::<Msg>(depth.max(1));
        let (spent, reuse) = channel::<RecordChunk>();
        let thread = std::thread::Builder::new()
            .name("statestore-read-ahead".into())
            .spawn(move || loop {
                let records = match reuse.try_recv() {
                    Ok(mut r) => {
                        r.clear();
                        r
                    }
                    Err(_) => RecordChunk::with_capacity(chunk_bytes + chunk_bytes / 4),
                };
                let mut c = Chunk { records, more: false, position: 0, skipped: SkipCounts::default(), bytes_read: 0 };
                let r = source.next_chunk(end, chunk_bytes, &mut |r: ChangeRecord<'_>| c.records.push(r));
                let msg = match r {
                    Ok(more) => {
                        c.more = more;
                        c.position = source.position();
                        c.skipped = source.skipped();
                        c.bytes_read = source.bytes_read();
                        Ok(c)
                    }
                    Err(e) => Err((e, source.position())),
                };
                let stop = !matches!(msg, Ok(Chunk { more: true, .. }));
                if tx.send(msg).is_err() || stop {
                    return;
                }
            })
            .expect("spawning the read-ahead thread");
        Self {
            rx: Some(rx),
            spent,
            thread: Some(thread),
            position,
            skipped: SkipCounts::default(),
            bytes_read: 0,
            done: false,
        }
    }
}

impl ChangelogSource for ReadAhead {
    fn position(&self) -> i64 {
        self.position
    }

    fn next_chunk(
        &mut self,
        _end: i64,
        _max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError> {
        if self.done {
            return Ok(false);
        }
        let msg = self.rx.as_ref().expect("open until dropped").recv();
        let c = match msg {
            Ok(Ok(c)) => c,
            Ok(Err((e, pos))) => {
                self.done = true;
                self.position = pos;
                return Err(e);
            }
            Err(_) => {
                self.done = true;
                return Err(LogError::other("the read-ahead thread stopped unexpectedly"));
            }
        };
        c.records.iter().for_each(&mut *sink);
        let _ = self.spent.send(c.records); // the reader may have stopped: then it is dropped
        self.position = c.position;
        self.skipped = c.skipped;
        self.bytes_read = c.bytes_read;
        self.done = !c.more;
        Ok(c.more)
    }

    fn skipped(&self) -> SkipCounts {
        self.skipped
    }

    fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the channel makes the reader stop after its current chunk.
        drop(self.rx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::source::LogErrorKind;

    type Owned = Vec<(i64, Option<Vec<u8>>, Option<Vec<u8>>)>;

    fn collect(s: &mut dyn ChangelogSource, end: i64) -> Result<Owned, LogError> {
        let mut out = Vec::new();
        while s.next_chunk(end, 100, &mut |r| {
            out.push((r.offset, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec)))
        })? {}
        Ok(out)
    }

    #[test]
    fn yields_what_the_source_yields_with_its_counts() {
        let log = random_log(5000, 100, 13);
        let mut plain = VecSource::new(log.clone(), 10);
        let want = collect(&mut plain, 4000).unwrap();
        let mut p = ReadAhead::spawn(Box::new(VecSource::new(log, 10)), 4000, 100, 2);
        assert_eq!(collect(&mut p, 4000).unwrap(), want);
        assert_eq!(
            (p.position(), p.skipped(), p.bytes_read()),
            (plain.position(), plain.skipped(), plain.bytes_read())
        );
    }

    #[test]
    fn an_error_arrives_with_its_position_and_dropping_early_stops_the_reader() {
        let log = random_log(5000, 100, 13);
        let mut src = VecSource::new(log.clone(), 0);
        src.fail_at = Some(3000);
        let mut p = ReadAhead::spawn(Box::new(src), 5000, 100, 2);
        assert!(matches!(collect(&mut p, 5000), Err(LogError { kind: LogErrorKind::Corrupt, .. })));
        assert_eq!(p.position(), 3000);
        let mut p = ReadAhead::spawn(Box::new(VecSource::new(log, 0)), 5000, 100, 1);
        p.next_chunk(5000, 100, &mut |_| {}).unwrap();
        drop(p);
    }
}
