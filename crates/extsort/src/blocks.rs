//! Reader and writer threads that overlap storage with compute: a reader
//! one block ahead of its consumer, a writer one block behind its
//! producer, two buffers each, recycled; compressed runs frame by frame.

use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use insitu_kernels::gather_rows_into;

use crate::codec::{
    compress_frames, decompress_frame, frame_bytes_max, stored_bytes_max, FrameShape, RunCodec,
};
use crate::direct::{aligned_bytes, read_buffer_bytes, AlignedBuf, DirectSink, DIRECT_ALIGN};
use crate::files::io_err;
use crate::{ExtsortError, Result};

/// A thread reading `len` bytes of `file` from `offset` in blocks of
/// `block` bytes (the last may be shorter), one block ahead of the
/// consumer: two buffers in all, recycled.
///
/// Where the file system allows it the thread reads with `O_DIRECT` in
/// aligned requests straight into the block's buffer: buffered reads of a
/// 4 GB sort spent 55% of the process's CPU in the kernel copying from the
/// page cache (`perf record` on `insitu extsort`, 1 GiB budget).
pub struct BlockReader {
    blocks: Option<Receiver<Result<Block>>>,
    recycle: Option<SyncSender<AlignedBuf>>,
    thread: Option<JoinHandle<()>>,
}

/// One block a [`BlockReader`] read: a window of an aligned buffer (direct
/// reads start and end on aligned file offsets, the block need not).
#[derive(Default)]
pub struct Block {
    buf: Option<AlignedBuf>,
    start: usize,
    end: usize,
}

impl std::ops::Deref for Block {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => &b.as_slice()[self.start..self.end],
            None => &[],
        }
    }
}

/// The buffers a reader thread fills: two in all, allocated on first
/// need, then recycled by the consumer.
struct ReaderBuffers {
    spare: Receiver<AlignedBuf>,
    fresh: usize,
    cap: usize,
}

impl ReaderBuffers {
    /// A buffer to fill, or `None` when the consumer is gone.
    fn take(&mut self) -> Option<AlignedBuf> {
        match self.spare.try_recv() {
            Ok(b) => Some(b),
            Err(_) if self.fresh > 0 => {
                self.fresh -= 1;
                Some(AlignedBuf::new(self.cap).on_base_pages())
            }
            Err(_) => self.spare.recv().ok(),
        }
    }
}

