//! `insitu calibrate`: measures the devices' and the host's rates again
//! and writes their profiles, which the cost model plans with.
//!
//! Devices and hosts measure themselves once, on first use, when they
//! find no profile; this command measures afresh (after a hardware
//! change, or to replace a hand-edited file) and prints what it found.

use std::path::PathBuf;

use clap::Args;
use insitu_calibrate::{
    device_profile_path, host_profile_path, measure_device_profile, measure_host_profile, save,
};
use insitu_device::root::{device_count, device_dir};
use insitu_host::DeviceClient;
use insitu_wire::{ComputeRates, DeviceProfile};

use insitu_session::host_threads;

use crate::error::CliResult;
use crate::units::human_bytes;

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Data root whose devices (and host profile) to measure.
    #[arg(long, env = "INSITU_ROOT", default_value_os_t = insitu_session::default_root())]
    pub root: PathBuf,
    /// Cluster file: print the profiles its device servers report (each
    /// server measures itself; run this command with --root on its
    /// machine to measure it again).
    #[arg(long, env = "INSITU_CLUSTER", conflicts_with = "root")]
    pub cluster: Option<PathBuf>,
    /// Worker threads per device.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
}

pub async fn run(a: CalibrateArgs) -> CliResult<()> {
    if let Some(cluster) = &a.cluster {
        for client in insitu_flight::connect_cluster(cluster, None, Default::default()).await? {
            match &client.capabilities().profile {
                Some(p) => print_device(client.id(), p, "reported"),
                None => println!("device {}: reports no profile", client.id()),
            }
        }
        return Ok(());
    }
    let devices = device_count(&a.root)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} holds no devices", a.root.display()))?;
    for id in 0..devices {
        let dir = device_dir(&a.root, id);
        let profile = measure_device_profile(&dir, a.threads)
            .map_err(|e| format!("device {id}: cannot measure {}: {e}", dir.display()))?;
        save(&device_profile_path(&dir), &profile.to_json())?;
        print_device(id, &profile, "wrote");
    }
    let host = measure_host_profile(host_threads());
    let path = host_profile_path(&a.root);
    save(&path, &host.to_json())?;
    println!("host ({} threads): wrote {}", host.threads, path.display());
    print_rates(&host.rates);
    Ok(())
}

fn print_device(id: u32, p: &DeviceProfile, verb: &str) {
    println!(
        "device {id} ({} threads, storage reads {}/s): {verb} {}",
        p.threads,
        human_bytes(p.storage_read_bytes_per_sec as u64),
        p.source
    );
    print_rates(&p.rates);
}

fn print_rates(r: &ComputeRates) {
    let m = |v: f64| format!("{:.0} M", v / 1e6);
    let b = |v: f64| format!("{}/s", human_bytes(v.min(u64::MAX as f64) as u64));
    println!(
        "  per thread: decode {}/s fixed values + {} of their pages, {}/s strings + {}; \
         filter {}/s rows; aggregate {}/s rows (few groups), {}/s (many); sort {}/s rows; \
         IPC encode {}, decode {}; LZ4 {}, Zstd {}",
        m(r.decode_fixed_values_per_sec),
        b(r.decode_fixed_bytes_per_sec),
        m(r.decode_string_values_per_sec),
        b(r.decode_string_bytes_per_sec),
        m(r.filter_rows_per_sec),
        m(r.aggregate_rows_per_sec),
        m(r.aggregate_many_groups_rows_per_sec),
        m(r.sort_rows_per_sec),
        b(r.ipc_encode_bytes_per_sec),
        b(r.ipc_decode_bytes_per_sec),
        b(r.lz4_compress_bytes_per_sec),
        b(r.zstd_compress_bytes_per_sec),
    );
}
