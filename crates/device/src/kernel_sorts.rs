//! Which operator a stage's sort becomes on the device: DataFusion's
//! `SortExec` arrives in the stage plan and is swapped for a kernel sort
//! ([`KernelSortExec`]) or, where it reads hybrid partitions by their
//! column-wise keys, a [`crate::HybridSortExec`].

use std::path::PathBuf;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::hybrid_sort::hybrid_sort_for;
use crate::sort::KernelSortExec;

/// How a device runs the sorts of its stages.
#[derive(Debug, Clone)]
pub struct SortConfig {
    /// Threads the argsort may use (the device's thread budget).
    pub threads: usize,
    /// Run top-k with the kernels too (else DataFusion's TopK).
    pub top_k: bool,
    /// Where sorts spill sorted runs when the input outgrows the memory
    /// budget; `None`: such a sort fails.
    pub spill_dir: Option<PathBuf>,
    /// What the device's queries may reserve (its `mem_bytes_max` less
    /// the kernels' scratch share): a hybrid sort is used only if its
    /// files fit.
    pub mem_bytes_max: usize,
}

/// Replaces the `SortExec`s of a decoded stage with kernel sorts: a
/// [`crate::HybridSortExec`] where the sort reads hybrid partitions by their
/// column-wise keys, else a [`KernelSortExec`]; full sorts always, top-k
/// sorts (with a fetch) only if `config.top_k`.
pub fn use_kernel_sorts(
    plan: Arc<dyn ExecutionPlan>,
    config: &SortConfig,
) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(plan
        .transform_up(|node| {
            Ok(match node.downcast_ref::<SortExec>() {
                Some(sort) if config.top_k || sort.fetch().is_none() => {
                    match hybrid_sort_for(sort, config.threads, config.mem_bytes_max) {
                        Some(hybrid) => Transformed::yes(Arc::new(hybrid) as _),
                        None => Transformed::yes(Arc::new(
                            KernelSortExec::from_sort_exec(sort, config.threads)
                                .with_spill_dir(config.spill_dir.clone()),
                        ) as _),
                    }
                }
                _ => Transformed::no(node),
            })
        })?
        .data)
}