impl BlockReader {
    /// Starts a reader thread: `next` takes a buffer (only when there is
    /// more to read) and fills it with the next block, or says `None` at
    /// the end or when the consumer is gone; the thread also stops at the
    /// first error.
    fn start(
        cap: usize,
        mut next: impl FnMut(&mut ReaderBuffers) -> Option<Result<Block>> + Send + 'static,
    ) -> Result<Self> {
        let (tx, blocks) = sync_channel::<Result<Block>>(0);
        let (recycle, spare) = sync_channel::<AlignedBuf>(2);
        let mut buffers = ReaderBuffers {
            spare,
            fresh: 2,
            cap,
        };
        let thread = std::thread::Builder::new()
            .name("insitu-read".into())
            .spawn(move || {
                while let Some(block) = next(&mut buffers) {
                    let failed = block.is_err();
                    if tx.send(block).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| ExtsortError::Invalid(format!("cannot start a reader thread: {e}")))?;
        Ok(Self {
            blocks: Some(blocks),
            recycle: Some(recycle),
            thread: Some(thread),
        })
    }

    pub fn spawn(path: &Path, offset: u64, len: u64, block: usize) -> Result<Self> {
        Self::spawn_first(path, offset, len, block, block)
    }

    /// As [`BlockReader::spawn`], with a first block of at most `first`
    /// bytes (at most `block`): a sort's short chunk first, so that the
    /// last one, which may stay in memory, is whole.
    pub fn spawn_first(
        path: &Path,
        offset: u64,
        len: u64,
        first: usize,
        block: usize,
    ) -> Result<Self> {
        assert!(
            first > 0 && first <= block,
            "a first block within the buffers"
        );
        let (file, direct) = open_for_reading(path)?;
        let path = path.to_path_buf();
        let mut at = offset;
        let end = offset + len;
        let mut next = first;
        // Room for a block that starts and ends mid-page.
        Self::start(read_buffer_bytes(block), move |buffers| {
            if at >= end {
                return None;
            }
            let mut buf = buffers.take()?;
            let n = (std::mem::replace(&mut next, block) as u64).min(end - at) as usize;
            let read = read_block(&file, direct, at, n, &mut buf)
                .map(|start| Block {
                    buf: Some(buf),
                    start,
                    end: start + n,
                })
                .map_err(io_err(&path));
            at += n as u64;
            Some(read)
        })
    }

    /// A thread reading the compressed run at `path`, whose frames have the
    /// stored lengths `frames`, one frame ahead of the consumer: each block
    /// is one frame decompressed (at most `frame_raw` bytes). Holds two raw
    /// buffers and one for the stored frame.
    pub fn spawn_frames(
        path: &Path,
        codec: RunCodec,
        frames: Vec<u32>,
        frame_raw: usize,
    ) -> Result<Self> {
        let (file, direct) = open_for_reading(path)?;
        let name = path.display().to_string();
        let stored_max = frame_bytes_max(frame_raw);
        let mut stored = AlignedBuf::new(read_buffer_bytes(stored_max));
        let mut frames = frames.into_iter();
        let mut at = 0u64;
        Self::start(aligned_bytes(frame_raw), move |buffers| {
            let len = frames.next()?;
            let mut raw = buffers.take()?;
            let block = read_frame(
                &file,
                direct,
                at,
                len as usize,
                stored_max,
                &mut stored,
                &name,
            )
            .and_then(|skip| {
                let frame = &stored.as_slice()[skip..skip + len as usize];
                let cap = raw.cap;
                let n = decompress_frame(codec, frame, raw.resize_for_overwrite(cap), &name, at)?;
                Ok(Block {
                    buf: Some(raw),
                    start: 0,
                    end: n,
                })
            });
            at += u64::from(len);
            Some(block)
        })
    }

    /// A thread handing out the records of `chunk` named by
    /// `order[range]`, gathered into blocks of at most `block` bytes
    /// (whole records), one block ahead of the consumer: a sorted run kept
    /// in memory (or a key range of it), read like one on disk. Holds two
    /// blocks besides the chunk and the order, which it shares.
    pub fn spawn_gather(
        chunk: Arc<Block>,
        order: Arc<Vec<u32>>,
        range: Range<usize>,
        record: usize,
        block: usize,
    ) -> Result<Self> {
        // Whole records and indices in range are the gather kernel's
        // checks; a failed one ends the thread in a panic, which
        // `next_block` reports.
        assert!(range.end <= order.len(), "a range of the order");
        let per_block = (block / record).max(1);
        let mut at = range.start;
        Self::start(aligned_bytes(per_block * record), move |buffers| {
            if at >= range.end {
                return None;
            }
            let mut buf = buffers.take()?;
            let picked = &order[at..(at + per_block).min(range.end)];
            let n = picked.len() * record;
            gather_rows_into(&chunk, record, picked, buf.resize_for_overwrite(n));
            at += picked.len();
            Some(Ok(Block {
                buf: Some(buf),
                start: 0,
                end: n,
            }))
        })
    }

    /// The next block, or `None` at the end.
    pub fn next_block(&mut self) -> Result<Option<Block>> {
        match self.blocks.as_ref().expect("open").recv() {
            Ok(b) => b.map(Some),
            // The thread ended: after its last block, or in a panic, which
            // must not read as the end of the run.
            Err(_) => match self.thread.take().map(JoinHandle::join) {
                Some(Err(_)) => Err(ExtsortError::Invalid("a reader thread panicked".into())),
                _ => Ok(None),
            },
        }
    }

    /// Hands a consumed block back for reuse.
    pub fn recycle(&self, block: Block) {
        self.recycler().recycle(block);
    }

    /// A handle that hands blocks back from another thread.
    pub fn recycler(&self) -> Recycler {
        Recycler(self.recycle.clone().expect("open"))
    }
}

/// Hands a [`BlockReader`]'s consumed blocks back for reuse, from any
/// thread: the sort phase's run writer frees a chunk once it is written.
/// Dropping the reader waits for its thread, which may wait for a spare
/// buffer while a recycler lives: drop recyclers first.
#[derive(Clone)]
pub struct Recycler(SyncSender<AlignedBuf>);

impl Recycler {
    pub fn recycle(&self, block: Block) {
        if let Some(buf) = block.buf {
            let _ = self.0.try_send(buf);
        }
    }
}

/// `path` opened for reading, with `O_DIRECT` where the file system takes
/// it (true); plain otherwise.
pub(crate) fn open_for_reading(path: &Path) -> Result<(File, bool)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        if let Ok(file) = direct {
            return Ok((file, true));
        }
    }
    Ok((File::open(path).map_err(io_err(path))?, false))
}

