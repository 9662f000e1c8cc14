//! Compressed runs: the sort's intermediate files as a sequence of
//! frames, each a block of whole records compressed on its own.
//!
//! ```text
//!  run file   ┌────────┬──────────────┬────────┬──────────────┬───
//!             │ header │ payload      │ header │ payload      │ ...
//!             └────────┴──────────────┴────────┴──────────────┴───
//!  header     payload bytes (u32 LE) · raw bytes (u32 LE)
//! ```
//!
//! A frame whose payload is as long as its raw bytes is stored as it is:
//! a codec's output is kept only when it is shorter, so records the codec
//! cannot shrink cost a header per frame and no decompression, and one run
//! may mix stored and compressed frames.
//!
//! Runs are written once and read once, so every byte kept off the
//! storage is a byte neither written nor read: on storage that writes
//! slower than the cores compress, a codec shortens the sort phase. The
//! planner ([`crate::model`]) measures each codec on a sample of the
//! input and picks the one with the least predicted time (often none).
//! OUT is never compressed.
//!
//! On two cores a codec runs out of CPU before the storage runs out of
//! bandwidth. The 8 GB sort (`--mem 2048MiB`, `--run-codec lz4`, page cache
//! dropped) spent 12.47 s of a 14.56 s sort phase in its run writer,
//! gathering and compressing, where plain runs' sort phase took
//! 8.61-10.66 s (`bench/extsort.sh 80000000 2048 3`). A codec that stores
//! each record position's bytes as bit-packed ranks in that position's
//! alphabet (the distinct bytes a frame holds there) shrank ASCII
//! TeraSort records 2.69-2.73x, as much as LZ4, but packed at 0.2-0.9
//! GB/s and unpacked at 0.4-0.8 GB/s per thread in scalar code, slower to
//! unpack than LZ4 and not fast enough to pack to pay; it was not kept.
//!
//! The sort keeps each run's frame lengths in memory, so a reader knows
//! every frame's place before it reads; the headers in the file are
//! checked against them.

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use insitu_kernels::gather_rows_into;

use crate::direct::AlignedBuf;
use crate::{ExtsortError, Result};

/// How runs are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunCodec {
    /// Records as they are.
    #[default]
    None,
    /// LZ4 block format (`lz4_flex`): the better ratio of the two.
    Lz4,
    /// Snappy raw format (`snap`): the faster compressor of the two.
    Snappy,
}

/// Which codecs `--run-codec` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodecChoice {
    /// The planner picks the codec with the least predicted time.
    #[default]
    Auto,
    Only(RunCodec),
}

impl RunCodec {
    pub const ALL: [RunCodec; 3] = [RunCodec::None, RunCodec::Lz4, RunCodec::Snappy];

    pub fn name(self) -> &'static str {
        match self {
            RunCodec::None => "none",
            RunCodec::Lz4 => "lz4",
            RunCodec::Snappy => "snappy",
        }
    }
}

impl fmt::Display for RunCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CodecChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "auto" {
            return Ok(CodecChoice::Auto);
        }
        RunCodec::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .map(CodecChoice::Only)
            .ok_or_else(|| format!("unknown run codec '{s}': expected auto, none, lz4 or snappy"))
    }
}

impl fmt::Display for CodecChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecChoice::Auto => f.write_str("auto"),
            CodecChoice::Only(c) => c.fmt(f),
        }
    }
}

impl CodecChoice {
    pub fn allows(self, codec: RunCodec) -> bool {
        match self {
            CodecChoice::Auto => true,
            CodecChoice::Only(c) => c == codec,
        }
    }
}

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 8;

/// Most bytes a frame of `raw` record bytes takes on disk, header
/// included, whatever the codec (incompressible data grows a little).
pub fn frame_bytes_max(raw: usize) -> usize {
    let lz4 = lz4_flex::block::get_maximum_output_size(raw);
    let snappy = snap::raw::max_compress_len(raw);
    FRAME_HEADER_BYTES + lz4.max(snappy)
}

/// Most bytes `raw` record bytes take as frames of at most `frame` raw
/// bytes each.
pub fn stored_bytes_max(raw: usize, frame: usize) -> usize {
    raw.div_ceil(frame.max(1)) * frame_bytes_max(frame)
}

