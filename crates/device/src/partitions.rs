//! The device's partitions as the host reads and writes them: range reads
//! for pull mode, partition writes that become visible only when complete,
//! and dropping tables.

use std::ops::Range;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use insitu_format::{store_manifest, PartitionWriter, WriterOptions};
use insitu_wire::{FormatDescriptor, Manifest};
use object_store::ObjectStoreExt;

use crate::{Device, DeviceError, DeviceErrorKind, DeviceResult};

impl Device {
    /// Reads a byte range of a partition file (pull mode: the host reads the
    /// device's files through the link, like a data-lake reader).
    pub async fn read_range(
        self: &Arc<Self>,
        table: &str,
        partition: u32,
        range: Range<u64>,
    ) -> DeviceResult<Bytes> {
        let d = self
            .manifest()
            .partition(table, partition)
            .cloned()
            .ok_or_else(|| {
                self.err(
                    DeviceErrorKind::NotFound,
                    format!("holds no partition {partition} of table {table}"),
                )
            })?;
        if range.start > range.end || range.end > d.byte_size {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                format!(
                    "range {range:?} is outside table {table} partition {partition} ({} bytes)",
                    d.byte_size
                ),
            ));
        }
        let path = object_store::path::Path::from_absolute_path(self.dir.join(&d.file))
            .map_err(|e| self.err(DeviceErrorKind::NotFound, e.to_string()))?;
        let store = Arc::clone(&self.store);
        let id = self.config.id;
        self.runtime()
            .spawn(async move { store.get_range(&path, range).await })
            .await
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Execution, e.to_string()))?
            .map_err(|e| DeviceError::new(id, DeviceErrorKind::Execution, e.to_string()))
    }

    /// Writes one partition of `table` from `batches` and records it in the
    /// manifest. The partition becomes visible only when complete.
    pub fn write_partition(
        &self,
        table: &str,
        partition: u32,
        schema: SchemaRef,
        batches: impl IntoIterator<Item = Result<RecordBatch, arrow::error::ArrowError>>,
        options: &WriterOptions,
    ) -> DeviceResult<FormatDescriptor> {
        let io =
            |e: insitu_format::FormatError| self.err(DeviceErrorKind::Execution, e.to_string());
        let mut writer =
            PartitionWriter::create(&self.dir, table, partition, schema, options).map_err(io)?;
        for batch in batches {
            let batch = batch.map_err(|e| self.err(DeviceErrorKind::Execution, e.to_string()))?;
            writer.write(&batch).map_err(io)?;
        }
        let descriptor = writer.finish().map_err(io)?;
        self.publish(descriptor)
    }

    /// Records a finished partition in the manifest: from now on it is visible.
    pub(crate) fn publish(&self, descriptor: FormatDescriptor) -> DeviceResult<FormatDescriptor> {
        let io =
            |e: insitu_format::FormatError| self.err(DeviceErrorKind::Execution, e.to_string());
        self.counters
            .partitions_ingested
            .fetch_add(1, Ordering::Relaxed);
        let mut manifest = self.manifest.lock().expect("manifest lock");
        let mut next = manifest.clone();
        next.upsert(descriptor.clone());
        store_manifest(&self.dir, &next).map_err(io)?;
        *manifest = next;
        Ok(descriptor)
    }

    /// Removes a table: first from the manifest (atomically), then its files.
    pub fn drop_table(&self, table: &str) -> DeviceResult<()> {
        let mut manifest = self.manifest.lock().expect("manifest lock");
        let Some(parts) = manifest.tables.get(table).cloned() else {
            return Ok(());
        };
        let mut next = manifest.clone();
        next.tables.remove(table);
        store_manifest(&self.dir, &next)
            .map_err(|e| self.err(DeviceErrorKind::Execution, e.to_string()))?;
        *manifest = next;
        for d in parts {
            let _ = std::fs::remove_file(self.dir.join(&d.file));
        }
        Ok(())
    }
}

/// Removes partition files a crashed writer left behind (`.NNNNN.parquet.tmp`
/// in a table directory); they were never in the manifest.
pub(crate) fn remove_stale_temp_files(dir: &Path, manifest: &Manifest) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for table_dir in entries.flatten().filter(|e| e.path().is_dir()) {
        let Ok(files) = std::fs::read_dir(table_dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                tracing::info!(device = manifest.device, file = %f.path().display(), "removing stale temp file");
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
}
