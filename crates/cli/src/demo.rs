//! `insitu demo`: TPC-H SF1 on 4 embedded devices, pushdown vs pull.

use crate::bench::{compare, markdown_table, tpch_cluster, tpch_devices};
use crate::session::{default_demo_root, host_memory_for, Target};
use crate::units::link_reduction_words;
use crate::{DemoArgs, DeviceArgs};

/// Queries the demo runs.
pub const DEMO_QUERIES: [usize; 5] = [1, 3, 6, 12, 14];

pub async fn run(a: DemoArgs) -> Result<(), String> {
    let root = a
        .root
        .clone()
        .unwrap_or_else(|| default_demo_root(a.sf, a.devices));
    let dargs = DeviceArgs {
        root: root.clone(),
        cluster: a.cluster.clone(),
        mem: None,
        host_mem: a.host_mem,
        threads: 2,
    };
    let (target, location) = match &a.cluster {
        Some(cluster) => (
            tpch_cluster(cluster, a.sf).await?,
            format!("device servers of {}", cluster.display()),
        ),
        None => {
            let devices = tpch_devices(&root, &dargs, a.sf, a.devices)?;
            (
                Target::Embedded(devices),
                format!("{} embedded devices under {}", a.devices, root.display()),
            )
        }
    };
    let memory = host_memory_for(&dargs, &target).await?;
    eprintln!(
        "TPC-H SF {} on {location}, link {}: each query once with pushdown on and off",
        a.sf, a.link
    );
    let results = compare(&target, a.link, &memory, &DEMO_QUERIES, 1, |r| {
        eprintln!(
            "Q{} done: {:.2}x faster with pushdown, {} link bytes",
            r.query,
            r.speedup,
            link_reduction_words(r.link_reduction)
        )
    })
    .await?;
    println!("{}", markdown_table(&results));
    if results.iter().any(|r| !r.answers_match) {
        return Err("pushdown and pull answers differ".into());
    }
    Ok(())
}
