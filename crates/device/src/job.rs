//! Device-side steps of a table sort job (`insitu sort`): sampling the sort
//! keys so the host can pick range splitters, and sorting the rows of one
//! key range into new partitions.
//!
//! ```text
//!   host: sample_keys on every device -> splitters
//!         scan T, route each row to the device of its key range (staging)
//!         sort_table on every device:   staging --sort--> T2 partitions
//! ```
//!
//! Both run plans built here (not sent by the host) on the device's own
//! runtime and memory pool, through the same binder and kernels as stages.

use std::sync::Arc;

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::{concat_batches, take_record_batch, SortOptions};
use arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::StreamExt;
use insitu_format::{schema_of, PartitionLayout, PartitionWriter, WriterOptions};
use insitu_stage::{PartitionBinder, PartitionScanExec};
use insitu_wire::{FormatDescriptor, SampleKeysRequest, SortTableRequest, SAMPLE_ROWS_MAX};

use crate::{use_kernel_sorts, Device, DeviceErrorKind, DeviceResult};

impl Device {
    /// A scan of every partition of `table` on this device, projected to
    /// `columns` (all when `None`), bound to the local files.
    fn local_scan(
        &self,
        table: &str,
        columns: Option<&[String]>,
    ) -> DeviceResult<(SchemaRef, Arc<dyn ExecutionPlan>)> {
        let manifest = self.manifest();
        let parts = manifest.tables.get(table).cloned().unwrap_or_default();
        let first = parts.first().ok_or_else(|| {
            self.err(
                DeviceErrorKind::NotFound,
                format!("holds no partition of table {table}"),
            )
        })?;
        let schema: SchemaRef = Arc::new(
            schema_of(first).map_err(|e| self.err(DeviceErrorKind::Corrupt, e.to_string()))?,
        );
        let projection = columns
            .map(|cols| {
                cols.iter()
                    .map(|c| {
                        schema.index_of(c).map_err(|_| {
                            self.err(
                                DeviceErrorKind::BadPlan,
                                format!("table {table} has no column {c}"),
                            )
                        })
                    })
                    .collect::<DeviceResult<Vec<usize>>>()
            })
            .transpose()?;
        let ids = parts.iter().map(|d| d.partition).collect();
        let df = |e| self.df_err(e);
        let scan =
            PartitionScanExec::try_new(table, ids, Arc::clone(&schema), projection).map_err(df)?;
        let plan = self.binder(manifest, false).bind(&scan).map_err(df)?;
        Ok((schema, plan))
    }

    fn df_err(&self, e: datafusion::error::DataFusionError) -> crate::DeviceError {
        crate::DeviceError::from_datafusion(self.config.id, self.config.mem_bytes_max, e)
    }

