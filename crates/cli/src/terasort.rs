//! `insitu gensort`, `insitu valsort`, `insitu extsort`: TeraSort records
//! and the external merge sort (paper 001).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use insitu_extsort::heap::HeapMeter;
use insitu_extsort::rss::{current_rss_bytes, peak_rss_bytes, return_freed_buffers};
use insitu_extsort::{
    CodecChoice, ExtsortOptions, GenOptions, Measured, Phase, Plan, RunCodec, KEY_BYTES,
    RECORD_BYTES,
};

use crate::error::CliResult;
use crate::units::{human_bytes, parse_bytes};

#[derive(Args, Debug)]
pub struct GensortArgs {
    /// Number of 100-byte records.
    pub records: u64,
    /// Output file (written to a temporary name, then renamed).
    pub out: PathBuf,
    /// Printable keys and a CRLF per record, as `gensort -a` writes.
    #[arg(long)]
    pub ascii: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Keys from a small skewed set: many duplicates.
    #[arg(long)]
    pub skew: bool,
}

#[derive(Args, Debug)]
pub struct ValsortArgs {
    pub file: PathBuf,
    #[arg(long, default_value_t = RECORD_BYTES)]
    pub record_size: usize,
    #[arg(long, default_value_t = KEY_BYTES)]
    pub key_size: usize,
}

#[derive(Args, Debug)]
pub struct ExtsortArgs {
    /// Input file of fixed-size records.
    pub input: PathBuf,
    /// Output file: IN's records in key order. Appears only when complete.
    pub output: PathBuf,
    #[arg(long, default_value_t = RECORD_BYTES)]
    pub record_size: usize,
    /// Key bytes at the start of each record, compared as unsigned bytes.
    #[arg(long, default_value_t = KEY_BYTES)]
    pub key_size: usize,
    /// Memory budget for the sort's buffers (mem_bytes_max), e.g. 1GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub mem: usize,
    /// Directory for sorted runs (default: OUT's directory).
    #[arg(long)]
    pub tmp: Option<PathBuf>,
    /// Threads for the in-memory sort, and for the last merge pass (one key
    /// range each) when memory allows.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// How sorted runs are stored: auto (the model measures LZ4 and Snappy
    /// on a sample of IN and compresses runs only if that predicts a
    /// faster sort), none, lz4 or snappy. OUT is never compressed.
    #[arg(long, default_value = "auto", value_name = "CODEC")]
    pub run_codec: CodecChoice,
    /// Print the plan (run size, fan-in, passes, run codec, predicted
    /// phase times) and stop without sorting.
    #[arg(long)]
    pub explain: bool,
    /// Measure the storage's read and write rates even if a sort measured
    /// them on the same device within the last hour
    /// (storage_rates_age_max); they are cached in
    /// $XDG_CACHE_HOME/insitu/storage-rates (default ~/.cache/insitu).
    #[arg(long)]
    pub reprobe: bool,
    /// Run size M, e.g. 256MiB, in place of the model's choice (whole
    /// records; at most what --mem holds). Fan-in and passes follow.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub run_size: Option<usize>,
}

fn bar(total: u64, unit: &str, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = format!(
        "{{msg:>10}} [{{elapsed_precise}}] {{wide_bar}} {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, eta {{eta}})"
    );
    bar.set_style(ProgressStyle::with_template(&template).expect("progress template"));
    bar.set_message(what.to_string());
    bar
}

pub fn gensort(a: GensortArgs) -> CliResult<()> {
    let bar = bar(a.records, "records", "gensort");
    let options = GenOptions {
        records: a.records,
        ascii: a.ascii,
        seed: a.seed,
        skew: a.skew,
    };
    insitu_extsort::gensort(&a.out, &options, &|n| bar.inc(n)).map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    eprintln!(
        "wrote {} records ({}) to {}",
        a.records,
        human_bytes(a.records * RECORD_BYTES as u64),
        a.out.display()
    );
    Ok(())
}

pub fn valsort(a: ValsortArgs) -> CliResult<()> {
    let len = std::fs::metadata(&a.file)
        .map_err(|e| format!("{}: {e}", a.file.display()))?
        .len();
    let bar = bar(len, "bytes", "valsort");
    let v = insitu_extsort::valsort(&a.file, a.record_size, a.key_size, &|n| bar.inc(n))
        .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    println!("Records: {}", v.records);
    println!("Checksum: {:x}", v.checksum);
    println!("Duplicate keys: {}", v.duplicate_keys);
    match v.first_unordered {
        None => {
            println!("SUCCESS - all records are in order");
            Ok(())
        }
        Some(first) => Err(format!(
            "{}: {} records out of order, the first at record {first}",
            a.file.display(),
            v.unordered
        )
        .into()),
    }
}

