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
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Wraps a store and counts the bytes its reads return.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn ObjectStore>,
    bytes_read: Arc<AtomicU64>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn ObjectStore>, bytes_read: Arc<AtomicU64>) -> Self {
        Self { inner, bytes_read }
    }
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
        let out = self.inner.get_ranges(location, ranges).await?;
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
