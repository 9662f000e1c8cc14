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

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::io::{io_err, measure_bandwidth, AtomicFile, Bandwidth};
use crate::Result;

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
    /// ([`crate::io::Bandwidth::mixed`]).
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