/// Reads bytes `at..at + n` of `file` into `buf`; returns where in `buf`
/// they start. Direct reads cover the aligned range around them.
pub(crate) fn read_block(
    file: &File,
    direct: bool,
    at: u64,
    n: usize,
    buf: &mut AlignedBuf,
) -> std::io::Result<usize> {
    let align = if direct { DIRECT_ALIGN as u64 } else { 1 };
    let lo = at / align * align;
    let skip = (at - lo) as usize;
    let need = skip + n;
    let request = need.next_multiple_of(align as usize);
    let got = buf.read_at(file, lo, request, need)?;
    if got < need {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("file ends before byte {}", at + n as u64),
        ));
    }
    Ok(skip)
}

/// Reads the stored frame of `len` bytes at `at` into `buf`; returns where
/// in `buf` it starts. A length over `max` is an index error, not a read.
fn read_frame(
    file: &File,
    direct: bool,
    at: u64,
    len: usize,
    max: usize,
    buf: &mut AlignedBuf,
    name: &str,
) -> Result<usize> {
    if len > max {
        return Err(ExtsortError::Input {
            path: name.to_string(),
            message: format!("frame at byte {at} is {len} bytes, more than a frame's {max}"),
        });
    }
    read_block(file, direct, at, len, buf).map_err(|source| ExtsortError::Io {
        path: name.to_string(),
        source,
    })
}

