//! The host's map of the cluster: which device holds which partition.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, Statistics};
use insitu_format::schema_of;
use insitu_wire::{FormatDescriptor, Operator};

use crate::statistics::table_statistics;
use insitu_client::DeviceClient;

/// Partitions of one table held by one device.
#[derive(Debug, Clone)]
pub struct DeviceShare {
    pub client: Arc<dyn DeviceClient>,
    pub descriptors: Vec<FormatDescriptor>,
}

impl DeviceShare {
    pub fn partition_ids(&self) -> Vec<u32> {
        self.descriptors.iter().map(|d| d.partition).collect()
    }

    /// Planning statistics of this device's part of a table of `schema`.
    pub fn statistics(&self, schema: &arrow::datatypes::Schema) -> Statistics {
        table_statistics(schema, &self.descriptors)
    }
}

/// A table: its schema and where its partitions live.
#[derive(Debug, Clone)]
pub struct TableInfo {
    pub name: String,
    pub schema: SchemaRef,
    pub shares: Vec<DeviceShare>,
}

impl TableInfo {
    /// Whether every device holding part of the table runs `op`.
    pub fn supports(&self, op: Operator) -> bool {
        supported_by_all(&self.shares, op)
    }

    /// Planning statistics of the whole table.
    pub fn statistics(&self) -> Statistics {
        table_statistics(
            &self.schema,
            self.shares.iter().flat_map(|s| &s.descriptors),
        )
    }

    pub fn row_count(&self) -> u64 {
        self.shares
            .iter()
            .flat_map(|s| &s.descriptors)
            .map(|d| d.row_count)
            .sum()
    }
}

/// Builds the table map from every device's manifest; a table whose
/// partitions disagree on schema is an error naming both devices.
pub async fn discover_tables(
    clients: &[Arc<dyn DeviceClient>],
) -> Result<BTreeMap<String, TableInfo>> {
    let mut tables: BTreeMap<String, TableInfo> = BTreeMap::new();
    for client in clients {
        let manifest = client.manifest().await?;
        for (name, descriptors) in manifest.tables {
            if descriptors.is_empty() {
                continue;
            }
            let schema =
                Arc::new(schema_of(&descriptors[0]).map_err(|e| {
                    DataFusionError::Execution(format!("device {}: {e}", client.id()))
                })?);
            let entry = tables.entry(name.clone()).or_insert_with(|| TableInfo {
                name: name.clone(),
                schema: Arc::clone(&schema),
                shares: vec![],
            });
            if entry.schema.fields() != schema.fields() {
                return Err(DataFusionError::Execution(format!(
                    "table {name}: device {} stores a schema that differs from device {}",
                    client.id(),
                    entry.shares[0].client.id()
                )));
            }
            entry.shares.push(DeviceShare {
                client: Arc::clone(client),
                descriptors,
            });
        }
    }
    Ok(tables)
}

/// Whether every device in `shares` advertises `op`.
pub fn supported_by_all(shares: &[DeviceShare], op: Operator) -> bool {
    shares.iter().all(|s| s.client.capabilities().supports(op))
}