/// `secs` as the largest whole unit: "42 s", "3 min", "1 h".
fn human_secs(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    }
}

fn print_plan(p: &Plan) {
    let mb = |bps: f64| format!("{:.0} MB/s", bps / 1e6);
    let sort_at_m = p.rates.sort(p.run_bytes, p.record_size);
    println!(
        "input {} ({} records of {} bytes), memory budget {}",
        human_bytes(p.input_bytes),
        p.input_bytes / p.record_size,
        p.record_size,
        human_bytes(p.mem_bytes)
    );
    let storage = match p.storage_rates_age {
        None => "probed now".to_string(),
        Some(age) => format!(
            "probed {} ago, cached; --reprobe measures again",
            human_secs(age.as_secs())
        ),
    };
    println!(
        "measured: read {}, write {}, {} read and written at once ({storage}), in-memory sort {} ({} sample; {} at M), merge {} 2-way, {} 16-way ({} at l)",
        mb(p.rates.read),
        mb(p.rates.write),
        mb(p.rates.mixed),
        mb(p.rates.sort),
        human_bytes(p.rates.sort_sample_bytes),
        mb(sort_at_m),
        mb(p.rates.merge2),
        mb(p.rates.merge16),
        mb(p.rates.merge(p.fan_in)),
    );
    println!(
        "plan: runs of M = {} -> {} runs, fan-in l = {}, {} merge pass(es), merge blocks of {}{}{}",
        human_bytes(p.run_bytes),
        p.runs,
        p.fan_in,
        p.merge_passes,
        human_bytes(p.merge_block_bytes),
        if p.merge_parts > 1 && p.merge_passes > 0 {
            format!(
                "; the last pass merges {} key ranges at once, one per thread",
                p.merge_parts
            )
        } else {
            String::new()
        },
        if p.last_run_in_memory {
            "; the last run is merged from memory (never written)"
        } else {
            ""
        }
    );
    let codec = |c: RunCodec| {
        let r = p.rates.codec(c);
        if r.compress.is_finite() {
            format!(
                "{c} {:.2}x at {} compress, {} decompress",
                r.ratio,
                mb(r.compress),
                mb(r.decompress)
            )
        } else {
            format!("{c} not measured")
        }
    };
    println!(
        "runs: {}{}; codecs on IN's first records, per thread: {}; {}",
        p.run_codec,
        if p.run_codec == RunCodec::None {
            String::new()
        } else {
            format!(" in frames of {}", human_bytes(p.frame_bytes))
        },
        codec(RunCodec::Lz4),
        codec(RunCodec::Snappy),
    );
    println!(
        "predicted: sort phase {:.2} s, merge phase {:.2} s, total {:.2} s (I/O floor {:.2} s)",
        p.predicted_sort_secs,
        p.predicted_merge_secs,
        p.predicted_total_secs(),
        p.io_floor_secs()
    );
}

/// Where each phase's time went, as `time: PHASE T s = PART t s + ...`:
/// the parts sum to the phase's time, the last being what the waits and
/// named work leave (the merge itself, in the merge phase). The sort
/// phase's run writer gathers and writes one chunk while the next one's
/// keys sort: its line is the same span, on its own thread.
fn print_phase_times(m: &Measured) {
    let (s, w, g) = (&m.sort_times.main, &m.sort_times.run_writer, &m.merge_times);
    let phases = [
        (
            "sort phase",
            m.sort_secs,
            &[
                ("waiting for reads", s.read_wait_secs),
                ("sorting keys", s.sort_keys_secs),
                ("waiting for the run writer", s.write_wait_secs),
            ][..],
            "other",
        ),
        (
            "sort phase's run writer",
            m.sort_secs,
            &[
                ("gathering records", w.gather_secs),
                ("waiting for writes", w.write_wait_secs),
            ][..],
            "waiting for chunks",
        ),
        (
            "merge phase",
            m.merge_secs,
            &[
                ("waiting for reads", g.read_wait_secs),
                ("waiting for writes", g.write_wait_secs),
            ][..],
            "merging",
        ),
    ];
    for (phase, total, parts, rest) in phases {
        let mut text = format!("time: {phase} {total:.2} s =");
        for (i, (what, secs)) in parts.iter().enumerate() {
            let plus = if i == 0 { "" } else { " +" };
            text.push_str(&format!("{plus} {what} {secs:.2} s"));
        }
        let named: f64 = parts.iter().map(|p| p.1).sum();
        println!("{text} + {rest} {:.2} s", (total - named).max(0.0));
    }
}

