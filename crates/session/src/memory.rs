//! Memory budgets of the host and the devices, and starting a host.

use std::path::PathBuf;
use std::sync::Arc;

use insitu_device::root::{device_count, root_settings, DeviceBudget, HOST_SPILL_DIR};
use insitu_flight::ClusterFile;
use insitu_host::budget::{machine_memory_bytes, plan_budgets, BudgetRequest, Budgets};
use insitu_host::{DeviceClient, HostConfig, InsituHost, Pushdown};
use insitu_link::LinkProfile;

use crate::{DeviceOptions, SessionResult, Target};

/// Budgets for a command over `embedded_devices` devices in this process
/// (and device servers on this machine holding `local_servers_bytes`):
/// the options, else the root's (or cluster file's) settings, else
/// defaults fitted to this machine. The plan's note goes to `notify`.
pub fn plan_memory(
    options: &DeviceOptions,
    embedded_devices: u32,
    local_servers_bytes: u64,
) -> SessionResult<Budgets> {
    let settings = match &options.cluster {
        Some(_) => Default::default(),
        None => root_settings(&options.root)?,
    };
    let cluster_host_mem = match &options.cluster {
        Some(path) => ClusterFile::load(path)?.host_mem(),
        None => None,
    };
    let request = BudgetRequest {
        host: options.host_mem.or(settings.host_mem).or(cluster_host_mem),
        device: options.mem.or(settings.device_mem),
        embedded_devices,
        local_servers_bytes,
    };
    // A machine whose memory cannot be read gets the defaults as they are.
    let machine = machine_memory_bytes().unwrap_or(u64::MAX / 2);
    let budgets = plan_budgets(&request, machine);
    if let Some(note) = &budgets.note {
        (options.notify)(note);
    }
    Ok(budgets)
}

/// The device budget of `options` for a root of `devices` devices.
pub fn budget_for(options: &DeviceOptions, devices: u32) -> SessionResult<DeviceBudget> {
    Ok(DeviceBudget {
        mem_bytes_max: plan_memory(options, devices, 0)?.device,
        threads: options.threads.max(1),
    })
}

/// The device budget of `options` for the root it names (which must exist).
pub fn budget(options: &DeviceOptions) -> SessionResult<DeviceBudget> {
    let devices = device_count(&options.root)?.unwrap_or(1);
    budget_for(options, devices)
}

/// The host's budget, spill root and profile for a session.
#[derive(Debug, Clone)]
pub struct HostMemorySettings {
    pub mem_bytes_max: usize,
    pub spill_root: PathBuf,
    /// The host's profile kept in the root (embedded devices); measured
    /// when the session starts otherwise.
    pub host_profile: Option<insitu_wire::HostProfile>,
    /// Where the profile is kept, to save what the session measures.
    pub host_profile_path: Option<PathBuf>,
}

impl HostMemorySettings {
    /// For `target` as `options` name it: embedded devices share the
    /// machine with the host; so do device servers on loopback.
    pub fn of(
        options: &DeviceOptions,
        target: &Target,
        clients: &[Arc<dyn DeviceClient>],
    ) -> SessionResult<Self> {
        match target {
            Target::Embedded(devices) => Ok(Self {
                mem_bytes_max: plan_memory(options, devices.len() as u32, 0)?.host,
                spill_root: options.root.join(HOST_SPILL_DIR),
                host_profile: Some(insitu_calibrate::host_profile(
                    &options.root,
                    host_threads(),
                )?),
                host_profile_path: Some(insitu_calibrate::host_profile_path(&options.root)),
            }),
            Target::Cluster(path) => {
                let file = ClusterFile::load(path)?;
                let local: u64 = clients
                    .iter()
                    .filter(|c| {
                        file.devices
                            .iter()
                            .any(|d| d.id == c.id() && is_loopback(&d.endpoint))
                    })
                    .map(|c| c.capabilities().mem_bytes_max)
                    .sum();
                Ok(Self {
                    mem_bytes_max: plan_memory(options, 0, local)?.host,
                    spill_root: file.host_spill_root(path),
                    host_profile: None,
                    host_profile_path: None,
                })
            }
        }
    }
}

/// The host's memory settings for `target`, connecting to a cluster's
/// servers to read their budgets.
pub async fn host_memory_for(
    options: &DeviceOptions,
    target: &Target,
) -> SessionResult<HostMemorySettings> {
    let clients = match target {
        Target::Embedded(_) => vec![],
        Target::Cluster(_) => target.clients(None).await?,
    };
    HostMemorySettings::of(options, target, &clients)
}

/// Threads the host computes with (DataFusion's target partitions).
pub fn host_threads() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Whether an endpoint URL names this machine.
fn is_loopback(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let host = rest.split(['/', ':']).next().unwrap_or("");
    let bracketed = rest.starts_with("[::1]");
    bracketed
        || host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A host over `clients` with `memory`'s budget and profile.
pub async fn host_with(
    clients: Vec<Arc<dyn DeviceClient>>,
    pushdown: Pushdown,
    memory: &HostMemorySettings,
) -> SessionResult<InsituHost> {
    let config = HostConfig {
        pushdown,
        mem_bytes_max: memory.mem_bytes_max,
        profile: memory.host_profile.clone(),
        profile_path: memory.host_profile_path.clone(),
        spill_root: memory.spill_root.clone(),
        ..Default::default()
    };
    Ok(InsituHost::new(clients, config).await?)
}

/// Opens the devices of `options` and starts a host over them.
pub async fn open_host(
    options: &DeviceOptions,
    link: Option<LinkProfile>,
    pushdown: Pushdown,
) -> SessionResult<InsituHost> {
    let target = Target::open(options)?;
    let clients = target.clients(link).await?;
    let memory = HostMemorySettings::of(options, &target, &clients)?;
    host_with(clients, pushdown, &memory).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_endpoints() {
        for e in [
            "http://127.0.0.1:7001",
            "127.0.0.1:7001",
            "https://localhost:1",
            "http://[::1]:7001",
        ] {
            assert!(is_loopback(e), "{e}");
        }
        for e in ["http://10.0.0.2:7001", "https://storage-3:7001", ""] {
            assert!(!is_loopback(e), "{e}");
        }
    }

    #[test]
    fn budgets_of_a_new_root_and_notes() {
        static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(vec![]);
        let dir = tempfile::tempdir().unwrap();
        let mut options = DeviceOptions::root(dir.path());
        options.mem = Some(256 << 20);
        options.host_mem = Some(256 << 20);
        options.threads = 0;
        let b = budget_for(&options, 3).unwrap();
        assert_eq!(b.threads, 1, "threads are at least one");
        assert_eq!(b.mem_bytes_max, 256 << 20, "a given budget is kept");
        assert!(NOTES.lock().unwrap().is_empty());
        // A given budget past the machine is kept too, with a warning.
        options.mem = Some(1 << 50);
        options.notify = |n| NOTES.lock().unwrap().push(n.to_string());
        let b = budget_for(&options, 3).unwrap();
        assert_eq!(b.mem_bytes_max, 1 << 50);
        assert!(NOTES.lock().unwrap()[0].contains("more than this machine"));
    }
}
