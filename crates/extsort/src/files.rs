//! Files of the external sort that appear only when complete, and run
//! directories a crash cannot leave behind for long: every temporary name
//! carries its process's tag, so the next start removes a dead run's files
//! and never a live one's.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

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
pub(crate) const PROBE_PREFIX: &str = ".insitu-probe-";

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
}