/// Compresses `raw` into one frame at the start of `out` (at least
/// [`frame_bytes_max`]`(raw.len())` bytes); returns the frame's length.
/// The frame is stored (its payload is `raw` itself) when `codec` is
/// [`RunCodec::None`] or its output would not be shorter than `raw`.
pub fn compress_frame(codec: RunCodec, raw: &[u8], out: &mut [u8]) -> usize {
    assert!(
        out.len() >= frame_bytes_max(raw.len()),
        "room for the bound"
    );
    let (header, body) = out.split_at_mut(FRAME_HEADER_BYTES);
    let compressed = match codec {
        RunCodec::Lz4 => lz4_flex::block::compress_into(raw, body).expect("room for the bound"),
        RunCodec::Snappy => snap::raw::Encoder::new()
            .compress(raw, body)
            .expect("room for the bound"),
        RunCodec::None => raw.len(),
    };
    let payload = if compressed < raw.len() {
        compressed
    } else {
        body[..raw.len()].copy_from_slice(raw);
        raw.len()
    };
    header[..4].copy_from_slice(&(payload as u32).to_le_bytes());
    header[4..].copy_from_slice(&(raw.len() as u32).to_le_bytes());
    FRAME_HEADER_BYTES + payload
}

/// Decompresses the frame `stored` into the start of `out`; returns the
/// raw length. A header that disagrees with the frame's length, a raw
/// length over `out`'s, or a payload that does not decode is an error
/// naming `path` and the frame's byte offset `at`.
pub fn decompress_frame(
    codec: RunCodec,
    stored: &[u8],
    out: &mut [u8],
    path: &str,
    at: u64,
) -> Result<usize> {
    let corrupt = |why: String| ExtsortError::Input {
        path: path.to_string(),
        message: format!("corrupt {codec} frame at byte {at}: {why}"),
    };
    if stored.len() < FRAME_HEADER_BYTES {
        return Err(corrupt(format!(
            "{} bytes, shorter than its header",
            stored.len()
        )));
    }
    let word =
        |i: usize| u32::from_le_bytes(stored[i..i + 4].try_into().expect("4 bytes")) as usize;
    let (payload, raw) = (word(0), word(4));
    if FRAME_HEADER_BYTES + payload != stored.len() {
        return Err(corrupt(format!(
            "header says {payload} payload bytes, the run's index {}",
            stored.len() - FRAME_HEADER_BYTES
        )));
    }
    if raw > out.len() {
        return Err(corrupt(format!(
            "{raw} raw bytes, more than a frame's {}",
            out.len()
        )));
    }
    let body = &stored[FRAME_HEADER_BYTES..];
    if payload == raw {
        out[..raw].copy_from_slice(body);
        return Ok(raw);
    }
    let got = match codec {
        RunCodec::Lz4 => lz4_flex::block::decompress_into(body, &mut out[..raw])
            .map_err(|e| corrupt(e.to_string()))?,
        RunCodec::Snappy => snap::raw::Decoder::new()
            .decompress(body, &mut out[..raw])
            .map_err(|e| corrupt(e.to_string()))?,
        RunCodec::None => return Err(corrupt("the run is not compressed".into())),
    };
    if got != raw {
        return Err(corrupt(format!("decoded {got} bytes, header says {raw}")));
    }
    Ok(raw)
}

/// Compresses `raw` as frames of at most `shape.frame` bytes onto `out`,
/// on up to `shape.threads` threads; appends each frame's stored length
/// to `lens`. `out` needs spare capacity of
/// [`stored_bytes_max`]`(raw.len(), shape.frame)`: it does not grow.
pub fn compress_frames(raw: &[u8], shape: FrameShape, out: &mut AlignedBuf, lens: &mut Vec<u32>) {
    let mut no_scratch = vec![];
    compress_frames_from(FrameSource::Raw(raw), shape, &mut no_scratch, out, lens);
}

/// Where a frame's records come from.
#[derive(Clone, Copy)]
pub enum FrameSource<'a> {
    /// Laid out in order.
    Raw(&'a [u8]),
    /// The records of `chunk` that `order` names, in that order: each
    /// thread gathers a frame into its scratch buffer and compresses it
    /// while it is still in cache, with no block-sized copy between.
    Gather { chunk: &'a [u8], order: &'a [u32] },
}

/// How frames are cut and compressed: by a codec, into frames of at most
/// `frame` raw bytes of `record`-byte records, on `threads` threads.
#[derive(Debug, Clone, Copy)]
pub struct FrameShape {
    pub codec: RunCodec,
    /// Raw bytes per frame at most: whole records.
    pub frame: usize,
    pub record: usize,
    pub threads: usize,
}

