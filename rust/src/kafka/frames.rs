//! Buffers for large response frames, reused from one response to the next.
//!
//! A fetch response of several MiB read into fresh memory costs the fetch
//! thread a page fault per page and the zeroing of every byte before the
//! socket's bytes are copied in: a quarter of that thread's time, on a core
//! it shares with the broker. A [`FramePool`] hands out buffers that earlier
//! responses used (already mapped, already initialised): a frame is a
//! `Bytes` that owns its buffer, and the buffer goes back to the pool when
//! the frame's last slice is dropped, wherever that happens (usually on the
//! restore thread, once the records were used).
//!
//! The pool keeps at most [`POOLED_FRAMES`] buffers, and only while some
//! fetcher is active ([`FramePool::activate`]): once the last one stops, the
//! memory goes back to the allocator.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

/// Frames smaller than this are read into memory of their own (metadata,
/// offsets, small fetches): pooling pays for multi-MiB buffers only.
pub const POOLED_FROM_BYTES: usize = 256 << 10;

/// Buffers the pool keeps: a fetcher holds about three frames at a time (one
/// being decoded, one waiting, one being received); two restores side by
/// side return about four at any moment.
pub const POOLED_FRAMES: usize = 4;

/// New buffers are rounded up to a multiple of this, so that one made for a
/// response also fits the slightly larger ones after it.
const ROUND_BYTES: usize = 1 << 20;

#[derive(Default)]
struct Pool {
    buffers: Vec<Vec<u8>>,
    /// Fetchers active; the pool keeps buffers only while some are.
    active: usize,
}

/// Reusable buffers for large response frames, shared by a client's
/// connections (see the module documentation).
#[derive(Clone, Default)]
pub struct FramePool(Arc<Mutex<Pool>>);

impl FramePool {
    fn lock(&self) -> MutexGuard<'_, Pool> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `n` initialised bytes: a pooled one when one is
    /// large enough, else a new one (zeroed by the kernel as it maps it, not
    /// byte by byte).
    fn take(&self, n: usize) -> Vec<u8> {
        let mut p = self.lock();
        if let Some(i) = p.buffers.iter().position(|b| b.len() >= n) {
            return p.buffers.swap_remove(i);
        }
        drop(p);
        vec![0u8; n.div_ceil(ROUND_BYTES) * ROUND_BYTES]
    }

    /// Take `buf` back for a later frame (when a fetcher is active and the
    /// pool is not full; a full pool keeps its largest buffers).
    fn give(&self, buf: Vec<u8>) {
        let mut p = self.lock();
        if p.active == 0 {
            return;
        }
        if p.buffers.len() < POOLED_FRAMES {
            p.buffers.push(buf);
        } else if let Some(smallest) = p.buffers.iter_mut().min_by_key(|b| b.len()).filter(|b| b.len() < buf.len()) {
            *smallest = buf;
        }
    }

    /// Buffers kept now (for tests).
    pub fn pooled(&self) -> usize {
        self.lock().buffers.len()
    }

    /// Mark a fetcher active until the returned lease is dropped: the pool
    /// keeps buffers only while some fetcher is.
    pub fn activate(&self) -> FrameLease {
        self.lock().active += 1;
        FrameLease(self.clone())
    }

    /// Read a frame of `n` bytes with `read` (which must fill the slice it is
    /// given): into a pooled buffer when the frame is large, else into one of
    /// its own. A failed read gives the buffer back.
    pub fn read<E>(&self, n: usize, read: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<Bytes, E> {
        if n < POOLED_FROM_BYTES {
            let mut buf = vec![0u8; n];
            read(&mut buf)?;
            return Ok(Bytes::from(buf));
        }
        let mut buf = self.take(n);
        match read(&mut buf[..n]) {
            Ok(()) => Ok(Bytes::from_owner(Frame { buf, len: n, pool: self.clone() })),
            Err(e) => {
                self.give(buf);
                Err(e)
            }
        }
    }
}

/// A fetcher's claim on a [`FramePool`]: while any is held, the pool keeps
/// the buffers given back; when the last is dropped, it frees them.
pub struct FrameLease(FramePool);

impl Drop for FrameLease {
    fn drop(&mut self) {
        let mut p = self.0.lock();
        p.active -= 1;
        if p.active == 0 {
            p.buffers = Vec::new();
        }
    }
}

/// The owner of a pooled frame's bytes: gives its buffer back when dropped.
struct Frame {
    buf: Vec<u8>,
    len: usize,
    pool: FramePool,
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(byte: u8) -> impl FnOnce(&mut [u8]) -> Result<(), ()> {
        move |b: &mut [u8]| {
            b.fill(byte);
            Ok(())
        }
    }

    #[test]
    fn a_large_frame_s_buffer_comes_back_when_its_last_slice_is_dropped() {
        let pool = FramePool::default();
        let _lease = pool.activate();
        let n = POOLED_FROM_BYTES * 2;
        let frame = pool.read(n, fill(7)).unwrap();
        let part = frame.slice(10..20);
        drop(frame);
        assert_eq!(pool.pooled(), 0, "a slice still holds the buffer");
        assert_eq!(&part[..], &[7u8; 10]);
        let ptr = part.as_ptr() as usize - 10;
        drop(part);
        assert_eq!(pool.pooled(), 1);
        // The next frame reuses that buffer; its bytes are what was read, not what was there.
        let again = pool.read(n - 5, fill(9)).unwrap();
        assert_eq!(again.as_ptr() as usize, ptr);
        assert_eq!(again.len(), n - 5);
        assert!(again.iter().all(|&b| b == 9));
    }

    #[test]
    fn small_frames_are_not_pooled_and_a_failed_read_gives_the_buffer_back() {
        let pool = FramePool::default();
        let _lease = pool.activate();
        drop(pool.read(100, fill(1)).unwrap());
        assert_eq!(pool.pooled(), 0);
        let failed: Result<Bytes, &str> = pool.read(POOLED_FROM_BYTES, |_| Err("broken"));
        assert_eq!(failed.unwrap_err(), "broken");
        assert_eq!(pool.pooled(), 1);
    }

    #[test]
    fn the_pool_keeps_its_largest_buffers_and_frees_them_with_the_last_lease() {
        let pool = FramePool::default();
        let lease = pool.activate();
        let sizes = [1usize, 2, 3, 4, 5, 6].map(|m| m * ROUND_BYTES);
        let frames: Vec<Bytes> = sizes.iter().map(|&n| pool.read(n, fill(0)).unwrap()).collect();
        drop(frames);
        assert_eq!(pool.pooled(), POOLED_FRAMES);
        let kept: Vec<usize> = pool.lock().buffers.iter().map(Vec::len).collect();
        assert!(kept.iter().all(|&l| l >= 3 * ROUND_BYTES), "{kept:?}");
        let second = pool.activate();
        drop(lease);
        assert_eq!(pool.pooled(), POOLED_FRAMES, "another fetcher is still active");
        let late = pool.read(ROUND_BYTES, fill(0)).unwrap();
        drop(second);
        assert_eq!(pool.pooled(), 0);
        drop(late); // given back after the last lease: freed, not kept
        assert_eq!(pool.pooled(), 0);
    }
}
