//! `insitu demo`: TPC-H SF1 on 4 embedded devices over 1 GbE and 10 GbE:
//! each query with pushdown on, off and auto (the cost model's choice per
//! scan), with what the model predicted.

use insitu_session::{default_demo_root, host_memory_for, DeviceOptions};

use crate::bench::{compare, placed_words, tpch_target, QueryResult};
use crate::console::print_note;
use crate::error::CliResult;
use crate::units::{human_bytes, speed_words};
use crate::DemoArgs;

/// Queries the demo runs.
pub const DEMO_QUERIES: [usize; 5] = [1, 3, 6, 12, 14];

pub async fn run(a: DemoArgs) -> CliResult<()> {
    let root = a
        .root
        .clone()
        .unwrap_or_else(|| default_demo_root(a.sf, a.devices));
    let options = DeviceOptions {
        cluster: a.cluster.clone(),
        host_mem: a.host_mem,
        notify: print_note,
        ..DeviceOptions::root(root)
    };
    let (target, _, location) = tpch_target(&options, a.sf, a.devices).await?;
    let memory = host_memory_for(&options, &target).await?;
    let mut mismatched = false;
    for link in &a.link {
        eprintln!(
            "TPC-H SF {} on {location}, link {link}: each query with pushdown on, off and auto",
            a.sf
        );
        let results = compare(&target, *link, &memory, &DEMO_QUERIES, 1, |r| {
            eprintln!(
                "Q{} done: auto placed {}",
                r.query,
                placed_words(&r.placements)
            )
        })
        .await?;
        println!("\n## Link {link}\n\n{}", table(&results));
        mismatched |= results.iter().any(|r| !r.answers_match);
    }
    if mismatched {
        return Err("pushdown on, off and auto answers differ".into());
    }
    Ok(())
}

/// One row per query: the three modes' times, auto against pull and
/// against the better of the two, what auto placed where, the model's
/// prediction for its stages and the link bytes.
fn table(results: &[QueryResult]) -> String {
    let mut md = String::from(
        "| query | push | pull | auto | auto vs pull | auto vs the better | auto placed | \
         predicted stages (auto) | link bytes push / pull / auto |\n\
         |---|---:|---:|---:|---|---|---|---:|---|\n",
    );
    for r in results {
        let failed = [("push", &r.push), ("pull", &r.pull), ("auto", &r.auto)]
            .into_iter()
            .find_map(|(name, m)| m.error.as_ref().map(|e| format!("{name} failed: {e}")));
        if let Some(e) = failed {
            md.push_str(&format!("| Q{} | {} | | | | | | | |\n", r.query, e));
            continue;
        }
        let predicted: f64 = r.placements.iter().map(|p| p.choice.chosen_secs()).sum();
        md.push_str(&format!(
            "| Q{} | {:.3} s | {:.3} s | {:.3} s | {} | {} | {} | {:.3} s | {} / {} / {} |\n",
            r.query,
            r.push.median_secs,
            r.pull.median_secs,
            r.auto.median_secs,
            speed_words(r.pull.median_secs / r.auto.median_secs),
            speed_words(1.0 / r.auto_vs_best),
            placed_words(&r.placements),
            predicted,
            human_bytes(r.push.link_bytes),
            human_bytes(r.pull.link_bytes),
            human_bytes(r.auto.link_bytes),
        ));
    }
    md
}
