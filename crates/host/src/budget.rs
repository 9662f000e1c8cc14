//! Memory budgets that fit the machine: the host's and those of the
//! embedded devices that share its process.
//!
//! Budgets given explicitly (a flag or a config file) are kept as given.
//! Defaults are chosen so that all budgets on the machine together stay
//! within [`BUDGETS_SHARE_OF_MEMORY_PERCENT`] of its memory:
//!
//! ```text
//!  share  = 80% of the machine's memory (or of the cgroup's limit)
//!  host   = share - device budgets on this machine,
//!           at least min(HOST_MEM_BYTES_MIN_DEFAULT, share / (devices + 1))
//!  device = DEVICE_MEM_BYTES_DEFAULT, scaled down (with a note) when
//!           host + devices would not fit in the share
//! ```

/// What all budgets on a machine may add up to, as a share of its memory.
pub const BUDGETS_SHARE_OF_MEMORY_PERCENT: u64 = 80;

/// A device's default budget (`mem_bytes_max`) when it fits.
pub const DEVICE_MEM_BYTES_DEFAULT: usize = 4 << 30;

/// The least default host budget when devices take most of the share
/// (less only when the share itself is small).
pub const HOST_MEM_BYTES_MIN_DEFAULT: usize = 2 << 30;

/// The host budget of a library user who sets none (`HostConfig::default`).
pub const HOST_MEM_BYTES_DEFAULT: usize = 2 << 30;

/// Resident memory a process holds beyond its budgets
/// (`rss_overhead_bytes`): code and static data, thread stacks, the
/// allocator's free pages, batches in flight between operators (device
/// result chunks, Parquet pages being decoded), which no pool counts.
pub const RSS_OVERHEAD_BYTES: u64 = 256 << 20;

/// The least budget a default is scaled down to.
pub const MEM_BYTES_MIN: usize = 64 << 20;

/// Memory of this machine, or the limit of the cgroup this process runs
/// in if that is lower; `None` where neither can be read.
pub fn machine_memory_bytes() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| meminfo_total_bytes(&t));
    let limit = cgroup_limit_bytes();
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

fn meminfo_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// cgroup v2's `memory.max`, else v1's `memory.limit_in_bytes`.
fn cgroup_limit_bytes() -> Option<u64> {
    [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|t| t.trim().parse().ok())
}

/// What the budgets of one process should be planned from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetRequest {
    /// The host budget, if given explicitly.
    pub host: Option<usize>,
    /// Each embedded device's budget, if given explicitly.
    pub device: Option<usize>,
    /// Devices living in this process.
    pub embedded_devices: u32,
    /// Budgets of device servers on this machine (other processes: kept).
    pub local_servers_bytes: u64,
}

/// Planned budgets, and a line for the user when a default was scaled
/// down or the budgets exceed the machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Budgets {
    pub host: usize,
    pub device: usize,
    pub note: Option<String>,
}

/// Plans budgets for a machine of `machine` bytes (see the module doc).
pub fn plan_budgets(request: &BudgetRequest, machine: u64) -> Budgets {
    let share = machine / 100 * BUDGETS_SHARE_OF_MEMORY_PERCENT;
    let n = u64::from(request.embedded_devices);
    let servers = request.local_servers_bytes;
    let mut device = request.device.unwrap_or(DEVICE_MEM_BYTES_DEFAULT);
    let devices_total = |d: usize| n * d as u64 + servers;
    let host_floor = (HOST_MEM_BYTES_MIN_DEFAULT as u64).min(share / (n + 1));
    let host = request.host.map(|h| h as u64).unwrap_or_else(|| {
        share
            .saturating_sub(devices_total(device))
            .max(host_floor)
            .max(MEM_BYTES_MIN as u64)
    });
    let mut note = None;
    if request.device.is_none() && n > 0 && host + devices_total(device) > share {
        let room = share.saturating_sub(host).saturating_sub(servers) / n;
        device = usize::try_from(room)
            .unwrap_or(usize::MAX)
            .max(MEM_BYTES_MIN);
        note = Some(format!(
            "note: default device budget scaled to {} per device so that host ({}) and {} \
             devices fit in {BUDGETS_SHARE_OF_MEMORY_PERCENT}% of this machine's {} (--mem sets it)",
            human(device as u64),
            human(host),
            n,
            human(machine),
        ));
    }
    let total = host + devices_total(device);
    if total > machine {
        note = Some(format!(
            "warning: memory budgets total {} (host {}, devices {}), more than this machine's {}; \
             a query may be killed for memory before a budget stops it",
            human(total),
            human(host),
            human(devices_total(device)),
            human(machine),
        ));
    }
    Budgets {
        host: usize::try_from(host).unwrap_or(usize::MAX),
        device,
        note,
    }
}