impl FrameSource<'_> {
    fn raw_len(&self, record: usize) -> usize {
        match self {
            FrameSource::Raw(raw) => raw.len(),
            FrameSource::Gather { order, .. } => order.len() * record,
        }
    }

    /// Frame `i`'s raw bytes: borrowed, or gathered into `scratch`.
    fn frame<'s>(&self, i: usize, shape: FrameShape, scratch: &'s mut Vec<u8>) -> &'s [u8]
    where
        Self: 's,
    {
        match *self {
            FrameSource::Raw(raw) => {
                let end = ((i + 1) * shape.frame).min(raw.len());
                &raw[i * shape.frame..end]
            }
            FrameSource::Gather { chunk, order } => {
                let per_frame = shape.frame / shape.record;
                let end = ((i + 1) * per_frame).min(order.len());
                let picked = &order[i * per_frame..end];
                scratch.clear();
                scratch.resize(picked.len() * shape.record, 0);
                gather_rows_into(chunk, shape.record, picked, scratch);
                scratch
            }
        }
    }
}

/// Compresses the records of `source` as frames onto `out` (see
/// [`compress_frames`]), on up to `shape.threads` threads. A gathering
/// source uses one buffer of `scratch` per thread (kept for the next
/// call, at most one frame each).
pub fn compress_frames_from(
    source: FrameSource<'_>,
    shape: FrameShape,
    scratch: &mut Vec<Vec<u8>>,
    out: &mut AlignedBuf,
    lens: &mut Vec<u32>,
) {
    let FrameShape { frame, record, .. } = shape;
    assert!(
        frame > 0 && frame.is_multiple_of(record),
        "frames of whole records"
    );
    let raw_len = source.raw_len(record);
    let start = out.len();
    let slot = frame_bytes_max(frame);
    let frames = raw_len.div_ceil(frame);
    assert!(
        out.capacity() - start >= frames * slot,
        "the caller sized the buffer"
    );
    out.resize_for_overwrite(start + frames * slot);
    let mut written = vec![0usize; frames];
    let parts = shape.threads.clamp(1, frames.max(1));
    let per_part = frames.div_ceil(parts).max(1);
    if scratch.len() < parts {
        scratch.resize_with(parts, Vec::new);
    }
    let compress_part = |first: usize, slots: &mut [u8], sizes: &mut [usize], buf: &mut Vec<u8>| {
        for (k, (dst, n)) in slots.chunks_mut(slot).zip(sizes.iter_mut()).enumerate() {
            let raw = source.frame(first + k, shape, buf);
            *n = compress_frame(shape.codec, raw, dst);
        }
    };
    let work = out[start..]
        .chunks_mut(per_part * slot)
        .zip(written.chunks_mut(per_part))
        .zip(scratch.iter_mut())
        .enumerate();
    if parts < 2 {
        for (p, ((slots, sizes), buf)) in work {
            compress_part(p * per_part, slots, sizes, buf);
        }
    } else {
        std::thread::scope(|s| {
            for (p, ((slots, sizes), buf)) in work {
                s.spawn(move || compress_part(p * per_part, slots, sizes, buf));
            }
        });
    }
    // Close the gaps between the slots.
    let mut to = start;
    for (i, &n) in written.iter().enumerate() {
        let from = start + i * slot;
        out.copy_within(from..from + n, to);
        to += n;
        lens.push(n as u32);
    }
    out.truncate(to);
}

/// What one codec does to a sample of the input, per thread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecRate {
    /// Raw bytes compressed per second.
    pub compress: f64,
    /// Raw bytes produced per second.
    pub decompress: f64,
    /// Raw bytes per stored byte.
    pub ratio: f64,
}

impl CodecRate {
    /// No codec: nothing to do, nothing saved.
    pub const NONE: CodecRate = CodecRate {
        compress: f64::INFINITY,
        decompress: f64::INFINITY,
        ratio: 1.0,
    };
}

/// Times each codec is timed on the sample; the fastest counts.
const CODEC_SAMPLES: usize = 3;

