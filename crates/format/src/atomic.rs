//! Atomic replacement of small files: write a temp file, fsync, rename, fsync
//! the directory. Readers see the old or the new content, never a mix.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use insitu_wire::{Manifest, MANIFEST_FILE};

use crate::{io_err, FormatResult};

/// Writes `bytes` to `path` atomically.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> FormatResult<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
        fs::rename(&tmp, path).map_err(io_err(path))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Makes a rename in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> FormatResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Replaces the manifest of the device directory `dir`.
pub fn store_manifest(dir: &Path, manifest: &Manifest) -> FormatResult<()> {
    write_atomically(&dir.join(MANIFEST_FILE), &manifest.to_json())
}

/// Reads the manifest of the device directory `dir`; a directory without
/// one holds no tables yet.
pub fn load_manifest(dir: &Path, device: u32) -> FormatResult<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    match fs::read(&path) {
        Ok(bytes) => Ok(Manifest::from_json(&bytes, &path.display().to_string())?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Manifest::new(device)),
        Err(e) => Err(io_err(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        write_atomically(&p, b"one").unwrap();
        write_atomically(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.json")]);
    }

    #[test]
    fn missing_manifest_is_empty_truncated_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_manifest(dir.path(), 0).unwrap().tables.is_empty());
        fs::write(dir.path().join(MANIFEST_FILE), b"{\"version\": 1, \"dev").unwrap();
        let err = load_manifest(dir.path(), 0).unwrap_err().to_string();
        assert!(
            err.contains("manifest.json") && err.contains("not a valid manifest"),
            "{err}"
        );
    }
}