pub fn extsort(a: ExtsortArgs) -> CliResult<()> {
    if a.input == a.output {
        return Err("IN and OUT are the same file; sort into a new file".into());
    }
    let options = ExtsortOptions {
        record_size: a.record_size,
        key_size: a.key_size,
        mem_bytes: a.mem as u64,
        tmp_dir: a.tmp.clone(),
        threads: a.threads.max(1),
        run_codec: a.run_codec,
        storage_rates_cache: insitu_extsort::probe::default_cache_path(),
        reprobe: a.reprobe,
        run_bytes: a.run_size.map(|m| m as u64),
    };
    return_freed_buffers();
    let started = Instant::now();
    let plan =
        insitu_extsort::plan_sort(&a.input, &a.output, &options).map_err(|e| e.to_string())?;
    print_plan(&plan);
    if a.explain {
        return Ok(());
    }
    let total = plan.input_bytes * (1 + u64::from(plan.merge_passes));
    // What the process holds before the sort's buffers: the fixed part.
    let rss_before = current_rss_bytes();
    let bar = bar(total, "bytes", "sort");
    let progress = |phase: Phase, n: u64| {
        if let Phase::Merge(p) = phase {
            bar.set_message(format!("merge {p}"));
        }
        bar.inc(n);
    };
    let heap = HeapMeter::start();
    let measured = insitu_extsort::extsort(&a.input, &a.output, &options, &plan, &progress)
        .map_err(|e| e.to_string())?;
    let heap_peak = heap.peak_bytes();
    drop(heap);
    bar.finish_and_clear();
    let total_secs = started.elapsed().as_secs_f64();
    println!("| phase | predicted (s) | measured (s) |");
    println!("|---|---|---|");
    let in_memory = match measured.runs_in_memory {
        0 => String::new(),
        n => format!(", {n} kept in memory"),
    };
    println!(
        "| sort ({} runs written{in_memory}) | {:.2} | {:.2} |",
        measured.runs_written, plan.predicted_sort_secs, measured.sort_secs
    );
    println!(
        "| merge ({} pass(es)) | {:.2} | {:.2} |",
        plan.merge_passes, plan.predicted_merge_secs, measured.merge_secs
    );
    println!(
        "| total (with planning) | {:.2} | {:.2} |",
        plan.predicted_total_secs(),
        total_secs
    );
    print_phase_times(&measured);
    println!(
        "sorted {} into {} at {:.0} MB/s; I/O floor {:.2} s ({:.0}% of floor speed)",
        human_bytes(plan.input_bytes),
        a.output.display(),
        plan.input_bytes as f64 / total_secs / 1e6,
        plan.io_floor_secs(),
        100.0 * plan.io_floor_secs() / total_secs,
    );
    println!(
        "written: {} to runs ({}) and OUT",
        human_bytes(measured.bytes_written.saturating_sub(plan.input_bytes)),
        plan.run_codec
    );
    let peak = peak_rss_bytes();
    let during = peak.saturating_sub(rss_before);
    println!(
        "memory: peak RSS {} = {} before sorting (fixed) + {} during the sort",
        human_bytes(peak),
        human_bytes(rss_before),
        human_bytes(during),
    );
    // The heap the sort allocated is its buffers (what --mem bounds); the
    // rest of the RSS growth is thread stacks and allocator pages.
    match heap_peak {
        Some(h) if during >= h => println!(
            "memory: sort heap peak {} (budget {}); thread stacks and allocator pages {}",
            human_bytes(h),
            human_bytes(plan.mem_bytes),
            human_bytes(during - h),
        ),
        // Large zeroed buffers come from fresh pages that stay unmapped
        // until written: the RSS can grow less than the heap.
        Some(h) => println!(
            "memory: sort heap peak {} (budget {}); {} of it never written, so never resident",
            human_bytes(h),
            human_bytes(plan.mem_bytes),
            human_bytes(h - during),
        ),
        None => println!("memory: sort heap not metered (no metered allocator)"),
    }
    Ok(())
}
