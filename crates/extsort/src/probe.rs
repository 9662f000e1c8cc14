//! The storage's read and write rates for the model: measured by a probe
//! of the run directory, or reused from an earlier sort on the same
//! device.
//!
//! ```text
//!  run dir ──st_dev──▶ cache line "dev read write mixed at probe_bytes" younger
//!                      than storage_rates_age_max, from a probe at least
//!                      this sort's size? ──yes──▶ reuse
//!                                  │ no (or --reprobe)
//!                                  ▼
//!                      probe (write, fsync, read, then read and write at
//!                      once, probe_bytes each) ──▶ rewrite
//!                      the cache: temp file, fsync, rename
//! ```
//!
//! The probe writes and reads up to 128 MiB twice, a fifth to a third of
//! a second per sort here; the rates only steer the plan (run size, fan-in,
//! codec), never the result, so a rate an hour old is as good a guide as a
//! fresh one on a disk whose rates swing between runs anyway. A cache that
//! cannot be read or written is ignored (and the rates measured), and so
//! is a line in an older format (without the mixed rate).

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::blocks::{open_for_reading, read_block};
use crate::direct::{AlignedBuf, DirectSink, DIRECT_ALIGN};
use crate::files::{io_err, process_tag, remove_stale, AtomicFile, PROBE_PREFIX};
use crate::{ExtsortError, Result};

/// Oldest cached rates a sort reuses (`storage_rates_age_max`).
pub const STORAGE_RATES_AGE_MAX: Duration = Duration::from_secs(3600);

/// Devices the cache remembers at most; the oldest entries go first.
const CACHED_DEVICES_MAX: usize = 64;

/// Read and write rates of one device, in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StorageRates {
    pub read: f64,
    pub write: f64,
    /// Read plus written while reading and writing at once
    /// ([`Bandwidth::mixed`]).
    pub mixed: f64,
    /// How long ago the cached rates were measured; `None` if just now.
    pub cached_age: Option<Duration>,
}

/// Where the rates are cached by default: `$XDG_CACHE_HOME/insitu`, else
/// `~/.cache/insitu`; `None` without either.
pub fn default_cache_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("insitu").join("storage-rates"))
}

/// The rates of the storage under `dir`: cached in `cache` if measured on
/// the same device within [`STORAGE_RATES_AGE_MAX`] with a probe of at
/// least `probe_bytes` (a small sort's small probe does not stand for a
/// large one's) and `reprobe` is false; else measured with `probe_bytes`
/// (and cached), its buffers within `buffer_bytes_max` where requests of
/// 1 MiB allow it ([`measure_bandwidth`]).
pub fn storage_rates(
    dir: &Path,
    probe_bytes: u64,
    buffer_bytes_max: usize,
    cache: Option<&Path>,
    reprobe: bool,
) -> Result<StorageRates> {
    let device = device_of(dir)?;
    let now = SystemTime::now();
    if let (Some(cache), false) = (cache, reprobe) {
        if let Some(found) = read_cache(cache, device, probe_bytes, now) {
            return Ok(found);
        }
    }
    let Bandwidth { read, write, mixed } = measure_bandwidth(dir, probe_bytes, buffer_bytes_max)?;
    if let Some(cache) = cache {
        let entry = Entry {
            device,
            read,
            write,
            mixed,
            at_unix_secs: now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            probe_bytes,
        };
        if let Err(e) = write_cache(cache, entry, now) {
            tracing::warn!(cache = %cache.display(), error = %e, "cannot cache the storage rates");
        }
    }
    Ok(StorageRates {
        read,
        write,
        mixed,
        cached_age: None,
    })
}

fn device_of(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata(dir).map_err(io_err(dir))?.dev())
}

/// One cache line: device, read, write and mixed rates, when measured,
/// and with how many bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    device: u64,
    read: f64,
    write: f64,
    mixed: f64,
    at_unix_secs: u64,
    probe_bytes: u64,
}

impl Entry {
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_ascii_whitespace();
        let entry = Entry {
            device: fields.next()?.parse().ok()?,
            read: fields.next()?.parse().ok()?,
            write: fields.next()?.parse().ok()?,
            mixed: fields.next()?.parse().ok()?,
            at_unix_secs: fields.next()?.parse().ok()?,
            probe_bytes: fields.next()?.parse().ok()?,
        };
        let rate_ok = |r: f64| r.is_finite() && r > 0.0;
        let rates_ok = [entry.read, entry.write, entry.mixed]
            .into_iter()
            .all(rate_ok);
        (fields.next().is_none() && rates_ok).then_some(entry)
    }

    fn line(&self) -> String {
        format!(
            "{} {:.0} {:.0} {:.0} {} {}\n",
            self.device, self.read, self.write, self.mixed, self.at_unix_secs, self.probe_bytes
        )
    }

    /// Its age at `now`; `None` if it claims to be from the future (or
    /// from past the clock's range).
    fn age(&self, now: SystemTime) -> Option<Duration> {
        let at = UNIX_EPOCH.checked_add(Duration::from_secs(self.at_unix_secs))?;
        now.duration_since(at).ok()
    }
}

/// The cache's well-formed lines; none if it is missing or unreadable.
fn read_entries(cache: &Path) -> Vec<Entry> {
    match std::fs::read_to_string(cache) {
        Ok(text) => text.lines().filter_map(Entry::parse).collect(),
        Err(_) => vec![],
    }
}

