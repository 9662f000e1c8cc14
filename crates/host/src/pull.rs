//! Pull mode's object store: the host's DataFusion reads device files through
//! this store, and every range read crosses the device's link. The host
//! never opens a device file itself.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, Result,
};

use crate::catalog::TableInfo;
use insitu_client::DeviceClient;

/// URL under which the pull store is registered.
pub const PULL_STORE_URL: &str = "insitu://devices/";

/// Object path of a partition file in the pull store.
pub fn pull_path(device: u32, table: &str, partition: u32) -> String {
    format!("dev{device}/{table}/{partition}")
}

#[derive(Debug, Clone)]
struct Object {
    client: Arc<dyn DeviceClient>,
    table: String,
    partition: u32,
    size: u64,
}

/// Read-only store over every device's partition files.
#[derive(Debug)]
pub struct PullStore {
    objects: HashMap<String, Object>,
}

impl PullStore {
    pub fn new<'a>(tables: impl IntoIterator<Item = &'a TableInfo>) -> Self {
        let mut objects = HashMap::new();
        for table in tables {
            for share in &table.shares {
                for d in &share.descriptors {
                    objects.insert(
                        pull_path(share.client.id(), &d.table, d.partition),
                        Object {
                            client: Arc::clone(&share.client),
                            table: d.table.clone(),
                            partition: d.partition,
                            size: d.byte_size,
                        },
                    );
                }
            }
        }
        Self { objects }
    }

    fn object(&self, location: &Path) -> Result<&Object> {
        self.objects
            .get(location.as_ref())
            .ok_or_else(|| object_store::Error::NotFound {
                path: location.to_string(),
                source: "no such partition on any device".into(),
            })
    }

    fn meta(location: &Path, o: &Object) -> ObjectMeta {
        ObjectMeta {
            location: location.clone(),
            last_modified: chrono::DateTime::<chrono::Utc>::UNIX_EPOCH,
            size: o.size,
            e_tag: None,
            version: None,
        }
    }

    async fn read(&self, o: &Object, range: Range<u64>) -> Result<Bytes> {
        o.client
            .read_range(&o.table, o.partition, range)
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "insitu-pull",
                source: Box::new(e),
            })
    }
}

impl fmt::Display for PullStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PullStore({} partitions)", self.objects.len())
    }
}

fn read_only() -> object_store::Error {
    object_store::Error::NotSupported {
        source: "the pull store is read-only".into(),
    }
}

fn resolve(range: Option<GetRange>, size: u64) -> Range<u64> {
    match range {
        None => 0..size,
        Some(GetRange::Bounded(r)) => r.start.min(size)..r.end.min(size),
        Some(GetRange::Offset(o)) => o.min(size)..size,
        Some(GetRange::Suffix(n)) => size.saturating_sub(n)..size,
    }
}

#[async_trait]
impl ObjectStore for PullStore {
    async fn put_opts(&self, _: &Path, _: PutPayload, _: PutOptions) -> Result<PutResult> {
        Err(read_only())
    }

    async fn put_multipart_opts(
        &self,
        _: &Path,
        _: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Err(read_only())
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let o = self.object(location)?;
        let meta = Self::meta(location, o);
        let range = resolve(options.range.clone(), o.size);
        let payload = if options.head {
            Bytes::new()
        } else {
            self.read(o, range.clone()).await?
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(payload) }).boxed(),
            ),
            meta,
            range,
            attributes: Attributes::default(),
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let o = self.object(location)?;
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            out.push(self.read(o, r.clone()).await?);
        }
        Ok(out)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        locations.map(|_| Err(read_only())).boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let prefix = prefix.map(|p| p.to_string()).unwrap_or_default();
        let metas: Vec<_> = self
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .map(|(k, o)| Ok(Self::meta(&Path::from(k.as_str()), o)))
            .collect();
        futures::stream::iter(metas).boxed()
    }

    async fn list_with_delimiter(&self, _prefix: Option<&Path>) -> Result<ListResult> {
        Err(object_store::Error::NotImplemented {
            operation: "list_with_delimiter".into(),
            implementer: "insitu PullStore".into(),
        })
    }

    async fn copy_opts(&self, _: &Path, _: &Path, _: CopyOptions) -> Result<()> {
        Err(read_only())
    }
}

