//! I/O of the external sort: files that appear only when complete, run
//! directories that a crash cannot leave behind for long, reader and
//! writer threads that overlap storage with compute (double buffering),
//! and the bandwidth probe the model starts from.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use insitu_kernels::gather_rows_into;
use insitu_kernels::mem::{advise_base_pages, page_bytes};

use crate::codec::{
    compress_frames, decompress_frame, frame_bytes_max, stored_bytes_max, FrameShape, RunCodec,
};
use crate::{ExtsortError, Result};

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ExtsortError + '_ {
    move |source| ExtsortError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Prefix of temporary names, each followed by a [`process_tag`]:
/// `.NAME.insitu-tmp-TAG` next to the output, `.insitu-extsort-TAG-N` for
/// run directories, `.insitu-probe-TAG` for the bandwidth probe's files.
const TMP_MARK: &str = ".insitu-tmp-";
const RUN_DIR_PREFIX: &str = ".insitu-extsort-";
const PROBE_PREFIX: &str = ".insitu-probe-";

/// A file written under a temporary name in its final directory, fsynced
/// and renamed into place by [`AtomicFile::commit`]; dropped earlier, it
/// is removed.
pub struct AtomicFile {
    file: Option<File>,
    tmp: PathBuf,
    path: PathBuf,
}

impl AtomicFile {
    pub fn create(path: &Path) -> Result<Self> {
        let dir = parent_dir(path);
        let name = path
            .file_name()
            .ok_or_else(|| ExtsortError::Invalid(format!("{} is not a file name", path.display())))?
            .to_string_lossy()
            .into_owned();
        let prefix = format!(".{name}{TMP_MARK}");
        remove_stale(&dir, |n| n.strip_prefix(&prefix));
        let tmp = dir.join(format!("{prefix}{}", process_tag()));
        let file = File::create(&tmp).map_err(io_err(&tmp))?;
        Ok(Self {
            file: Some(file),
            tmp,
            path: path.to_path_buf(),
        })
    }

    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    pub fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("not committed")
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let tmp = self.tmp.clone();
        self.file().write_all(bytes).map_err(io_err(&tmp))
    }

    /// Makes the file durable under its final name.
    pub fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("commit once");
        file.sync_all().map_err(io_err(&self.tmp))?;
        drop(file);
        fs::rename(&self.tmp, &self.path).map_err(io_err(&self.path))?;
        let dir = parent_dir(&self.path);
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&dir))
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// This process's tag, `{pid}-{start}`: its id and the instant it first
/// named a temporary file (nanoseconds since the epoch). Temporary names
/// carry it so that a process which reuses a dead one's id (a restarted
/// container's entry point often does) still sees that one's files as
/// stale.
pub fn process_tag() -> String {
    format!("{}-{}", std::process::id(), process_start())
}

fn process_start() -> u64 {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    })
}

/// Whether the process named by `tag` (a [`process_tag`], possibly
/// followed by `-...`; or a bare pid, as older versions wrote) may still
/// run. `None` if `tag` names no process.
pub fn tag_is_live(tag: &str) -> Option<bool> {
    let mut parts = tag.split('-');
    let pid: u32 = parts.next()?.parse().ok()?;
    let start: Option<u64> = parts.next().and_then(|s| s.parse().ok());
    Some(if pid == std::process::id() {
        start == Some(process_start())
    } else {
        process_runs(pid)
    })
}

/// Whether process `pid` runs: it exists and is not a zombie (a zombie
/// has exited and released its files; only its parent has yet to reap
/// it).
pub fn process_runs(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, state) = stat.rsplit_once(") ")?;
            Some(!state.starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Removes the entries of `dir` whose name `tag` maps to the tag of a
/// process that no longer runs (see [`tag_is_live`]). Entries it maps to
/// `None` are not temporary files and stay.
pub fn remove_stale(dir: &Path, tag: impl Fn(&str) -> Option<&str>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if tag(&name).and_then(tag_is_live) == Some(false) {
            tracing::info!(path = %e.path().display(), "removing stale temporary file");
            let _ = fs::remove_dir_all(e.path()).or_else(|_| fs::remove_file(e.path()));
        }
    }
}

/// A directory of sorted runs, removed with everything in it on drop.
pub struct RunDir {
    path: PathBuf,
    next: u64,
}

