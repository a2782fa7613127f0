//! The compression codecs a RecordBatch may use (attributes bits 0-2).
//!
//! Kafka compresses the whole records section of a batch. The framings are
//! Kafka's: gzip is a gzip member stream, snappy is xerial's block framing
//! (raw snappy is accepted too, as Kafka's own reader does), lz4 is the LZ4
//! frame format and zstd is one or more zstd frames. All decoders are pure
//! Rust. Output is bounded by [`MAX_DECOMPRESSED`] so a hostile batch cannot
//! make the reader allocate without limit.

use std::io::{Read, Write};

/// Upper bound of a decompressed records section (a batch bomb guard).
pub const MAX_DECOMPRESSED: usize = 256 << 20;

/// Compression codec of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Compression {
    /// The codec for attributes bits 0-2, or `None` for the unused values 5-7.
    pub fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Self::None,
            1 => Self::Gzip,
            2 => Self::Snappy,
            3 => Self::Lz4,
            4 => Self::Zstd,
            _ => return None,
        })
    }

    /// Kafka's name for the codec (as in `compression.type`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }

    /// Parse Kafka's codec name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "none" => Self::None,
            "gzip" => Self::Gzip,
            "snappy" => Self::Snappy,
            "lz4" => Self::Lz4,
            "zstd" => Self::Zstd,
            _ => return None,
        })
    }
}

/// Name of a codec id, including the invalid ones (for messages).
pub fn codec_name(id: u8) -> String {
    match Compression::from_id(id) {
        Some(c) => c.name().to_string(),
        None => format!("unknown codec {id}"),
    }
}

const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
const XERIAL_BLOCK: usize = 32 * 1024;