/// What a pull scan reads: the partition files of `shares`, through the
/// link, as DataFusion's Parquet scan (or the hybrid scan) reads a lake.
pub struct PullScan<'a> {
    pub shares: &'a [crate::catalog::DeviceShare],
    /// The table's full schema.
    pub schema: &'a arrow::datatypes::SchemaRef,
    /// The table's planning statistics.
    pub statistics: &'a datafusion::common::Statistics,
    pub projection: Option<&'a Vec<usize>>,
    /// Over `schema`: prunes row groups and pages (the rows it keeps are
    /// still filtered above).
    pub predicate: Option<Arc<dyn datafusion::physical_expr::PhysicalExpr>>,
    pub limit: Option<usize>,
}

/// The host plan of a pull scan.
pub fn pull_source(
    scan: &PullScan<'_>,
    config: &datafusion::config::ConfigOptions,
) -> datafusion::common::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
    use datafusion::datasource::source::DataSourceExec;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::physical_plan::union::UnionExec;
    use datafusion::physical_plan::ExecutionPlan;
    use insitu_stage::{HybridFile, HybridScanExec};
    use insitu_wire::LayoutKind;

    let schema = scan.schema;
    let mut source = ParquetSource::new(Arc::clone(schema));
    if let Some(predicate) = &scan.predicate {
        source = source.with_predicate(Arc::clone(predicate));
    }
    let mut builder =
        FileScanConfigBuilder::new(ObjectStoreUrl::parse(PULL_STORE_URL)?, Arc::new(source))
            .with_statistics(pull_statistics(scan.statistics));
    let mut any = false;
    let mut hybrid = vec![];
    for share in scan.shares {
        for d in &share.descriptors {
            let path = pull_path(share.client.id(), &d.table, d.partition);
            if d.layout == LayoutKind::Hybrid {
                hybrid.push(HybridFile::new(path.into(), d.clone())?);
                continue;
            }
            builder = builder.with_file(PartitionedFile::new(path, d.byte_size));
            any = true;
        }
    }
    let target = config.execution.target_partitions;
    let hybrid_scan = (!hybrid.is_empty())
        .then(|| {
            HybridScanExec::try_new(
                ObjectStoreUrl::parse(PULL_STORE_URL)?,
                hybrid,
                Arc::clone(schema),
                scan.projection.cloned(),
                target,
            )
        })
        .transpose()?
        .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>);
    if let Some(h) = &hybrid_scan {
        if !any {
            return Ok(Arc::clone(h));
        }
    }
    if !any {
        let projected = match scan.projection {
            Some(p) => Arc::new(schema.project(p)?),
            None => Arc::clone(schema),
        };
        return Ok(Arc::new(EmptyExec::new(projected)));
    }
    let file_scan = builder
        .with_projection_indices(scan.projection.cloned())?
        .with_limit(scan.limit)
        .build();
    let exec: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(file_scan);
    let exec = exec.repartitioned(target, config)?.unwrap_or(exec);
    match hybrid_scan {
        Some(h) => UnionExec::try_new(vec![exec, h]),
        None => Ok(exec),
    }
}

/// The table's statistics for a pull scan, without a byte size: the scan
/// projects them keeping the whole table's size, which would make the
/// join planner build on the side that reads fewer columns, not the
/// smaller one; without it, the planner weighs rows.
fn pull_statistics(table: &datafusion::common::Statistics) -> datafusion::common::Statistics {
    let mut stats = table.clone();
    stats.total_byte_size = datafusion::common::stats::Precision::Absent;
    stats
}
