//! Progress reporting with Kafka's `StateRestoreListener` shape, throttled so
//! a listener is called at most once per interval and never per record, and
//! once more when the whole log is read, before the store is written.

use std::time::{Duration, Instant};

use super::{ErrorKind, RestoreError};

/// Receives the progress of one restore. An `Err` stops that restore cleanly:
/// the store keeps a committed state and the error is reported with the
/// listener's message.
pub trait Listener: Send {
    /// The restore of `[start_offset, end_offset)` begins.
    fn on_start(&mut self, start_offset: i64, end_offset: i64) -> Result<(), String>;
    /// Records up to `batch_end_offset` are applied (replay) or read (bulk);
    /// `num_restored` records since the previous call.
    fn on_batch(&mut self, batch_end_offset: i64, num_restored: u64) -> Result<(), String>;
    /// The restore finished with `total_restored` records applied.
    fn on_end(&mut self, total_restored: u64) -> Result<(), String>;
}

/// A [`Listener`] behind a clock: `batch` accumulates and calls the listener
/// only when `interval` has passed since the previous call.
pub struct Progress<'a> {
    listener: Option<&'a mut dyn Listener>,
    interval: Duration,
    last_call: Instant,
    pending: u64,
    total: u64,
    /// The offset of the listener's last `on_batch` (before the start until one).
    reported: i64,
    context: String,
    /// Told once when the restore has read all it restores ([`Progress::read_all`]).
    on_read_all: Option<&'a dyn Fn()>,
}

impl<'a> Progress<'a> {
    pub fn new(listener: Option<&'a mut dyn Listener>, interval: Duration) -> Self {
        Self {
            listener,
            interval,
            last_call: Instant::now(),
            pending: 0,
            total: 0,
            reported: i64::MIN,
            context: String::new(),
            on_read_all: None,
        }
    }

    /// Call `f` once the restore has read all it restores (what `restore_many`
    /// waits for before it starts fetching the next partition).
    pub fn set_on_read_all(&mut self, f: Option<&'a dyn Fn()>) {
        self.on_read_all = f;
    }

    /// The restore has read all it restores: what remains is writing (a bulk
    /// restore's sort, SST files and ingestion; replay's last flush).
    pub fn read_all(&mut self) {
        if let Some(f) = self.on_read_all.take() {
            f();
        }
    }

    /// The restore read the log up to `position` (the next offset), and
    /// what remains is writing: records the interval kept back are reported
    /// now, with the offset before `position`, so the listener has seen the
    /// whole log read before a step that reports nothing, which can take
    /// long (a bulk restore's sort, SST files and ingestion; a deferred
    /// replay's merge: 70 s of 115 s at 100M records). A restore that
    /// stopped on an error does not call it: what it read is not all applied.
    pub fn read_to(&mut self, position: i64) -> Result<(), RestoreError> {
        let last = position - 1;
        if self.listener.is_none() || (self.pending == 0 && self.reported >= last) {
            return Ok(());
        }
        self.report(last)
    }

    /// What error messages say the restore is about (store and partition).
    pub fn set_context(&mut self, context: String) {
        self.context = context;
    }

    fn fail(&self, what: &str, offset: Option<i64>, msg: String) -> RestoreError {
        let at = offset.map(|o| format!(" at offset {o}")).unwrap_or_default();
        let e = RestoreError::new(
            ErrorKind::Listener,
            format!(
                "restore listener raised in {what} while {}{at}: {msg}; the restore stopped and the \
                 store keeps a committed state with its offset, restore again to go on",
                self.context
            ),
        );
        match offset {
            Some(o) => e.with_offset(o),
            None => e,
        }
    }

    pub fn start(&mut self, start: i64, end: i64) -> Result<(), RestoreError> {
        self.last_call = Instant::now();
        self.reported = start - 1;
        match self.listener.as_deref_mut() {
            Some(l) => l.on_start(start, end).map_err(|m| self.fail("on_restore_start", Some(start), m)),
            None => Ok(()),
        }
    }

    /// `n` more records, the last at `offset`.
    pub fn batch(&mut self, offset: i64, n: u64) -> Result<(), RestoreError> {
        self.pending += n;
        self.total += n;
        if self.listener.is_none() || self.last_call.elapsed() < self.interval {
            return Ok(());
        }
        self.report(offset)
    }

    /// Tell the listener of the records kept back, the last at `offset`.
    fn report(&mut self, offset: i64) -> Result<(), RestoreError> {
        let pending = std::mem::take(&mut self.pending);
        self.last_call = Instant::now();
        self.reported = offset;
        let r = self.listener.as_deref_mut().map(|l| l.on_batch(offset, pending));
        match r {
            Some(Err(m)) => Err(self.fail("on_batch_restored", Some(offset), m)),
            _ => Ok(()),
        }
    }

    pub fn end(&mut self, total: u64) -> Result<(), RestoreError> {
        match self.listener.as_deref_mut() {
            Some(l) => l.on_end(total).map_err(|m| self.fail("on_restore_end", None, m)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Rec {
        batches: Vec<(i64, u64)>,
        fail_after: Option<usize>,
    }

    impl Listener for Rec {
        fn on_start(&mut self, _: i64, _: i64) -> Result<(), String> {
            Ok(())
        }
        fn on_batch(&mut self, off: i64, n: u64) -> Result<(), String> {
            self.batches.push((off, n));
            if self.fail_after.is_some_and(|f| self.batches.len() > f) {
                return Err("boom".into());
            }
            Ok(())
        }
        fn on_end(&mut self, _: u64) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn throttled_calls_are_fewer_than_batches() {
        let mut r = Rec::default();
        {
            let mut p = Progress::new(Some(&mut r), Duration::from_secs(3600));
            for i in 0..1000 {
                p.batch(i, 1).unwrap();
            }
        }
        assert!(r.batches.is_empty());
        let mut r = Rec::default();
        {
            let mut p = Progress::new(Some(&mut r), Duration::ZERO);
            for i in 0..10 {
                p.batch(i, 2).unwrap();
            }
        }
        assert_eq!(r.batches.len(), 10);
        assert_eq!(r.batches[9], (9, 2));
    }

    #[test]
    fn reading_to_the_end_reports_what_the_interval_kept_back_once() {
        let mut r = Rec::default();
        {
            let mut p = Progress::new(Some(&mut r), Duration::from_secs(3600));
            p.start(10, 20).unwrap();
            for i in 10..17 {
                p.batch(i, 1).unwrap();
            }
            p.read_to(20).unwrap(); // 17-19 held no record (transaction markers)
            p.read_to(20).unwrap();
        }
        assert_eq!(r.batches, [(19, 7)]);
        // every record reported already, and the last offset with them: no call
        let mut r = Rec::default();
        {
            let mut p = Progress::new(Some(&mut r), Duration::ZERO);
            p.start(0, 5).unwrap();
            for i in 0..5 {
                p.batch(i, 1).unwrap();
            }
            p.read_to(5).unwrap();
        }
        assert_eq!(r.batches.len(), 5);
        assert_eq!(r.batches[4], (4, 1));
    }

    #[test]
    fn listener_error_names_the_context() {
        let mut r = Rec { fail_after: Some(0), ..Rec::default() };
        let mut p = Progress::new(Some(&mut r), Duration::ZERO);
        p.set_context("restoring store /x from t-1".into());
        let e = p.batch(5, 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Listener);
        assert!(e.message.contains("/x") && e.message.contains("t-1") && e.message.contains("boom"), "{e}");
    }
}
