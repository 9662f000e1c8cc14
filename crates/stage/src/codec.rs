//! Encoding and decoding stage plans.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_err, DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{displayable, ExecutionPlan};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf;
use prost::Message;

use crate::PartitionScanExec;

/// Replaces a [`PartitionScanExec`] with a plan that reads local data.
pub trait PartitionBinder: std::fmt::Debug + Send + Sync {
    fn bind(&self, scan: &PartitionScanExec) -> Result<Arc<dyn ExecutionPlan>>;
}

/// Wire form of a [`PartitionScanExec`].
#[derive(Clone, PartialEq, Message)]
struct PartitionScanProto {
    #[prost(string, tag = "1")]
    table: String,
    #[prost(uint32, repeated, tag = "2")]
    partitions: Vec<u32>,
    #[prost(message, optional, tag = "3")]
    table_schema: Option<protobuf::Schema>,
    #[prost(bool, tag = "4")]
    has_projection: bool,
    #[prost(uint32, repeated, tag = "5")]
    projection: Vec<u32>,
}

/// Extension codec for the insitu nodes of a stage plan: it decodes the
/// leaf as an unbound [`PartitionScanExec`], which [`bind_stage`] then
/// replaces with a local read.
#[derive(Debug, Default)]
pub struct StageCodec;

impl PhysicalExtensionCodec for StageCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !inputs.is_empty() {
            return internal_err!("stage plan leaf has {} inputs, expected none", inputs.len());
        }
        let proto = PartitionScanProto::decode(buf)
            .map_err(|e| DataFusionError::Plan(format!("malformed partition scan: {e}")))?;
        let schema = proto
            .table_schema
            .as_ref()
            .ok_or_else(|| DataFusionError::Plan("partition scan without a schema".into()))?;
        let schema = arrow::datatypes::Schema::try_from(schema)
            .map_err(|e| DataFusionError::Plan(format!("partition scan schema: {e}")))?;
        let projection = proto.has_projection.then(|| {
            proto
                .projection
                .iter()
                .map(|i| *i as usize)
                .collect::<Vec<_>>()
        });
        if let Some(p) = &projection {
            if let Some(bad) = p.iter().find(|i| **i >= schema.fields().len()) {
                return Err(DataFusionError::Plan(format!(
                    "partition scan projects column {bad} of a {}-column table",
                    schema.fields().len()
                )));
            }
        }
        let scan = PartitionScanExec::try_new(
            proto.table,
            proto.partitions,
            Arc::new(schema),
            projection,
        )?;
        Ok(Arc::new(scan))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let Some(scan) = node.downcast_ref::<PartitionScanExec>() else {
            return internal_err!("cannot ship {} to a device", node.name());
        };
        let proto = PartitionScanProto {
            table: scan.table().to_string(),
            partitions: scan.partitions().to_vec(),
            table_schema: Some(protobuf::Schema::try_from(scan.table_schema().as_ref())?),
            has_projection: scan.projection().is_some(),
            projection: scan
                .projection()
                .unwrap_or_default()
                .iter()
                .map(|i| *i as u32)
                .collect(),
        };
        proto
            .encode(buf)
            .map_err(|e| DataFusionError::Internal(format!("encode partition scan: {e}")))
    }
}

/// Serializes a stage plan.
pub fn encode_stage(plan: Arc<dyn ExecutionPlan>) -> Result<Vec<u8>> {
    Ok(physical_plan_to_bytes_with_extension_codec(plan, &StageCodec)?.to_vec())
}

/// Deserializes a stage plan leaving its leaves unbound: for inspection,
/// for checking that a plan survives the trip to a device, and for a
/// device to look at before it binds the plan with [`bind_stage`].
pub fn decode_stage_unbound(bytes: &[u8], ctx: &TaskContext) -> Result<Arc<dyn ExecutionPlan>> {
    physical_plan_from_bytes_with_extension_codec(bytes, ctx, &StageCodec)
        .map_err(|e| DataFusionError::Plan(format!("stage plan does not decode: {e}")))
}

/// `plan` with each [`PartitionScanExec`] replaced by what `binder` reads
/// it with (so a caller may look at the unbound plan first and choose how
/// to bind it).
pub fn bind_stage(
    plan: Arc<dyn ExecutionPlan>,
    binder: &dyn PartitionBinder,
) -> Result<Arc<dyn ExecutionPlan>> {
    let bound = plan.transform_up(|node| match node.downcast_ref::<PartitionScanExec>() {
        Some(scan) => Ok(Transformed::yes(binder.bind(scan)?)),
        None => Ok(Transformed::no(node)),
    })?;
    Ok(bound.data)
}

/// One line per operator, leaf last, joined with ` <- `: how EXPLAIN shows a stage.
pub fn describe_stage(plan: &Arc<dyn ExecutionPlan>) -> String {
    let mut parts = Vec::new();
    let _ = plan.apply(|node| {
        let line = displayable(node.as_ref()).one_line().to_string();
        parts.push(line.trim().to_string());
        Ok(TreeNodeRecursion::Continue)
    });
    parts.join(" <- ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::{col, lit};
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::prelude::SessionContext;

    #[derive(Debug)]
    struct Echo;
    impl PartitionBinder for Echo {
        fn bind(&self, scan: &PartitionScanExec) -> Result<Arc<dyn ExecutionPlan>> {
            Ok(Arc::new(scan.with_partitions(vec![42])))
        }
    }

    #[test]
    fn stage_round_trips_and_binds() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Utf8, true),
        ]));
        let scan = Arc::new(
            PartitionScanExec::try_new("t", vec![1, 2], schema.clone(), Some(vec![0])).unwrap(),
        );
        let pred = datafusion::physical_expr::expressions::binary(
            col("a", &scan.schema()).unwrap(),
            datafusion::logical_expr::Operator::Gt,
            lit(5i64),
            &scan.schema(),
        )
        .unwrap();
        let plan: Arc<dyn ExecutionPlan> = Arc::new(FilterExec::try_new(pred, scan).unwrap());
        let bytes = encode_stage(plan.clone()).unwrap();
        let ctx = SessionContext::new().task_ctx();
        let back = bind_stage(decode_stage_unbound(&bytes, &ctx).unwrap(), &Echo).unwrap();
        let text = describe_stage(&back);
        assert!(
            text.starts_with("FilterExec: a@0 > 5 <- PartitionScanExec: table=t, partitions=[42]"),
            "{text}"
        );

        let err = decode_stage_unbound(b"\x0a\xff\xffgarbage", &ctx).unwrap_err();
        assert!(
            err.to_string().contains("stage plan does not decode"),
            "{err}"
        );
        let err = decode_stage_unbound(b"\x0a\x05hello garbage", &ctx).unwrap_err();
        assert!(
            err.to_string().contains("stage plan does not decode"),
            "{err}"
        );
    }
}