fn read_cache(
    cache: &Path,
    device: u64,
    probe_bytes: u64,
    now: SystemTime,
) -> Option<StorageRates> {
    let entry = read_entries(cache)
        .into_iter()
        .rev()
        .find(|e| e.device == device && e.probe_bytes >= probe_bytes)?;
    let age = entry.age(now).filter(|a| *a <= STORAGE_RATES_AGE_MAX)?;
    Some(StorageRates {
        read: entry.read,
        write: entry.write,
        mixed: entry.mixed,
        cached_age: Some(age),
    })
}

/// Replaces the line of `entry`'s device, keeping the other devices'
/// fresh ones.
fn write_cache(cache: &Path, entry: Entry, now: SystemTime) -> Result<()> {
    let fresh = |e: &Entry| e.age(now).is_some_and(|a| a <= STORAGE_RATES_AGE_MAX);
    let mut entries: Vec<Entry> = read_entries(cache)
        .into_iter()
        .filter(|e| e.device != entry.device && fresh(e))
        .collect();
    entries.push(entry);
    let skip = entries.len().saturating_sub(CACHED_DEVICES_MAX);
    let text: String = entries[skip..].iter().map(Entry::line).collect();
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let mut file = AtomicFile::create(cache)?;
    file.write_all(text.as_bytes())?;
    file.commit()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(dir: &Path, cache: &Path, reprobe: bool) -> StorageRates {
        storage_rates(dir, 4 << 20, 4 << 20, Some(cache), reprobe).unwrap()
    }

    #[test]
    fn rates_are_reused_on_the_same_device_until_reprobed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache").join("storage-rates");
        let first = measured(dir.path(), &cache, false);
        assert_eq!(first.cached_age, None);
        assert!(first.read > 0.0 && first.write > 0.0 && first.mixed > 0.0);
        let again = measured(dir.path(), &cache, false);
        assert_eq!(
            (again.read, again.write, again.mixed),
            (first.read.round(), first.write.round(), first.mixed.round())
        );
        assert!(again.cached_age.is_some());
        // The probe's rates never repeat to the byte per second: a second
        // measurement would show.
        let text = std::fs::read_to_string(&cache).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        // A larger sort's probe is not stood for by a smaller one's.
        let larger = storage_rates(dir.path(), 8 << 20, 4 << 20, Some(&cache), false).unwrap();
        assert_eq!(larger.cached_age, None);
        let smaller = measured(dir.path(), &cache, false);
        assert!(smaller.cached_age.is_some());
        let reprobed = measured(dir.path(), &cache, true);
        assert_eq!(reprobed.cached_age, None);
        let leftovers: Vec<_> = std::fs::read_dir(cache.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, vec![std::ffi::OsString::from("storage-rates")]);
    }

    #[test]
    fn stale_future_malformed_and_foreign_lines_are_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("storage-rates");
        let device = device_of(dir.path()).unwrap();
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let old = secs - STORAGE_RATES_AGE_MAX.as_secs() - 1;
        let lines = [
            format!("{device} 1000 2000 1500 {old} 64"),
            format!("{device} 1000 2000 1500 {} 64", secs + 3600),
            format!("{device} 1000 2000 1500 {} 64", u64::MAX),
            format!("{device} NaN 2000 1500 {secs} 64"),
            format!("{device} 0 2000 1500 {secs} 64"),
            format!("{device} 1000 2000 -1 {secs} 64"),
            format!("{device} 1000 2000 1500 {secs}"),
            format!("{device} 1000 2000 1500 {secs} 63"),
            format!("{device} 1000 2000 1500 {secs} 64 extra"),
            format!("{} 1000 2000 1500 {secs} 64", device.wrapping_add(1)),
            // The older format, without the mixed rate.
            format!("{device} 1000 2000 {secs} 64"),
            "garbage".to_string(),
        ];
        for line in &lines {
            std::fs::write(&cache, format!("{line}\n")).unwrap();
            assert_eq!(read_cache(&cache, device, 64, now), None, "{line}");
        }
        let fresh = format!("{device} 1000 2000 1500 {} 128\n", secs - 60);
        std::fs::write(&cache, format!("garbage\n{fresh}")).unwrap();
        let found = read_cache(&cache, device, 64, now).unwrap();
        assert_eq!(
            (found.read, found.write, found.mixed),
            (1000.0, 2000.0, 1500.0)
        );
        assert!(
            found.cached_age >= Some(Duration::from_secs(60)),
            "{found:?}"
        );
    }

    #[test]
    fn rewriting_keeps_other_devices_and_drops_stale_lines() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("storage-rates");
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let stale = secs - STORAGE_RATES_AGE_MAX.as_secs() - 1;
        std::fs::write(
            &cache,
            format!("7 1 2 3 {secs} 1\n8 1 2 3 {stale} 1\n9 5 6 7 {secs} 1\n"),
        )
        .unwrap();
        let entry = Entry {
            device: 9,
            read: 3e9,
            write: 4e9,
            mixed: 5e9,
            at_unix_secs: secs,
            probe_bytes: 1,
        };
        write_cache(&cache, entry, now).unwrap();
        let entries = read_entries(&cache);
        let devices: Vec<u64> = entries.iter().map(|e| e.device).collect();
        assert_eq!(devices, vec![7, 9]);
        assert_eq!(
            (entries[1].read, entries[1].write, entries[1].mixed),
            (3e9, 4e9, 5e9)
        );
    }

    #[test]
    fn a_cache_that_cannot_be_written_does_not_stop_the_sort() {
        let dir = tempfile::tempdir().unwrap();
        // A cache path under a regular file: no directory can be made.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let cache = blocker.join("storage-rates");
        let rates = measured(dir.path(), &cache, false);
        assert_eq!(rates.cached_age, None);
    }
}
