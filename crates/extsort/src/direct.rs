//! Direct I/O: aligned buffers, request sizes that are whole pages, and
//! the sink that writes the sort's blocks straight from memory, staging
//! only what is not a whole number of pages.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use insitu_kernels::mem::advise_base_pages;

use crate::files::io_err;
use crate::Result;

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

/// Bytes of each buffer a [`crate::blocks::BlockReader`] of `block`-byte blocks holds:
/// room for a block that starts and ends mid-page. The planner counts
/// these, not `block`, against the memory budget.
pub fn read_buffer_bytes(block: usize) -> usize {
    (block + 2 * DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN)
}

/// Bytes of staging a [`crate::blocks::BlockWriter`] holds when it writes with
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
pub(crate) struct DirectSink {
    file: Option<File>,
    path: PathBuf,
    direct: bool,
    staging: Option<AlignedBuf>,
    staging_bytes: usize,
}

impl DirectSink {
    /// A sink for a writer of `block`-byte blocks.
    pub(crate) fn new(file: File, path: &Path, block: usize) -> Result<Self> {
        Ok(Self {
            direct: set_direct(&file, true),
            file: Some(file),
            path: path.to_path_buf(),
            staging: None,
            staging_bytes: staging_request_bytes(block),
        })
    }

    pub(crate) fn write(&mut self, mut bytes: &[u8]) -> Result<()> {
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
    pub(crate) fn finish(mut self) -> Result<File> {
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
/// a [`crate::blocks::BlockReader`] reads into and what a [`crate::blocks::BlockWriter`]'s producer
/// fills, so that whole aligned blocks reach `O_DIRECT` without a copy.
/// Bytes are zeroed only the first time they are handed out unwritten,
/// as `Vec` would touch them, so pages a buffer never uses never become
/// resident; after that its bytes past `len` hold whatever an earlier use
/// left.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    pub(crate) cap: usize,
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
    pub(crate) fn layout(cap: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(cap, DIRECT_ALIGN).expect("valid aligned layout")
    }

    pub(crate) fn new(cap: usize) -> Self {
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
    pub(crate) fn on_base_pages(self) -> Self {
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
    pub(crate) fn push(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.cap - self.len);
        self.extend_from_slice(&bytes[..n]);
        n
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len == self.cap
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

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
}