/// Measures `codec` on `sample` in frames of `frame` bytes, one thread.
pub fn measure_codec(codec: RunCodec, sample: &[u8], frame: usize) -> CodecRate {
    if codec == RunCodec::None || sample.is_empty() {
        return CodecRate::NONE;
    }
    let frame = frame.clamp(1, sample.len());
    let mut stored = AlignedBuf::with_capacity(stored_bytes_max(sample.len(), frame));
    let mut raw = vec![0u8; frame];
    let (mut compress, mut decompress) = (0f64, 0f64);
    for _ in 0..CODEC_SAMPLES {
        stored.clear();
        let mut lens = vec![];
        let start = Instant::now();
        // Frame by frame on one thread, as each compressing thread works.
        for chunk in sample.chunks(frame) {
            let shape = FrameShape {
                codec,
                frame,
                record: 1,
                threads: 1,
            };
            compress_frames(chunk, shape, &mut stored, &mut lens);
        }
        compress = compress.max(sample.len() as f64 / start.elapsed().as_secs_f64());
        let start = Instant::now();
        let mut at = 0;
        for &len in &lens {
            let frame = &stored[at..at + len as usize];
            let n = decompress_frame(codec, frame, &mut raw, "sample", at as u64).unwrap_or(0);
            std::hint::black_box(n);
            at += len as usize;
        }
        decompress = decompress.max(sample.len() as f64 / start.elapsed().as_secs_f64());
    }
    let bytes = stored.len();
    CodecRate {
        compress,
        decompress,
        ratio: sample.len() as f64 / bytes.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n * 100)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Random keys, repetitive payload: compressible, not trivially.
                if i % 100 < 10 {
                    x as u8
                } else {
                    b'A' + ((x >> 60) as u8 & 3)
                }
            })
            .collect()
    }

    #[test]
    fn frames_round_trip_at_odd_sizes_for_each_codec() {
        for codec in [RunCodec::Lz4, RunCodec::Snappy] {
            for n in [0usize, 1, 2, 7, 49, 50, 51, 1000, 10_000] {
                let raw = records(n, n as u64 + 3);
                for frame_records in [1usize, 7, 64] {
                    let frame = frame_records * 100;
                    let mut out = AlignedBuf::with_capacity(7 + stored_bytes_max(raw.len(), frame));
                    out.extend_from_slice(b"prefix!");
                    let mut lens = vec![];
                    let shape = FrameShape {
                        codec,
                        frame,
                        record: 100,
                        threads: 3,
                    };
                    compress_frames(&raw, shape, &mut out, &mut lens);
                    assert_eq!(&out[..7], b"prefix!");
                    assert_eq!(lens.len(), raw.len().div_ceil(frame));
                    assert_eq!(
                        lens.iter().map(|&l| l as usize).sum::<usize>(),
                        out.len() - 7
                    );
                    let mut back = vec![];
                    let mut at = 7;
                    let mut buf = vec![0u8; frame];
                    for &l in &lens {
                        let stored = &out[at..at + l as usize];
                        let n =
                            decompress_frame(codec, stored, &mut buf, "run", at as u64).unwrap();
                        back.extend_from_slice(&buf[..n]);
                        at += l as usize;
                    }
                    assert!(back == raw, "{codec} n={n} frame={frame}");
                }
            }
        }
    }

    /// Gathering frames straight from a chunk gives the frames of the
    /// gathered records, on any number of threads.
    #[test]
    fn gathered_frames_hold_the_records_the_order_names() {
        let chunk = records(1000, 17);
        let mut x = 7u64;
        for n in [0usize, 1, 2, 7, 49, 50, 51, 1000, 3000] {
            // Duplicates allowed: any index sequence is a valid order.
            let order: Vec<u32> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % 1000) as u32
                })
                .collect();
            let naive: Vec<u8> = order
                .iter()
                .flat_map(|&i| chunk[i as usize * 100..][..100].iter().copied())
                .collect();
            for (threads, frame_records) in [(1usize, 7usize), (2, 7), (3, 64), (8, 1)] {
                let shape = FrameShape {
                    codec: RunCodec::Lz4,
                    frame: frame_records * 100,
                    record: 100,
                    threads,
                };
                let mut out = AlignedBuf::with_capacity(stored_bytes_max(naive.len(), shape.frame));
                let (mut lens, mut scratch) = (vec![], vec![]);
                let source = FrameSource::Gather {
                    chunk: &chunk,
                    order: &order,
                };
                compress_frames_from(source, shape, &mut scratch, &mut out, &mut lens);
                assert!(scratch.len() <= threads.max(1));
                let mut back = vec![];
                let (mut at, mut buf) = (0, vec![0u8; shape.frame]);
                for &l in &lens {
                    let stored = &out[at..at + l as usize];
                    let got = decompress_frame(RunCodec::Lz4, stored, &mut buf, "r", 0).unwrap();
                    back.extend_from_slice(&buf[..got]);
                    at += l as usize;
                }
                assert!(
                    back == naive,
                    "n={n} threads={threads} frame={frame_records}"
                );
            }
        }
    }

    /// Stored frames (asked for with `RunCodec::None`, or when a codec
    /// would not shrink the bytes) carry the raw bytes, and one run may
    /// mix them with compressed frames: each decodes by its header.
    #[test]
    fn stored_and_compressed_frames_mix_in_one_run() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..7_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let text = records(70, 11);
        for codec in [RunCodec::Lz4, RunCodec::Snappy] {
            let pieces = [
                (RunCodec::None, &text[..]),
                (codec, &text[..]),
                (codec, &noise[..]), // incompressible: stored
                (RunCodec::None, &noise[..1]),
                (codec, &text[..0]),
            ];
            let mut out = AlignedBuf::with_capacity(pieces.len() * stored_bytes_max(7_000, 1_000));
            let mut lens = vec![];
            for (c, raw) in pieces {
                let shape = FrameShape {
                    codec: c,
                    frame: 1_000,
                    record: 1,
                    threads: 2,
                };
                compress_frames(raw, shape, &mut out, &mut lens);
            }
            let (mut at, mut back, mut stored) = (0, vec![], 0);
            let mut buf = vec![0u8; 1_000];
            for &l in &lens {
                let frame = &out[at..at + l as usize];
                let n = decompress_frame(codec, frame, &mut buf, "run", at as u64).unwrap();
                stored += usize::from(l as usize == n + FRAME_HEADER_BYTES);
                back.extend_from_slice(&buf[..n]);
                at += l as usize;
            }
            let want: Vec<u8> = pieces.iter().flat_map(|(_, r)| r.iter().copied()).collect();
            assert!(back == want, "{codec}: every byte back");
            // 7 text frames stored on purpose, 7 of noise the codec could
            // not shrink, 1 of one noise byte; the 7 compressed text
            // frames are shorter than their bytes, so the run is shorter
            // than every frame stored.
            assert_eq!(stored, 15, "{codec}: {lens:?}");
            assert!(
                at < want.len() + lens.len() * FRAME_HEADER_BYTES,
                "{codec}: {at} bytes"
            );
        }
    }

    #[test]
    fn a_damaged_frame_is_an_error_naming_the_run_and_offset() {
        let raw = records(50, 9);
        for codec in [RunCodec::Lz4, RunCodec::Snappy] {
            let mut stored = vec![0u8; frame_bytes_max(raw.len())];
            let n = compress_frame(codec, &raw, &mut stored);
            let stored = &stored[..n];
            let mut out = vec![0u8; raw.len()];
            // Cut short: the header no longer matches the index.
            let err = decompress_frame(codec, &stored[..n - 1], &mut out, "run-7", 4096)
                .unwrap_err()
                .to_string();
            assert!(err.contains("run-7") && err.contains("byte 4096"), "{err}");
            // Raw length larger than a frame may be.
            let mut small = vec![0u8; raw.len() - 1];
            let err = decompress_frame(codec, stored, &mut small, "r", 0)
                .unwrap_err()
                .to_string();
            assert!(err.contains("more than a frame"), "{err}");
            // A payload of garbage.
            let mut bad = stored.to_vec();
            for b in bad[FRAME_HEADER_BYTES..].iter_mut() {
                *b = 0xff;
            }
            assert!(decompress_frame(codec, &bad, &mut out, "r", 0).is_err());
            // The header alone.
            assert!(decompress_frame(codec, &stored[..4], &mut out, "r", 0).is_err());
        }
    }

    #[test]
    fn measures_ratio_and_rates() {
        let sample = records(20_000, 5);
        for codec in [RunCodec::Lz4, RunCodec::Snappy] {
            let r = measure_codec(codec, &sample, 64 << 10);
            assert!(r.ratio > 1.5 && r.ratio < 20.0, "{codec}: {r:?}");
            assert!(r.compress > 0.0 && r.decompress > 0.0, "{codec}: {r:?}");
        }
        assert_eq!(
            measure_codec(RunCodec::None, &sample, 1 << 20),
            CodecRate::NONE
        );
        assert_eq!(
            "lz4".parse::<CodecChoice>(),
            Ok(CodecChoice::Only(RunCodec::Lz4))
        );
        assert_eq!("auto".parse::<CodecChoice>(), Ok(CodecChoice::Auto));
        let err = "zip".parse::<CodecChoice>().unwrap_err();
        assert!(err.contains("zip") && err.contains("snappy"), "{err}");
    }
}