impl Drop for BlockReader {
    fn drop(&mut self) {
        // Unblock the thread (it waits to send or for a spare buffer):
        // close both channels, then wait for it.
        self.blocks = None;
        self.recycle = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A thread writing blocks to a file as they come, one block behind the
/// producer; blocks come back through `BlockWriter::spare` for reuse.
///
/// Where the file system allows it the thread writes with `O_DIRECT`,
/// straight from blocks of whole aligned pages and through an aligned
/// staging buffer otherwise (`DirectSink`): on the machines we measure on,
/// buffered writes of gigabytes reached 202 MB/s (`dd conv=fdatasync`) and
/// spent half the sort's CPU copying into the page cache, while direct
/// writes reached 897 MB/s (`dd oflag=direct`, 8 MiB requests).
pub struct BlockWriter {
    blocks: Option<SyncSender<AlignedBuf>>,
    spare: Receiver<AlignedBuf>,
    thread: Option<JoinHandle<Result<Written>>>,
    fresh: usize,
    block: usize,
}

/// What a [`BlockWriter`] wrote.
pub struct Written {
    pub file: File,
    /// Stored bytes.
    pub bytes: u64,
    /// Each frame's stored length, when it compressed.
    pub frames: Option<Vec<u32>>,
}

/// The compressing writer's two stages: this thread compresses each raw
/// block (helped by `threads - 1` more) and hands it back at once; an I/O
/// thread writes the compressed blocks (two in all), so compression
/// overlaps the storage.
fn compress_then_write(
    mut sink: DirectSink,
    raw_blocks: Receiver<AlignedBuf>,
    raw_back: SyncSender<AlignedBuf>,
    c: FrameShape,
    stored_block: usize,
) -> Result<Written> {
    let (to_io, io_blocks) = sync_channel::<AlignedBuf>(0);
    let (io_back, spare) = sync_channel::<AlignedBuf>(2);
    std::thread::scope(|s| {
        let io = s.spawn(move || -> Result<(File, u64)> {
            let mut bytes = 0u64;
            for mut stored in io_blocks {
                sink.write(&stored)?;
                bytes += stored.len() as u64;
                stored.clear();
                let _ = io_back.try_send(stored);
            }
            Ok((sink.finish()?, bytes))
        });
        let mut frames = vec![];
        let mut fresh = 2;
        for mut raw in raw_blocks {
            let mut stored = match spare.try_recv() {
                Ok(b) => b,
                Err(_) if fresh > 0 => {
                    fresh -= 1;
                    AlignedBuf::with_capacity(stored_block)
                }
                Err(_) => match spare.recv() {
                    Ok(b) => b,
                    Err(_) => break, // the I/O thread stopped: its error follows
                },
            };
            compress_frames(&raw, c, &mut stored, &mut frames);
            raw.clear();
            let _ = raw_back.try_send(raw);
            if to_io.send(stored).is_err() {
                break;
            }
        }
        drop(to_io);
        let (file, bytes) = io
            .join()
            .map_err(|_| ExtsortError::Invalid("the writer's I/O thread panicked".into()))??;
        Ok(Written {
            file,
            bytes,
            frames: Some(frames),
        })
    })
}

impl BlockWriter {
    /// A writer of blocks of up to `block` bytes, stored as given.
    pub fn spawn(file: File, path: &Path, block: usize) -> Result<Self> {
        Self::spawn_with(file, path, block, None)
    }

    /// A writer of blocks of up to `block` raw bytes that, given a
    /// [`FrameShape`], compresses each into frames on its own thread
    /// while the producer fills the next block and an I/O thread writes
    /// the last (`compress_then_write`). Holds two raw blocks, two
    /// compressed ones and the staging request.
    pub fn spawn_with(
        file: File,
        path: &Path,
        block: usize,
        compression: Option<FrameShape>,
    ) -> Result<Self> {
        let (blocks, rx) = sync_channel::<AlignedBuf>(0);
        let (back, spare) = sync_channel::<AlignedBuf>(2);
        let path = path.to_path_buf();
        let stored_block = match compression {
            Some(c) => stored_bytes_max(block, c.frame),
            None => block,
        };
        let thread = std::thread::Builder::new()
            .name("insitu-write".into())
            .spawn(move || {
                let mut sink = DirectSink::new(file, &path, stored_block)?;
                let mut bytes = 0u64;
                let Some(c) = compression else {
                    for mut buf in rx {
                        sink.write(&buf)?;
                        bytes += buf.len() as u64;
                        buf.clear();
                        let _ = back.try_send(buf);
                    }
                    let file = sink.finish()?;
                    return Ok(Written {
                        file,
                        bytes,
                        frames: None,
                    });
                };
                compress_then_write(sink, rx, back, c, stored_block)
            })
            .map_err(|e| ExtsortError::Invalid(format!("cannot start a writer thread: {e}")))?;
        Ok(Self {
            blocks: Some(blocks),
            spare,
            thread: Some(thread),
            fresh: 2,
            block,
        })
    }

    /// An empty buffer to fill (two in all between this side and the thread).
    pub fn buffer(&mut self) -> Result<AlignedBuf> {
        if let Ok(b) = self.spare.try_recv() {
            return Ok(b);
        }
        if self.fresh > 0 {
            self.fresh -= 1;
            return Ok(AlignedBuf::with_capacity(self.block));
        }
        match self.spare.recv() {
            Ok(b) => Ok(b),
            Err(_) => Err(self.fail()),
        }
    }

    /// Queues a full buffer for writing.
    pub fn write(&mut self, buf: AlignedBuf) -> Result<()> {
        let sent = self.blocks.as_ref().expect("open").send(buf);
        sent.map_err(|_| self.fail())
    }

    /// The writer thread's error (it stopped early).
    fn fail(&mut self) -> ExtsortError {
        self.blocks = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            _ => ExtsortError::Invalid("the writer thread stopped".into()),
        }
    }

    /// Waits for every queued block; returns the file and what it holds.
    pub fn finish(mut self) -> Result<Written> {
        self.blocks = None;
        match self.thread.take().expect("finish once").join() {
            Ok(r) => r,
            Err(_) => Err(ExtsortError::Invalid("the writer thread panicked".into())),
        }
    }
}

impl Drop for BlockWriter {
    fn drop(&mut self) {
        self.blocks = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::measure_bandwidth;
    use std::fs;

    #[test]
    fn reader_and_writer_threads_move_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i % 253) as u8).collect();
        fs::write(&src, &data).unwrap();
        let dst = dir.path().join("dst");
        let mut w = BlockWriter::spawn(File::create(&dst).unwrap(), &dst, 4096).unwrap();
        let mut r = BlockReader::spawn(&src, 3, data.len() as u64 - 3, 4096).unwrap();
        while let Some(block) = r.next_block().unwrap() {
            let mut out = w.buffer().unwrap();
            out.extend_from_slice(&block);
            r.recycle(block);
            w.write(out).unwrap();
        }
        w.finish().unwrap();
        assert_eq!(fs::read(&dst).unwrap(), &data[3..]);
        let rates = measure_bandwidth(dir.path(), 8 << 20, 4 << 20).unwrap();
        assert!(rates.read > 0.0 && rates.write > 0.0 && rates.mixed > 0.0);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            2,
            "probe file removed"
        );
    }

    /// Compressed blocks go through two threads (compress, then write):
    /// they arrive whole, and a write error in the second stops the first
    /// with the error naming the file, whichever call sees it.
    #[test]
    fn compressing_writer_round_trips_and_reports_a_full_disk() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("run");
        let c = FrameShape {
            codec: RunCodec::Lz4,
            frame: 1000,
            record: 100,
            threads: 2,
        };
        let data: Vec<u8> = (0..250_000u32).map(|i| (i % 7 + i / 5000) as u8).collect();
        let mut w =
            BlockWriter::spawn_with(File::create(&dst).unwrap(), &dst, 4000, Some(c)).unwrap();
        for piece in data.chunks(4000) {
            let mut b = w.buffer().unwrap();
            b.extend_from_slice(piece);
            w.write(b).unwrap();
        }
        let written = w.finish().unwrap();
        let frames = written.frames.expect("frame index");
        assert_eq!(written.bytes, fs::metadata(&dst).unwrap().len());
        assert!(written.bytes < data.len() as u64 / 2, "compressed");
        let mut r = BlockReader::spawn_frames(&dst, RunCodec::Lz4, frames, 1000).unwrap();
        let mut back = vec![];
        while let Some(b) = r.next_block().unwrap() {
            back.extend_from_slice(&b);
            r.recycle(b);
        }
        assert!(back == data, "every byte back");

        let full = Path::new("/dev/full");
        let Ok(file) = OpenOptions::new().write(true).open(full) else {
            return; // no /dev/full here
        };
        let mut w = BlockWriter::spawn_with(file, full, 4000, Some(c)).unwrap();
        let err = loop {
            let b = match w.buffer() {
                Ok(mut b) => {
                    b.extend_from_slice(&data[..4000]);
                    b
                }
                Err(e) => break e,
            };
            if let Err(e) = w.write(b) {
                break e;
            }
        };
        let err = err.to_string();
        assert!(
            err.contains("/dev/full") && err.contains("No space left"),
            "{err}"
        );
    }

    /// Direct reads cover aligned ranges; every window, block size and
    /// file end must still give exactly the bytes asked for.
    #[test]
    fn reader_gives_any_window_in_any_block_size() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..3 * 4096 + 123u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        fs::write(&src, &data).unwrap();
        let len = data.len() as u64;
        for (offset, take) in [(0, len), (5, len - 5), (4096, 4096), (7, 8190), (len, 0)] {
            for block in [7, 100, 4096, 5000, 1 << 20] {
                let mut r = BlockReader::spawn(&src, offset, take, block).unwrap();
                let mut got = vec![];
                while let Some(b) = r.next_block().unwrap() {
                    assert!(b.len() <= block && !b.is_empty());
                    got.extend_from_slice(&b);
                    r.recycle(b);
                }
                let want = &data[offset as usize..(offset + take) as usize];
                assert!(got == want, "offset {offset} len {take} block {block}");
            }
        }
        // A short first block, then whole ones.
        for (first, block) in [(1, 4096), (100, 100), (4095, 5000), (77, 1 << 20)] {
            let mut r = BlockReader::spawn_first(&src, 3, len - 3, first, block).unwrap();
            let mut sizes = vec![];
            let mut got = vec![];
            while let Some(b) = r.next_block().unwrap() {
                sizes.push(b.len());
                got.extend_from_slice(&b);
                r.recycle(b);
            }
            assert!(got == data[3..], "first {first} block {block}");
            assert_eq!(sizes[0], first.min(data.len() - 3), "{sizes:?}");
            let (last, middle) = sizes[1..].split_last().unwrap_or((&0, &[]));
            assert!(
                middle.iter().all(|&n| n == block) && *last <= block,
                "{sizes:?}"
            );
        }
        // Asking past the end is an error naming the file, not a hang.
        let mut r = BlockReader::spawn(&src, 100, len, 4096).unwrap();
        let err = loop {
            match r.next_block() {
                Ok(Some(b)) => r.recycle(b),
                Ok(None) => panic!("read past the end without an error"),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains("src") && err.contains("ends before"), "{err}");
    }

    /// The flags `/proc/self/smaps` gives the mapping that holds `addr`.
    #[cfg(target_os = "linux")]
    fn mapping_flags(addr: usize) -> Vec<String> {
        let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = (a..b).contains(&addr);
                    continue;
                }
            }
            if let Some(flags) = line.strip_prefix("VmFlags:").filter(|_| inside) {
                return flags.split_whitespace().map(String::from).collect();
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    /// What a reader fills is advised off huge pages (smaps flag `nh`),
    /// and what it hands out is still the file's bytes.
    #[test]
    #[cfg(target_os = "linux")]
    fn reader_buffers_stay_on_base_pages() {
        use insitu_kernels::mem::HUGE_PAGE_BYTES;
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..3 * HUGE_PAGE_BYTES as u32 + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        fs::write(&src, &data).unwrap();
        let block = 2 * HUGE_PAGE_BYTES;
        let mut reader = BlockReader::spawn(&src, 0, data.len() as u64, block).unwrap();
        let mut at = 0;
        while let Some(b) = reader.next_block().unwrap() {
            assert!(b[..] == data[at..at + b.len()], "block at {at}");
            let flags = mapping_flags(b.as_ptr() as usize);
            assert!(flags.iter().any(|f| f == "nh"), "block at {at}: {flags:?}");
            at += b.len();
        }
        assert_eq!(at, data.len());
    }

    /// A run kept in memory reads like one on disk: its records in the
    /// order given (duplicates and all), in blocks of whole records no
    /// longer than asked, at odd sizes.
    #[test]
    fn gather_reader_hands_out_a_chunk_in_its_order() {
        let record = 10;
        let mut x = 11u64;
        for records in [0usize, 1, 2, 7, 49, 50, 51, 1000] {
            let whole: Vec<u8> = (0..records * record).map(|i| (i * 7 % 253) as u8).collect();
            // The records as a window that starts inside its buffer.
            let chunk = || {
                let mut buf = AlignedBuf::new(aligned_bytes(whole.len() + 5));
                buf.resize_for_overwrite(whole.len() + 5)[5..].copy_from_slice(&whole);
                Block {
                    buf: Some(buf),
                    start: 5,
                    end: 5 + whole.len(),
                }
            };
            let order: Vec<u32> = (0..records)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % records as u64) as u32
                })
                .collect();
            let want: Vec<u8> = order
                .iter()
                .flat_map(|&i| whole[i as usize * record..][..record].iter().copied())
                .collect();
            let (chunk, order) = (Arc::new(chunk()), Arc::new(order));
            // The whole order, and ranges of it (a merge part's).
            let ranges = [0..records, 0..records / 3, records / 3..records];
            for (block, range) in [1, 10, 35, 4096].into_iter().zip(ranges.iter().cycle()) {
                let (c, o) = (chunk.clone(), order.clone());
                let mut r = BlockReader::spawn_gather(c, o, range.clone(), record, block).unwrap();
                let mut got = vec![];
                while let Some(b) = r.next_block().unwrap() {
                    assert!(b.len() % record == 0 && !b.is_empty());
                    assert!(b.len() <= block.max(record), "block {block}: {}", b.len());
                    got.extend_from_slice(&b);
                    r.recycle(b);
                }
                let want = &want[range.start * record..range.end * record];
                assert!(got == want, "{records} records, blocks of {block}");
            }
        }
        // An order naming a record past the chunk is an error at the
        // merge, not a run that ends early.
        let chunk = Block {
            buf: Some(AlignedBuf::new(aligned_bytes(20))),
            start: 0,
            end: 20,
        };
        let (chunk, order) = (Arc::new(chunk), Arc::new(vec![0, 5]));
        let mut r = BlockReader::spawn_gather(chunk, order, 0..2, record, 4096).unwrap();
        let err = r.next_block().err().expect("an error, not the end");
        assert!(err.to_string().contains("panicked"), "{err}");
    }
}