fn human(bytes: u64) -> String {
    insitu_wire::units::human_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn plan(host: Option<usize>, device: Option<usize>, devices: u32, machine: u64) -> Budgets {
        let request = BudgetRequest {
            host,
            device,
            embedded_devices: devices,
            local_servers_bytes: 0,
        };
        plan_budgets(&request, machine)
    }

    fn total(b: &Budgets, devices: u32) -> u64 {
        b.host as u64 + u64::from(devices) * b.device as u64
    }

    /// Defaults never exceed the share, on machines small and large, for
    /// any number of embedded devices.
    #[test]
    fn defaults_fit_in_the_share_of_any_machine() {
        for machine_gib in [1u64, 2, 4, 8, 16, 24, 32, 64, 256] {
            let machine = machine_gib * GIB;
            for devices in [0u32, 1, 2, 4, 8, 16] {
                let b = plan(None, None, devices, machine);
                let share = machine / 100 * BUDGETS_SHARE_OF_MEMORY_PERCENT;
                let floor = devices as u64 * MEM_BYTES_MIN as u64 + MEM_BYTES_MIN as u64;
                assert!(
                    total(&b, devices) <= share.max(floor),
                    "{machine_gib} GiB, {devices} devices: {b:?}"
                );
                assert!(b.host >= MEM_BYTES_MIN && b.device >= MEM_BYTES_MIN);
            }
        }
    }

    #[test]
    fn on_24_gib_four_devices_keep_their_default_and_the_host_takes_the_rest() {
        let b = plan(None, None, 4, 24 * GIB);
        assert_eq!(b.device, DEVICE_MEM_BYTES_DEFAULT);
        let share = 24 * GIB / 100 * 80;
        assert_eq!(b.host as u64, share - 16 * GIB);
        assert_eq!(b.note, None);
    }

    #[test]
    fn a_small_machine_scales_the_device_default_with_a_note() {
        let b = plan(None, None, 4, 16 * GIB);
        assert_eq!(b.host, HOST_MEM_BYTES_MIN_DEFAULT);
        assert!(b.device < DEVICE_MEM_BYTES_DEFAULT);
        let note = b.note.expect("a note");
        assert!(
            note.starts_with("note: default device budget scaled"),
            "{note}"
        );
        assert!(!note.contains('\n'), "one line");
    }

    #[test]
    fn explicit_budgets_are_kept_and_a_total_past_the_machine_is_warned_about() {
        let b = plan(Some(3 << 30), Some(1 << 30), 4, 24 * GIB);
        assert_eq!((b.host, b.device, b.note), (3 << 30, 1 << 30, None));
        let b = plan(Some(20 << 30), Some(4 << 30), 4, 24 * GIB);
        assert_eq!((b.host, b.device), (20 << 30, 4 << 30));
        assert!(b.note.unwrap().starts_with("warning: memory budgets total"));
        // An explicit host budget leaves the devices' default what fits.
        let b = plan(Some(16 << 30), None, 4, 24 * GIB);
        assert!(total(&b, 4) <= 24 * GIB / 100 * 80);
    }

    #[test]
    fn servers_on_this_machine_leave_the_host_the_rest() {
        let request = BudgetRequest {
            local_servers_bytes: 8 * GIB,
            ..Default::default()
        };
        let b = plan_budgets(&request, 24 * GIB);
        assert_eq!(b.host as u64, 24 * GIB / 100 * 80 - 8 * GIB);
    }

    #[test]
    fn reads_meminfo_and_this_machine() {
        let text = "MemTotal:       24589480 kB\nMemFree:  100 kB\n";
        assert_eq!(meminfo_total_bytes(text), Some(24589480 * 1024));
        assert_eq!(meminfo_total_bytes("nothing"), None);
        if cfg!(target_os = "linux") {
            assert!(machine_memory_bytes().is_some_and(|m| m > 0));
        }
    }
}
