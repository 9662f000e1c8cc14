//! Binds the partition scans of a decoded stage plan to this device's files.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::common::{DataFusionError, Result};
use datafusion::config::ConfigOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use insitu_format::{schema_of, verify_file};
use insitu_stage::{HybridFile, HybridScanExec, PartitionBinder, PartitionScanExec};
use insitu_wire::{LayoutKind, Manifest};

/// Checksums already verified in this process: (table, partition, crc32).
pub(crate) type VerifiedSet = Arc<Mutex<HashSet<(String, u32, u32)>>>;

#[derive(Debug)]
pub(crate) struct DeviceBinder {
    pub device: u32,
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub verified: VerifiedSet,
    pub config: Arc<ConfigOptions>,
    pub target_partitions: usize,
}

impl DeviceBinder {
    fn plan_err(&self, msg: String) -> DataFusionError {
        DataFusionError::Plan(msg)
    }

    /// Verifies a partition's checksum the first time this process reads it.
    fn verify_once(&self, d: &insitu_wire::FormatDescriptor) -> Result<()> {
        let key = (d.table.clone(), d.partition, d.crc32);
        if self.verified.lock().expect("verified set").contains(&key) {
            return Ok(());
        }
        verify_file(self.device, &self.dir, d)
            .map_err(|e| DataFusionError::Execution(e.to_string()))?;
        self.verified.lock().expect("verified set").insert(key);
        Ok(())
    }
}

impl PartitionBinder for DeviceBinder {
    fn bind(&self, scan: &PartitionScanExec) -> Result<Arc<dyn ExecutionPlan>> {
        let table = scan.table();
        let mut files = Vec::with_capacity(scan.partitions().len());
        let mut hybrid = vec![];
        for p in scan.partitions() {
            let d = self
                .manifest
                .partition(table, *p)
                .ok_or_else(|| self.plan_err(format!("holds no partition {p} of table {table}")))?;
            let stored = schema_of(d).map_err(|e| self.plan_err(e.to_string()))?;
            if stored.fields() != scan.table_schema().fields() {
                return Err(self.plan_err(format!(
                    "table {table} partition {p}: stored schema differs from the plan's"
                )));
            }
            self.verify_once(d)?;
            let path = self.dir.join(&d.file);
            if d.layout == LayoutKind::Hybrid {
                let path = object_store::path::Path::from_absolute_path(&path)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                hybrid.push(HybridFile::new(path, d.clone())?);
                continue;
            }
            files.push(PartitionedFile::new(
                path.display().to_string(),
                d.byte_size,
            ));
        }
        let hybrid_scan = (!hybrid.is_empty())
            .then(|| {
                HybridScanExec::try_new(
                    ObjectStoreUrl::local_filesystem(),
                    hybrid,
                    Arc::clone(scan.table_schema()),
                    scan.projection().map(<[usize]>::to_vec),
                    self.target_partitions,
                )
            })
            .transpose()?
            .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>);
        let parquet_scan = (!files.is_empty())
            .then(|| self.parquet_scan(scan, files))
            .transpose()?;
        match (parquet_scan, hybrid_scan) {
            (Some(p), Some(h)) => Ok(UnionExec::try_new(vec![p, h])?),
            (Some(one), None) | (None, Some(one)) => Ok(one),
            (None, None) => self.parquet_scan(scan, vec![]),
        }
    }
}

impl DeviceBinder {
    fn parquet_scan(
        &self,
        scan: &PartitionScanExec,
        files: Vec<PartitionedFile>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let source = Arc::new(ParquetSource::new(Arc::clone(scan.table_schema())));
        let mut builder = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), source);
        for f in files {
            builder = builder.with_file(f);
        }
        let builder = builder.with_projection_indices(scan.projection().map(<[usize]>::to_vec))?;
        let exec: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(builder.build());
        // Spread the scan over the device's threads by byte ranges (row groups).
        Ok(exec
            .repartitioned(self.target_partitions, &self.config)?
            .unwrap_or(exec))
    }
}