/// Read all of `r` into `out`, refusing output beyond [`MAX_DECOMPRESSED`].
/// The buffer grows by doubling but never past the bound (`read_to_end`
/// would double a 256 MiB buffer to 512 MiB just to find out it is full).
fn read_bounded(mut r: impl Read, out: &mut Vec<u8>) -> Result<(), String> {
    let mut chunk = [0u8; 32 * 1024];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        };
        if out.len() + n > MAX_DECOMPRESSED {
            return Err(format!("decompressed records exceed {MAX_DECOMPRESSED} bytes"));
        }
        if out.capacity() < out.len() + n {
            let want = (out.capacity() * 2).max(out.len() + n).min(MAX_DECOMPRESSED);
            out.reserve_exact(want - out.len());
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

fn snappy_raw_into(block: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let n = snap::raw::decompress_len(block).map_err(|e| e.to_string())?;
    // A snappy element of k bytes produces at most 64 bytes (ratio < 22), so a
    // claimed length beyond 32x the input is a lie: refuse before allocating.
    if n > block.len().saturating_mul(32) + 32 || out.len() + n > MAX_DECOMPRESSED {
        return Err(format!("snappy block claims {n} bytes from {} compressed bytes", block.len()));
    }
    let start = out.len();
    out.resize(start + n, 0);
    let written = snap::raw::Decoder::new().decompress(block, &mut out[start..]).map_err(|e| e.to_string())?;
    out.truncate(start + written);
    Ok(())
}

fn snappy_into(data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    if data.len() < XERIAL_HEADER_LEN || data[..8] != XERIAL_MAGIC {
        return snappy_raw_into(data, out);
    }
    let mut pos = XERIAL_HEADER_LEN;
    while pos < data.len() {
        let Some(len_bytes) = data.get(pos..pos + 4) else {
            return Err(format!("xerial snappy: truncated block length at {pos}"));
        };
        let len = u32::from_be_bytes(len_bytes.try_into().unwrap()) as usize;
        pos += 4;
        let Some(block) = data.get(pos..pos.saturating_add(len)) else {
            return Err(format!(
                "xerial snappy: block of {len} bytes at {pos} runs past the {} bytes present",
                data.len()
            ));
        };
        snappy_raw_into(block, out)?;
        pos += len;
    }
    Ok(())
}

fn zstd_into(data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut rest = data;
    while !rest.is_empty() {
        let mut dec = ruzstd::decoding::StreamingDecoder::new(&mut rest).map_err(|e| format!("zstd: {e}"))?;
        read_bounded(&mut dec, out).map_err(|e| format!("zstd: {e}"))?;
    }
    Ok(())
}

/// Decompress `data` (the records section of a batch) with `codec`,
/// appending to `out`. Errors are plain descriptions; the caller adds the
/// file, position and offset.
pub fn decompress(codec: Compression, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    match codec {
        Compression::None => {
            out.extend_from_slice(data);
            Ok(())
        }
        Compression::Gzip => {
            read_bounded(flate2::read::MultiGzDecoder::new(data), out).map_err(|e| format!("gzip: {e}"))
        }
        Compression::Snappy => snappy_into(data, out),
        Compression::Lz4 => {
            read_bounded(lz4_flex::frame::FrameDecoder::new(data), out).map_err(|e| format!("lz4: {e}"))
        }
        Compression::Zstd => zstd_into(data, out),
    }
}

/// Compress `data` with `codec` in Kafka's framing.
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    match codec {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(data).expect("writing to a Vec cannot fail");
            enc.finish().expect("writing to a Vec cannot fail")
        }
        Compression::Snappy => {
            let mut out = Vec::with_capacity(data.len() / 2 + 64);
            out.extend_from_slice(&XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            for chunk in data.chunks(XERIAL_BLOCK) {
                let block = enc.compress_vec(chunk).expect("snappy compresses any input");
                out.extend_from_slice(&(block.len() as u32).to_be_bytes());
                out.extend_from_slice(&block);
            }
            out
        }
        Compression::Lz4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
            enc.write_all(data).expect("writing to a Vec cannot fail");
            enc.finish().expect("writing to a Vec cannot fail")
        }
        Compression::Zstd => ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips() {
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        for codec in [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let c = compress(codec, &data);
            let mut out = vec![7u8];
            decompress(codec, &c, &mut out).unwrap();
            assert_eq!(&out[1..], &data[..], "{}", codec.name());
        }
    }

    #[test]
    fn raw_snappy_is_accepted() {
        let c = snap::raw::Encoder::new().compress_vec(b"hello hello hello").unwrap();
        let mut out = Vec::new();
        decompress(Compression::Snappy, &c, &mut out).unwrap();
        assert_eq!(out, b"hello hello hello");
    }

    #[test]
    fn lying_snappy_length_does_not_allocate() {
        // varint length 0xffffffff followed by nothing
        let mut out = Vec::new();
        let err = decompress(Compression::Snappy, &[0xff, 0xff, 0xff, 0xff, 0x0f], &mut out).unwrap_err();
        assert!(err.contains("claims"), "{err}");
        assert!(out.capacity() < 1024);
    }

    #[test]
    fn a_decompression_bomb_stops_at_the_bound_without_a_larger_buffer() {
        // zeros compress ~1000:1 in gzip: a few hundred KiB claim more than the bound
        let zeros = vec![0u8; 1 << 20];
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for _ in 0..(MAX_DECOMPRESSED >> 20) + 1 {
            enc.write_all(&zeros).unwrap();
        }
        let bomb = enc.finish().unwrap();
        assert!(bomb.len() < MAX_DECOMPRESSED / 500, "{}", bomb.len());
        let mut out = Vec::new();
        let err = decompress(Compression::Gzip, &bomb, &mut out).unwrap_err();
        assert!(err.contains("exceed"), "{err}");
        assert!(out.capacity() <= MAX_DECOMPRESSED, "buffer grew to {}", out.capacity());
    }

    #[test]
    fn garbage_is_an_error_for_every_codec() {
        for codec in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let mut out = Vec::new();
            assert!(
                decompress(codec, b"\x01\x02\x03 definitely not compressed", &mut out).is_err(),
                "{}",
                codec.name()
            );
        }
    }
}