    /// Runs `plan` to one stream on this device's runtime.
    fn stream(&self, plan: Arc<dyn ExecutionPlan>) -> DeviceResult<SendableRecordBatchStream> {
        let plan: Arc<dyn ExecutionPlan> = if plan.output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(plan))
        } else {
            plan
        };
        let _guard = self.runtime().enter();
        plan.execute(0, self.ctx.task_ctx())
            .map_err(|e| self.df_err(e))
    }

    /// Up to `rows` rows of the key columns, evenly spaced over the table's
    /// rows on this device. Blocks; call it off any async runtime.
    pub fn sample_keys(&self, request: &SampleKeysRequest) -> DeviceResult<RecordBatch> {
        if request.rows > SAMPLE_ROWS_MAX {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                format!(
                    "sample of {} rows asked; sample_rows_max is {SAMPLE_ROWS_MAX}",
                    request.rows
                ),
            ));
        }
        let total: u64 = self
            .manifest()
            .tables
            .get(&request.table)
            .map(|p| p.iter().map(|d| d.row_count).sum())
            .unwrap_or(0);
        let (_, plan) = self.local_scan(&request.table, Some(&request.columns))?;
        let schema = plan.schema();
        let step = total.div_ceil(request.rows.max(1)).max(1);
        let mut stream = self.stream(plan)?;
        let (mut seen, mut picked) = (0u64, vec![]);
        let handle = self.runtime().handle().clone();
        while let Some(batch) = handle.block_on(stream.next()) {
            let batch = batch.map_err(|e| self.df_err(e))?;
            let n = batch.num_rows() as u64;
            // Rows whose global position is a multiple of `step`.
            let first = (step - seen % step) % step;
            let idx =
                UInt32Array::from_iter_values((first..n).step_by(step as usize).map(|i| i as u32));
            seen += n;
            if !idx.is_empty() {
                picked.push(
                    take_record_batch(&batch, &idx)
                        .map_err(|e| self.err(DeviceErrorKind::Execution, e.to_string()))?,
                );
            }
        }
        concat_batches(&schema, &picked)
            .map_err(|e| self.err(DeviceErrorKind::Execution, e.to_string()))
    }

    /// Sorts this device's partitions of `request.source` into new
    /// partitions of `request.into`, each published atomically once
    /// written. Blocks; call it off any async runtime.
    pub fn sort_table(&self, request: &SortTableRequest) -> DeviceResult<Vec<FormatDescriptor>> {
        if request.by.is_empty() {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                "sort needs at least one key column",
            ));
        }
        if self.manifest().tables.contains_key(&request.into) {
            return Err(self.err(
                DeviceErrorKind::BadPlan,
                format!("table {} already exists", request.into),
            ));
        }
        let (schema, scan) = self.local_scan(&request.source, None)?;
        let ordering = request
            .by
            .iter()
            .map(|k| {
                Ok(PhysicalSortExpr {
                    expr: col(&k.column, &schema).map_err(|e| self.df_err(e))?,
                    options: SortOptions {
                        descending: k.descending,
                        nulls_first: k.nulls_first,
                    },
                })
            })
            .collect::<DeviceResult<Vec<_>>>()?;
        let ordering = LexOrdering::new(ordering).expect("at least one key");
        let sort: Arc<dyn ExecutionPlan> = Arc::new(SortExec::new(ordering, scan));
        let plan = use_kernel_sorts(sort, &self.sort_config(false)).map_err(|e| self.df_err(e))?;
        let mut stream = self.stream(plan)?;
        let options = WriterOptions {
            row_group_rows_max: request.row_group_rows_max.clamp(1, 1 << 24) as usize,
            layout: match request.hybrid {
                true => PartitionLayout::Hybrid {
                    key_columns: request.by.iter().map(|k| k.column.clone()).collect(),
                },
                false => PartitionLayout::Parquet,
            },
            partitioning: request.partitioning.clone(),
            ..Default::default()
        };
        let io =
            |e: insitu_format::FormatError| self.err(DeviceErrorKind::Execution, e.to_string());
        let handle = self.runtime().handle().clone();
        let rows_max = request.partition_rows_max.max(1);
        let mut written = vec![];
        let mut current: Option<(PartitionWriter, u64)> = None;
        while let Some(batch) = handle.block_on(stream.next()) {
            let mut batch = batch.map_err(|e| self.df_err(e))?;
            while batch.num_rows() > 0 {
                let (writer, rows) = match &mut current {
                    Some(open) => open,
                    None => {
                        let partition = request.first_partition + written.len() as u32;
                        let w = PartitionWriter::create(
                            &self.dir,
                            &request.into,
                            partition,
                            Arc::clone(&schema),
                            &options,
                        )
                        .map_err(io)?;
                        current.insert((w, 0))
                    }
                };
                let take = (rows_max - *rows).min(batch.num_rows() as u64) as usize;
                writer.write(&batch.slice(0, take)).map_err(io)?;
                *rows += take as u64;
                batch = batch.slice(take, batch.num_rows() - take);
                if *rows == rows_max {
                    let (w, _) = current.take().expect("open writer");
                    written.push(self.publish(w.finish().map_err(io)?)?);
                }
            }
        }
        if let Some((w, _)) = current.take() {
            written.push(self.publish(w.finish().map_err(io)?)?);
        }
        Ok(written)
    }
}