impl RunDir {
    /// Creates a fresh run directory under `tmp`, first removing run
    /// directories of sorts that died.
    pub fn create(tmp: &Path) -> Result<Self> {
        fs::create_dir_all(tmp).map_err(io_err(tmp))?;
        remove_stale(tmp, |n| n.strip_prefix(RUN_DIR_PREFIX));
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = tmp.join(format!("{RUN_DIR_PREFIX}{}-{n}", process_tag()));
        fs::create_dir(&path).map_err(io_err(&path))?;
        Ok(Self { path, next: 0 })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new run's path.
    pub fn next_run(&mut self) -> PathBuf {
        self.next += 1;
        self.path.join(format!("run-{:06}", self.next))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

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
fn open_for_reading(path: &Path) -> Result<(File, bool)> {
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
fn read_block(
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

/// Alignment of direct I/O: buffers, file offsets and request lengths.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// Bytes of an aligned buffer of at least `len` bytes.
pub fn aligned_bytes(len: usize) -> usize {
    len.max(1).next_multiple_of(DIRECT_ALIGN)
}

/// True if `bytes` start on an aligned address: direct I/O can take their
/// whole aligned pages as they are.
fn is_direct_address(bytes: &[u8]) -> bool {
    (bytes.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
}

/// Records per block of at most `bytes` bytes of `record`-byte records:
/// a multiple of the records that fill whole aligned pages, when `bytes`
/// holds that many, so that full blocks go to storage without being staged
/// (`DirectSink`); else as many whole records as fit (at least one).
pub fn aligned_block_records(bytes: usize, record: usize) -> usize {
    assert!(record > 0, "records of at least one byte");
    let (mut a, mut b) = (record, DIRECT_ALIGN);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let whole_pages = DIRECT_ALIGN / a;
    let fit = (bytes / record).max(1);
    match fit >= whole_pages {
        true => fit / whole_pages * whole_pages,
        false => fit,
    }
}

/// Bytes of each buffer a [`BlockReader`] of `block`-byte blocks holds:
/// room for a block that starts and ends mid-page. The planner counts
/// these, not `block`, against the memory budget.
pub fn read_buffer_bytes(block: usize) -> usize {
    (block + 2 * DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN)
}

/// Bytes of staging a [`BlockWriter`] holds when it writes with
/// `O_DIRECT`. With `fixed` blocks (every block `block` bytes but a
/// stream's last, which may be shorter) of whole aligned pages, full
/// blocks go out in place and only the last block's tail is staged: one
/// page. Other blocks are staged in one request (`staging_request_bytes`).
pub fn write_staging_bytes(block: usize, fixed: bool) -> usize {
    match fixed && block.is_multiple_of(DIRECT_ALIGN) {
        true => DIRECT_ALIGN,
        false => staging_request_bytes(block),
    }
}

/// Bytes of the direct writer's staging request for `block`-byte blocks:
/// a whole block, within [`DIRECT_REQUEST_BYTES_MIN`] and
/// [`DIRECT_REQUEST_BYTES_MAX`].
fn staging_request_bytes(block: usize) -> usize {
    let request = block.clamp(DIRECT_REQUEST_BYTES_MIN, DIRECT_REQUEST_BYTES_MAX);
    request / DIRECT_ALIGN * DIRECT_ALIGN
}
/// Bounds of the direct writer's requests. Larger requests write faster
/// while the merge's readers read: the 4.3 GB sort's merge (1 GiB budget,
/// 10 runs, 25-26 MiB blocks) took 4.56-5.31 s in whole-block requests
/// against 5.68-6.19 s in quarter-block ones (three runs each,
/// alternating); `dd oflag=direct` alone wrote 958 MB/s at 1 MiB, 2237
/// MB/s at 8 MiB and 2548 MB/s at 64 MiB.
const DIRECT_REQUEST_BYTES_MIN: usize = 256 << 10;
const DIRECT_REQUEST_BYTES_MAX: usize = 32 << 20;

/// Appends to a file with `O_DIRECT` in whole aligned requests. The whole
/// pages of bytes in aligned memory (an [`AlignedBuf`] block) go straight
/// to storage, and a tail after them waits in a one-page buffer: a
/// stream's last block. Bytes that come otherwise (unaligned, or after a
/// tail) are staged in an aligned request-sized buffer, allocated on first
/// need, and from then on every write goes through it so that requests
/// stay aligned in the file. What is left staged at the end is written
/// buffered. Falls back to plain
/// buffered writes where the file system refuses `O_DIRECT` or the file
/// position is not aligned.
struct DirectSink {
    file: Option<File>,
    path: PathBuf,
    direct: bool,
    staging: Option<AlignedBuf>,
    staging_bytes: usize,
}

impl DirectSink {
    /// A sink for a writer of `block`-byte blocks.
    fn new(file: File, path: &Path, block: usize) -> Result<Self> {
        Ok(Self {
            direct: set_direct(&file, true),
            file: Some(file),
            path: path.to_path_buf(),
            staging: None,
            staging_bytes: staging_request_bytes(block),
        })
    }

    fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
        let file = self.file.as_mut().expect("open until finished");
        if !self.direct {
            return file.write_all(bytes).map_err(io_err(&self.path));
        }
        if self.staging.is_none() && is_direct_address(bytes) {
            // No copy: staging every block cost the writer thread 9.7% of
            // a 2 GB sort's CPU samples, and 1.8% are left without it
            // (`perf record` on `insitu extsort`, 512 MiB budget).
            let whole = bytes.len() / DIRECT_ALIGN * DIRECT_ALIGN;
            file.write_all(&bytes[..whole])
                .map_err(io_err(&self.path))?;
            let tail = &bytes[whole..];
            if !tail.is_empty() {
                // Blocks of whole pages leave a tail only at the stream's
                // end: one page holds it unless more follows.
                let mut page = AlignedBuf::new(DIRECT_ALIGN);
                page.extend_from_slice(tail);
                self.staging = Some(page);
            }
            return Ok(());
        }
        let staging = request_sized(&mut self.staging, self.staging_bytes);
        let file = self.file.as_mut().expect("open until finished");
        while !bytes.is_empty() {
            let taken = staging.push(bytes);
            bytes = &bytes[taken..];
            if staging.is_full() {
                file.write_all(staging.as_slice())
                    .map_err(io_err(&self.path))?;
                staging.clear();
            }
        }
        Ok(())
    }

    /// Writes what is staged: the aligned part direct, the rest buffered.
    fn finish(mut self) -> Result<File> {
        let mut file = self.file.take().expect("finish once");
        if !self.direct {
            return Ok(file);
        }
        let bytes = self.staging.as_ref().map_or(&[][..], |s| s.as_slice());
        let aligned = bytes.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        let written = file.write_all(&bytes[..aligned]);
        set_direct(&file, false);
        written.map_err(io_err(&self.path))?;
        file.write_all(&bytes[aligned..])
            .map_err(io_err(&self.path))?;
        Ok(file)
    }
}

/// The staging buffer, at least `bytes_max` bytes, keeping what it holds
/// (a one-page tail grows into a request when more bytes follow it).
fn request_sized(staging: &mut Option<AlignedBuf>, bytes_max: usize) -> &mut AlignedBuf {
    let buf = match staging.take() {
        Some(s) if s.capacity() >= bytes_max => s,
        held => {
            let mut s = AlignedBuf::new(bytes_max);
            s.extend_from_slice(held.as_deref().unwrap_or_default());
            s
        }
    };
    staging.insert(buf)
}

impl Drop for DirectSink {
    fn drop(&mut self) {
        // The descriptor may be shared (a clone of OUT's): leave it plain.
        if let (Some(file), true) = (&self.file, self.direct) {
            set_direct(file, false);
        }
    }
}

/// Turns `O_DIRECT` on or off for `file`; false if it cannot be on (the
/// file system refuses it, or the position is not aligned).
fn set_direct(file: &File, on: bool) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::io::Seek;
        use std::os::fd::AsRawFd;
        if on {
            let mut f = file;
            match f.stream_position() {
                Ok(pos) if pos.is_multiple_of(DIRECT_ALIGN as u64) => {}
                _ => return false,
            }
        }
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own reads and sets status flags.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 {
                return false;
            }
            let flags = if on {
                flags | libc::O_DIRECT
            } else {
                flags & !libc::O_DIRECT
            };
            libc::fcntl(fd, libc::F_SETFL, flags) == 0 && on
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, on);
        false
    }
}

/// A byte buffer of fixed capacity in memory aligned for direct I/O: what
/// a [`BlockReader`] reads into and what a [`BlockWriter`]'s producer
/// fills, so that whole aligned blocks reach `O_DIRECT` without a copy.
/// Bytes are zeroed only the first time they are handed out unwritten,
/// as `Vec` would touch them, so pages a buffer never uses never become
/// resident; after that its bytes past `len` hold whatever an earlier use
/// left.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    len: usize,
    /// Bytes from the start that have been written or zeroed: `len <= init`.
    init: usize,
}

// SAFETY: the buffer is owned memory, moved between threads as a whole.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared, it hands out only `&[u8]` views; nothing mutates
// through `&AlignedBuf`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(cap: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(cap, DIRECT_ALIGN).expect("valid aligned layout")
    }

    fn new(cap: usize) -> Self {
        assert!(
            cap > 0 && cap.is_multiple_of(DIRECT_ALIGN),
            "whole aligned requests"
        );
        // Not zeroed here: for an alignment past the allocator's own, std
        // zeroes with a write, which faults every page in up front (the
        // sort phase waited 0.95 s for its first chunk of about 300 MiB,
        // a read of 0.17 s at the measured rates), and a writer's
        // worst-case compressed blocks would be resident whole.
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc(Self::layout(cap)) };
        let ptr = std::ptr::NonNull::new(ptr)
            .unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout(cap)));
        Self {
            ptr,
            cap,
            len: 0,
            init: 0,
        }
    }

    /// An empty buffer of at least `cap` bytes (whole aligned pages).
    pub fn with_capacity(cap: usize) -> Self {
        Self::new(aligned_bytes(cap))
    }

    /// The buffer, advised to stay on base pages rather than the
    /// transparent huge pages the process's heap asks for: a fresh huge
    /// page costs far more to fault in, and what a reader fills is read
    /// in order or gathered from once. On the VM of the 8 GB benchmark,
    /// touching 880 MiB of fresh memory took 1.7-2.5 s on huge pages
    /// against 0.56-0.58 s on base pages, and a direct read into it ran at
    /// 369-607 MB/s against 1626-1891 MB/s (a `madvise`d `mmap`, page
    /// cache dropped before each). The sort read its first two chunks at
    /// 361 and 391 MB/s (`strace -T`), the rest at about 2 GB/s into the
    /// same buffers reused. On base pages its sort phase took 7.48-7.64 s
    /// against 9.90-10.18 s, and the whole sort 14.57-16.40 s against
    /// 17.26-17.98 s (three alternating pairs, `insitu extsort`, `--mem
    /// 2048MiB`, plain runs, page cache dropped); the merge's gathers from
    /// the run kept in memory took a little longer (merging 3.16-3.37 s
    /// against 2.88-3.06 s).
    ///
    /// The advice ([`advise_base_pages`]) stays with the memory after the
    /// buffer is freed. Under `insitu extsort` that is harmless: glibc's
    /// mmap threshold is lowered first ([`return_freed_buffers`]), so
    /// every buffer this large is a mapping of its own, unmapped when
    /// dropped.
    fn on_base_pages(self) -> Self {
        advise_base_pages(self.ptr.as_ptr(), self.cap);
        self
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Appends `bytes`, which must fit: the buffer does not grow.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        let room = self.cap - self.len;
        assert!(
            bytes.len() <= room,
            "{} bytes appended to an aligned buffer with room for {room}",
            bytes.len()
        );
        // SAFETY: `len + bytes.len() <= cap`; the source is a distinct slice.
        unsafe {
            let end = self.ptr.as_ptr().add(self.len);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), end, bytes.len());
        }
        self.len += bytes.len();
        self.init = self.init.max(self.len);
    }

    /// Makes the buffer `len` bytes long (at most its capacity) and
    /// returns them, to be overwritten: unlike `Vec::resize`, bytes are
    /// cleared only the first time they are handed out, not on every use,
    /// which would cost a pass over the block.
    pub fn resize_for_overwrite(&mut self, len: usize) -> &mut [u8] {
        assert!(
            len <= self.cap,
            "{len} bytes in an aligned buffer of {}",
            self.cap
        );
        self.len = len;
        if len > self.init {
            // SAFETY: `init..len` lies inside the `cap`-byte allocation.
            unsafe {
                let fresh = self.ptr.as_ptr().add(self.init);
                std::ptr::write_bytes(fresh, 0, len - self.init);
            }
            self.init = len;
        }
        // SAFETY: the first `len <= init` bytes are initialized, and
        // `&mut self` makes this the only view of them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }

    /// Reads bytes of `file` from `offset` into the buffer's first
    /// `request` bytes (at most its capacity) until `need` or more have
    /// arrived or the file ends; the buffer then holds what was read, and
    /// the count is returned. Bytes never handed out before are read
    /// into untouched: not zeroed first, as
    /// [`AlignedBuf::resize_for_overwrite`] would, so the kernel faults
    /// the pages in while the storage fills them. On a VM where a fresh
    /// page costs the host a fault too, 880 MiB read with `O_DIRECT` into
    /// untouched memory took 0.69-0.74 s, and zeroing it first took
    /// 0.64-0.68 s before a read of 0.56-0.90 s; the 8 GB sort's phase
    /// (`insitu extsort`, `--mem 2048MiB`, plain runs, page cache
    /// dropped) took 10.90-11.60 s against 11.71-12.53 s.
    pub fn read_at(
        &mut self,
        file: &File,
        offset: u64,
        request: usize,
        need: usize,
    ) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        assert!(
            need <= request && request <= self.cap,
            "a read of {need}..{request} bytes into an aligned buffer of {}",
            self.cap
        );
        self.len = 0;
        let mut got = 0;
        while got < need {
            let at = i64::try_from(offset + got as u64).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("offset {} past what a read addresses", offset + got as u64),
                )
            })?;
            // SAFETY: `got..request` lies inside the `cap`-byte allocation,
            // which nothing else views while `&mut self` is held; the
            // kernel writes at most `request - got` bytes there.
            let r = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    self.ptr.as_ptr().add(got).cast(),
                    request - got,
                    at,
                )
            };
            match r {
                // A direct read past the end of the file returns what is there.
                0 => break,
                r if r > 0 => {
                    got += r as usize;
                    // The kernel wrote `..got`: those bytes are initialized.
                    self.init = self.init.max(got);
                }
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        self.len = got;
        Ok(got)
    }

    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends as much of `bytes` as fits; returns how much.
    fn push(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.cap - self.len);
        self.extend_from_slice(&bytes[..n]);
        n
    }

    fn is_full(&self) -> bool {
        self.len == self.cap
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len <= init` bytes are initialized.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: the first `len <= init` bytes are initialized, and
        // `&mut self` makes this the only view of them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

/// What the storage under a directory sustains, in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    /// Sequential reads alone.
    pub read: f64,
    /// Sequential writes alone.
    pub write: f64,
    /// Bytes read plus bytes written while one stream reads and another
    /// writes at once, as both phases of the sort do. Storage with
    /// separate read and write channels reaches `read + write`; storage
    /// whose reads and writes share one reaches less: this machine's
    /// virtual disk moved 1.61-1.84 GB/s in all, against 1.41-1.48 GB/s
    /// reading and 1.78-2.04 GB/s writing alone (three probes).
    pub mixed: f64,
}

/// Requests of the probe: the readers' and the direct writer's unit.
const PROBE_REQUEST_BYTES: usize = 1 << 20;
/// Largest request of the probe's mixed measurement: larger ones would
/// leave it too few requests to time on a 128 MiB probe.
const PROBE_MIXED_REQUEST_BYTES_MAX: usize = 8 << 20;

/// The storage under `dir`, measured with `bytes` each way: written as the
/// sort's writers write (direct where possible) and fsynced, then dropped
/// from the page cache and read back as the readers read, in 1 MiB
/// requests; then read once more while a second file is written, until
/// one of the two streams is done, in requests of up to 8 MiB (the
/// buffers of both streams within `buffer_bytes_max`, or 1 MiB requests).
pub fn measure_bandwidth(dir: &Path, bytes: u64, buffer_bytes_max: usize) -> Result<Bandwidth> {
    const REQUEST: usize = PROBE_REQUEST_BYTES;
    remove_stale(dir, |n| n.strip_prefix(PROBE_PREFIX));
    let path = dir.join(format!("{PROBE_PREFIX}{}", process_tag()));
    let _cleanup = RemoveOnDrop(path.clone());
    let requests = bytes.div_ceil(REQUEST as u64).max(1);
    let start = Instant::now();
    let (file, _) = probe_write(&path, (REQUEST, requests), &|| false)?;
    let write = (requests * REQUEST as u64) as f64 / start.elapsed().as_secs_f64();
    drop_cache(&file);
    let start = Instant::now();
    probe_read(&path, (REQUEST, requests), &|| false)?;
    let read = (requests * REQUEST as u64) as f64 / start.elapsed().as_secs_f64();
    drop_cache(&file);
    // Requests of 8 MiB where `buffer_bytes_max` allows: in 1 MiB requests
    // the mixed rate read 1.74-2.18 GB/s where a merge moved 1.6-1.74
    // GB/s; in 8 MiB, 1.61-1.84 GB/s. The phase holds two requests.
    let per_request = (PROBE_MIXED_REQUEST_BYTES_MAX.min(buffer_bytes_max / 2) / REQUEST).max(1);
    let mixed_requests = (requests as usize / per_request).max(1) as u64;
    let mixed_request = REQUEST * per_request.min(requests as usize);
    let mixed = measure_mixed(&path, (mixed_request, mixed_requests))?;
    Ok(Bandwidth { read, write, mixed })
}

const PROBE_MIXED_SUFFIX: &str = "-mixed";

/// Bytes per second read and written in all while `path` (at least
/// `requests` long, not cached) is read and a second file written at once,
/// in the same requests:
/// both streams stop when the first is done, and what both moved until
/// then counts.
fn measure_mixed(path: &Path, requests: (usize, u64)) -> Result<f64> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let other = PathBuf::from(format!("{}{PROBE_MIXED_SUFFIX}", path.display()));
    let _cleanup = RemoveOnDrop(other.clone());
    let done = AtomicBool::new(false);
    let stop = || done.load(Ordering::Relaxed);
    let start = Instant::now();
    let (read, written) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let n = probe_read(path, requests, &stop);
            done.store(true, Ordering::Relaxed);
            n
        });
        let written = probe_write(&other, requests, &stop).map(|(_, n)| n);
        done.store(true, Ordering::Relaxed);
        let read = reader.join().unwrap_or_else(|_| {
            Err(ExtsortError::Invalid(
                "the storage probe's reader thread panicked".into(),
            ))
        });
        (read, written)
    });
    let secs = start.elapsed().as_secs_f64();
    Ok((read? + written?) as f64 / secs)
}

/// Writes `requests` requests of `req` bytes to a new file at `path`
/// through the sort's direct writer (staging one request), fewer if `stop`
/// turns true first, and fsyncs; returns the file and the bytes written.
fn probe_write(
    path: &Path,
    (req, requests): (usize, u64),
    stop: &dyn Fn() -> bool,
) -> Result<(File, u64)> {
    assert!(
        req.is_multiple_of(PROBE_REQUEST_BYTES),
        "whole probe requests"
    );
    // One probe request's bytes, staged `req / PROBE_REQUEST_BYTES` times
    // per request: the probe holds the staging buffer, not a second copy.
    let buf: Vec<u8> = (0..PROBE_REQUEST_BYTES)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .open(path)
        .map_err(io_err(path))?;
    let mut sink = DirectSink::new(file, path, req)?;
    let mut written = 0;
    while written < requests * req as u64 && !stop() {
        for _ in 0..req / PROBE_REQUEST_BYTES {
            sink.write(&buf)?;
        }
        written += req as u64;
    }
    let file = sink.finish()?;
    file.sync_all().map_err(io_err(path))?;
    Ok((file, written))
}

/// Reads the first `requests` requests of `req` bytes of `path` as the
/// sort's readers read, fewer if `stop` turns true first; returns the
/// bytes read.
fn probe_read(path: &Path, (req, requests): (usize, u64), stop: &dyn Fn() -> bool) -> Result<u64> {
    let (file, direct) = open_for_reading(path)?;
    let mut buf = AlignedBuf::new(req + 2 * DIRECT_ALIGN);
    let mut read = 0;
    for i in 0..requests {
        if stop() {
            break;
        }
        let at = i * req as u64;
        read_block(&file, direct, at, req, &mut buf).map_err(io_err(path))?;
        read += req as u64;
    }
    Ok(read)
}

/// Asks the kernel to drop `file`'s clean pages from the page cache.
pub fn drop_cache(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: advice on an open descriptor; it changes no data.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Makes large buffers go back to the OS when freed. glibc raises its
/// mmap threshold after big frees and then keeps freed buffers in its
/// heap, so a sort phase's buffers would stay resident through the merge
/// phase and the process would hold more than the budget.
pub fn return_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
}

/// Resident memory of this process now, in bytes (0 if unknown).
pub fn current_rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let page = page_bytes() as u64;
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .map_or(0, |pages| pages * page)
}

/// Peak resident memory of this process so far, in bytes: the high-water
/// mark of its own address space (`VmHWM`). `getrusage`'s `ru_maxrss` is
/// not used where `/proc` answers: it also counts the process before its
/// `exec`, so a sort started by a large parent through `fork` reported the
/// parent's size (a 424 MiB peak for an 8 MiB sort spawned from a test
/// process holding 420 MiB).
pub fn peak_rss_bytes() -> u64 {
    if let Some(hwm) = proc_status_kib("VmHWM:") {
        return hwm * 1024;
    }
    // SAFETY: getrusage fills the struct we pass; zeroed is a valid start.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0 {
            return usage.ru_maxrss as u64 * 1024;
        }
    }
    0
}

/// A `kB` field of `/proc/self/status`, such as `VmHWM:`.
fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_covers_memory_touched_since_start() {
        let before = peak_rss_bytes();
        assert!(before > 0, "no peak RSS on this system");
        let touched = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(current_rss_bytes() >= 64 << 20);
        assert!(
            peak_rss_bytes() >= before.max(64 << 20),
            "{}",
            peak_rss_bytes()
        );
        drop(touched);
    }

    #[test]
    fn an_exited_child_not_yet_reaped_does_not_run() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(process_runs(child.id()));
        child.kill().unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while process_runs(child.id()) && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!process_runs(child.id()), "a zombie does not run");
        child.wait().unwrap();
        assert!(!process_runs(999_999_999));
    }

    #[test]
    fn a_tag_names_a_live_process_only_while_it_runs() {
        let me = std::process::id();
        assert_eq!(tag_is_live(&process_tag()), Some(true));
        assert_eq!(tag_is_live(&format!("{}-7", process_tag())), Some(true));
        assert_eq!(tag_is_live(&format!("{me}-1")), Some(false), "reused pid");
        assert_eq!(tag_is_live(&format!("{me}")), Some(false), "older name");
        assert_eq!(tag_is_live("999999999-1-0"), Some(false), "gone");
        // pid 1 runs as long as the system does.
        assert_eq!(tag_is_live("1-1"), Some(true));
        assert_eq!(tag_is_live("1"), Some(true));
        assert_eq!(tag_is_live("x-1"), None);
        assert_eq!(tag_is_live(""), None);
    }

    #[test]
    fn atomic_file_appears_only_on_commit_and_stale_temps_go() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        // Temp files of a process that no longer exists (pids stay below
        // 2^22 on Linux) and of an earlier process with this one's pid.
        let stale = [
            dir.path().join(format!(".out{TMP_MARK}999999999")),
            dir.path()
                .join(format!(".out{TMP_MARK}{}-1", std::process::id())),
        ];
        for path in &stale {
            fs::write(path, b"x").unwrap();
        }
        let mut f = AtomicFile::create(&out).unwrap();
        assert!(stale.iter().all(|p| !p.exists()), "stale temps removed");
        f.write_all(b"hello").unwrap();
        assert!(!out.exists());
        drop(f);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "abandoned temp removed"
        );
        let mut f = AtomicFile::create(&out).unwrap();
        f.write_all(b"hello").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"hello");
    }

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

    /// Whole aligned pages in aligned memory go to the file as they are;
    /// a tail after them waits in one page; anything else is staged in a
    /// request, and so is everything after it (the file offsets of direct
    /// requests must stay aligned). The file holds every byte in order
    /// either way.
    #[test]
    fn direct_sink_writes_whole_pages_in_place_and_stages_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let block = |len: usize, seed: u8| {
            let mut b = AlignedBuf::with_capacity(len);
            let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect();
            b.extend_from_slice(&bytes);
            b
        };
        let staged = |sink: &DirectSink| sink.staging.as_ref().map(AlignedBuf::capacity);
        // A stream of whole-page blocks, then a last one with a tail.
        let path = dir.path().join("pages");
        let mut sink = DirectSink::new(File::create(&path).unwrap(), &path, 8192).unwrap();
        let pieces = [block(8192, 3), block(4096, 5)];
        for piece in &pieces {
            sink.write(piece).unwrap();
        }
        assert_eq!(staged(&sink), None, "whole pages are not staged");
        let last = block(8192 + 100, 7);
        sink.write(&last).unwrap();
        let page = sink.direct.then_some(DIRECT_ALIGN);
        assert_eq!(staged(&sink), page, "a tail takes one page");
        sink.finish().unwrap();
        let mut want: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        want.extend_from_slice(&last);
        assert_eq!(fs::read(&path).unwrap(), want);
        // Bytes after a tail, or not in aligned memory: staged in a request.
        let path = dir.path().join("mixed");
        let mut sink = DirectSink::new(File::create(&path).unwrap(), &path, 8192).unwrap();
        let odd = block(4096, 11);
        let pieces = [
            &block(4096 + 100, 13)[..],
            &block(4096, 17)[..],
            &odd[1..],
            &block(300_000, 19)[..],
        ];
        for piece in pieces {
            sink.write(piece).unwrap();
        }
        let request = sink.direct.then_some(staging_request_bytes(8192));
        assert_eq!(staged(&sink), request, "the rest is staged");
        sink.finish().unwrap();
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(fs::read(&path).unwrap(), want);
    }

    #[test]
    fn aligned_block_records_fill_whole_pages_when_they_can() {
        for (bytes, record) in [
            (32usize << 20, 100usize),
            (1 << 20, 100),
            (12_345_678, 1),
            (80 << 20, 4097),
        ] {
            let gcd = (1..=record)
                .rev()
                .find(|d| record.is_multiple_of(*d) && DIRECT_ALIGN.is_multiple_of(*d));
            let pages_unit = DIRECT_ALIGN / gcd.unwrap();
            let n = aligned_block_records(bytes, record);
            assert!(n * record <= bytes, "{bytes} {record}");
            assert!(
                (n * record).is_multiple_of(DIRECT_ALIGN),
                "{bytes} {record}"
            );
            assert!((n + pages_unit) * record > bytes, "the most that fit");
        }
        assert_eq!(aligned_block_records(9 << 20, 4097), (9 << 20) / 4097);
        assert_eq!(aligned_block_records(32 << 20, 100), 334_848);
        assert_eq!(
            aligned_block_records(1_000, 100),
            10,
            "too small for a page"
        );
        assert_eq!(aligned_block_records(50, 100), 1, "at least one record");
        assert_eq!(aligned_block_records(3 * DIRECT_ALIGN, DIRECT_ALIGN), 3);
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

    /// A read into a buffer's untouched bytes leaves it holding exactly
    /// what arrived, also when the file ends before what was needed, and
    /// a reused buffer holds only the latest read.
    #[test]
    fn aligned_read_holds_what_arrived() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..2 * 4096 + 7u32).map(|i| (i % 253) as u8).collect();
        fs::write(&src, &data).unwrap();
        let file = File::open(&src).unwrap();
        let mut buf = AlignedBuf::with_capacity(3 * 4096);
        let got = buf.read_at(&file, 0, 3 * 4096, 3 * 4096).unwrap();
        assert_eq!(got, data.len(), "the file ends first");
        assert!(buf.as_slice() == &data[..]);
        let got = buf.read_at(&file, 4096, 4096, 10).unwrap();
        assert!(got >= 10 && buf.as_slice() == &data[4096..4096 + got]);
        assert_eq!(buf.read_at(&file, data.len() as u64, 4096, 1).unwrap(), 0);
        assert!(buf.is_empty());
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
