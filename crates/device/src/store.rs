//! The device's view of its own storage: a local filesystem store that
//! counts every byte read, so "bytes read on the device" is measured, not
//! estimated.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use insitu_kernels::mem::{pooled_buffer, take_vec_filled};

use crate::ipc::BufferBytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Wraps the device's local file system and counts the bytes its reads
/// return.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<LocalFileSystem>,
    bytes_read: Arc<AtomicU64>,
}

impl CountingStore {
    pub fn new(inner: Arc<LocalFileSystem>, bytes_read: Arc<AtomicU64>) -> Self {
        Self { inner, bytes_read }
    }
}

/// Ranges at least this long are read into the kernels' scratch pool
/// (its smallest pooled buffer). A hybrid sort reads each file's row
/// slots and heap (hundreds of MiB) every query, and a Parquet scan its
/// column chunks (tens of KiB to MiBs); fresh buffers for them cost page
/// faults and zeroing on every read.
const POOLED_READ_BYTES_MIN: u64 = 64 << 10;

/// Reads `ranges` of the file at `path`, each into a buffer from the
/// kernels' scratch pool that returns there when the last `Bytes` of it
/// drops.
fn read_pooled(path: &std::path::Path, ranges: &[Range<u64>]) -> std::io::Result<Vec<Bytes>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len();
    ranges
        .iter()
        .map(|r| {
            if r.end < r.start || r.end > size {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("byte range {r:?} is not within the file's {size} bytes"),
                ));
            }
            let len = usize::try_from(r.end - r.start)
                .map_err(|_| std::io::Error::other(format!("byte range {r:?} is too long")))?;
            let mut v: Vec<u8> = take_vec_filled(len);
            file.read_exact_at(&mut v, r.start)?;
            Ok(Bytes::from_owner(BufferBytes(pooled_buffer(v))))
        })
        .collect()
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountingStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountingStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let mut result = self.inner.get_opts(location, options).await?;
        let counter = Arc::clone(&self.bytes_read);
        result.payload = match result.payload {
            GetResultPayload::Stream(s) => GetResultPayload::Stream(
                s.inspect(move |chunk| {
                    if let Ok(b) = chunk {
                        counter.fetch_add(b.len() as u64, Ordering::Relaxed);
                    }
                })
                .boxed(),
            ),
            GetResultPayload::File(file, path) => {
                // Counted as requested: the caller reads exactly this range.
                counter.fetch_add(result.range.end - result.range.start, Ordering::Relaxed);
                GetResultPayload::File(file, path)
            }
        };
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let out = match ranges
            .iter()
            .any(|r| r.end.saturating_sub(r.start) >= POOLED_READ_BYTES_MIN)
        {
            false => self.inner.get_ranges(location, ranges).await?,
            true => {
                let path = self.inner.path_to_filesystem(location)?;
                let wanted = ranges.to_vec();
                let read = tokio::task::spawn_blocking(move || read_pooled(&path, &wanted));
                let generic = |source: Box<dyn std::error::Error + Send + Sync>| {
                    object_store::Error::Generic {
                        store: "LocalFileSystem",
                        source,
                    }
                };
                read.await
                    .map_err(|e| generic(Box::new(e)))?
                    .map_err(|e| match e.kind() {
                        // The same error the plain read gives a missing file.
                        std::io::ErrorKind::NotFound => object_store::Error::NotFound {
                            path: location.to_string(),
                            source: Box::new(e),
                        },
                        _ => generic(format!("reading {location}: {e}").into()),
                    })?
            }
        };
        let n: usize = out.iter().map(Bytes::len).sum();
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranges past `POOLED_READ_BYTES_MIN` take the pooled read: the same
    /// bytes as the plain read, counted, and a clear error past the end or
    /// for a missing file.
    #[tokio::test]
    async fn pooled_reads_return_the_bytes_and_count_them() {
        let dir = tempfile::tempdir().unwrap();
        let len = POOLED_READ_BYTES_MIN as usize + 4097;
        let content: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let file = dir.path().join("part.bin");
        std::fs::write(&file, &content).unwrap();
        let counted = Arc::new(AtomicU64::new(0));
        let store = CountingStore::new(Arc::new(LocalFileSystem::new()), Arc::clone(&counted));
        let location = Path::from_filesystem_path(&file).unwrap();
        let big = 3..len as u64;
        for ranges in [vec![big.clone(), 10..20, 7..7], vec![0..5, 100..200]] {
            counted.store(0, Ordering::Relaxed);
            let got = store.get_ranges(&location, &ranges).await.unwrap();
            assert_eq!(got.len(), ranges.len());
            for (r, bytes) in ranges.iter().zip(&got) {
                assert_eq!(
                    &bytes[..],
                    &content[r.start as usize..r.end as usize],
                    "{r:?}"
                );
            }
            let n: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            assert_eq!(counted.load(Ordering::Relaxed), n);
        }
        let past = 0..len as u64 + 1;
        let past_end = store
            .get_ranges(&location, std::slice::from_ref(&past))
            .await;
        let err = past_end.unwrap_err().to_string();
        assert!(
            err.contains("part.bin") && err.contains("not within the file's"),
            "{err}"
        );
        #[allow(clippy::reversed_empty_ranges)]
        let inverted = [big.clone(), 9..2];
        let err = store.get_ranges(&location, &inverted).await.unwrap_err();
        assert!(err.to_string().contains("9..2"), "{err}");
        let missing = Path::from_filesystem_path(dir.path())
            .unwrap()
            .join("gone.bin");
        let err = store
            .get_ranges(&missing, &[big])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gone.bin") && err.contains("not found"),
            "{err}"
        );
    }
}
