//! `insitu device serve` and `insitu cluster up|down|status`.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use insitu_device::root::{create_root, device_count, device_dir, DeviceBudget};
use insitu_device::{Device, DeviceConfig};
use insitu_flight::{ClusterFile, DeviceEntry, ServeOptions, TlsIdentity};
use insitu_link::LinkProfile;
use insitu_wire::Operator;

use crate::error::{CliError, CliResult};
use crate::units::human_bytes;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The device's data directory (created if missing).
    #[arg(long)]
    pub dir: PathBuf,
    /// Device id; defaults to the id in the directory's manifest, else 0.
    #[arg(long)]
    pub id: Option<u32>,
    /// Address for Arrow Flight. Loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub listen: SocketAddr,
    /// Memory budget of query execution (mem_bytes_max), e.g. 4GiB
    /// [default: 4GiB, scaled down to fit 80% of the machine's memory]
    #[arg(long, value_parser = crate::units::parse_bytes)]
    pub mem: Option<usize>,
    /// Worker threads of the device runtime.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// File holding the bearer token every call must present.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// PEM certificate chain for TLS (with --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS (with --tls-cert).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Address for Prometheus metrics (GET /metrics).
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Operators to run and advertise (default: all):
    /// scan, filter, projection, partial_aggregate, limit.
    #[arg(long, value_delimiter = ',')]
    pub operators: Option<Vec<String>>,
    /// Write the bound address here once listening (for scripts).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Seconds in-flight streams may run after SIGTERM before cancellation.
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
}

fn read_file(path: &Path, what: &str) -> CliResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()).into())
}

pub fn read_token(path: &Path) -> CliResult<String> {
    let token = String::from_utf8(read_file(path, "token file")?)
        .map_err(|_| format!("token file {} is not UTF-8", path.display()))?;
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()).into());
    }
    Ok(token)
}

pub async fn serve(a: ServeArgs) -> CliResult<()> {
    let id = Device::id_for(&a.dir, a.id).map_err(|e| e.to_string())?;
    let operators = match &a.operators {
        Some(names) => names
            .iter()
            .map(|n| Operator::parse(n.trim()).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?,
        None => Operator::ALL.to_vec(),
    };
    if !operators.contains(&Operator::Scan) {
        return Err("--operators must include scan".into());
    }
    let mem = servers_budget(a.mem, 1);
    let config = DeviceConfig {
        mem_bytes_max: mem,
        threads: a.threads.max(1),
        operators,
        ..DeviceConfig::new(id)
    };
    let device = Device::create(&a.dir, config).map_err(|e| e.to_string())?;
    let token = a.token_file.as_deref().map(read_token).transpose()?;
    if token.is_none() && !a.listen.ip().is_loopback() {
        tracing::warn!(
            "serving on {} without --token-file: anyone who reaches it can run plans",
            a.listen
        );
        eprintln!(
            "warning: serving on {} without --token-file: anyone who reaches it can run plans",
            a.listen
        );
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => Some(TlsIdentity {
            cert_pem: read_file(c, "TLS certificate")?,
            key_pem: read_file(k, "TLS key")?,
        }),
        _ => None,
    };
    let options = ServeOptions {
        token,
        tls,
        metrics: a.metrics,
        drain: Duration::from_secs(a.drain_secs),
        ..ServeOptions::new(a.listen)
    };
    let server = insitu_flight::bind(device, options)
        .await
        .map_err(|e| format!("device {id}: {e}"))?;
    let addr = server.local_addr();
    let metrics = server
        .metrics_addr()
        .map(|m| format!(", metrics on http://{m}/metrics"))
        .unwrap_or_default();
    eprintln!(
        "device {id} ({}) serving Arrow Flight on {addr}{metrics}; mem {} threads {}",
        a.dir.display(),
        human_bytes(mem as u64),
        a.threads
    );
    tracing::info!(device = id, %addr, "listening");
    if let Some(ready) = &a.ready_file {
        insitu_format::write_atomically(ready, addr.to_string().as_bytes())
            .map_err(|e| e.to_string())?;
    }
    server
        .run(insitu_flight::termination_signal())
        .await
        .map_err(|e| e.to_string())?;
    eprintln!("device {id} stopped");
    Ok(())
}

#[derive(Args, Debug)]
pub struct ClusterUpArgs {
    /// Number of device servers.
    #[arg(long, default_value_t = 4)]
    pub devices: u32,
    /// Root holding the device directories dev0, dev1, ... (an existing
    /// embedded root works too) and the cluster file.
    #[arg(long)]
    pub root: PathBuf,
    /// Memory budget per device [default: 4GiB, scaled down so that the
    /// devices and a host fit in 80% of the machine's memory].
    #[arg(long, value_parser = crate::units::parse_bytes)]
    pub mem: Option<usize>,
    /// Worker threads per device.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// First Flight port; device i listens on base+i (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub base_port: u16,
    /// First metrics port; device i serves metrics on base+i (none if unset).
    #[arg(long)]
    pub metrics_base_port: Option<u16>,
    /// Link profile recorded for every device in the cluster file.
    #[arg(long)]
    pub link: Option<LinkProfile>,
    /// Operators every device runs and advertises (default: all).
    #[arg(long)]
    pub operators: Option<String>,
}

/// The budget of each of `servers` device servers on this machine: `mem`
/// if given, else the default fitted beside them and a host (see
/// `insitu_host::budget`); prints the plan's note.
fn servers_budget(mem: Option<usize>, servers: u32) -> usize {
    use insitu_host::budget::{machine_memory_bytes, plan_budgets, BudgetRequest};
    let request = BudgetRequest {
        device: mem,
        embedded_devices: servers,
        ..Default::default()
    };
    let plan = plan_budgets(&request, machine_memory_bytes().unwrap_or(u64::MAX / 2));
    if let (Some(note), None) = (&plan.note, mem) {
        eprintln!("{note}");
    }
    plan.device
}

/// Seconds `cluster up` waits for every server to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

pub fn cluster_file_of(root: &Path) -> PathBuf {
    root.join("cluster.toml")
}

fn random_token() -> CliResult<String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom for a token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn write_token(path: &Path, token: &str) -> CliResult<()> {
    use std::os::unix::fs::PermissionsExt;
    insitu_format::write_atomically(path, token.as_bytes()).map_err(|e| e.to_string())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Whether `pid` is a live (not zombie) insitu device server.
fn is_device_server(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let serving = args
        .windows(2)
        .any(|w| w[0] == b"device" && w[1] == b"serve");
    serving && insitu_extsort::files::process_runs(pid)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

pub fn cluster_up(a: ClusterUpArgs) -> CliResult<()> {
    let cluster_path = cluster_file_of(&a.root);
    if let Ok(existing) = ClusterFile::load(&cluster_path) {
        if existing
            .devices
            .iter()
            .any(|d| d.pid.is_some_and(is_device_server))
        {
            return Err(format!(
                "a cluster is already up under {}; stop it with: insitu cluster down --root {}",
                a.root.display(),
                a.root.display()
            )
            .into());
        }
    }
    let devices = match device_count(&a.root).map_err(|e| e.to_string())? {
        Some(n) if n != a.devices => {
            eprintln!(
                "{} holds {n} devices; starting {n} servers",
                a.root.display()
            );
            n
        }
        _ => a.devices,
    };
    let mem = servers_budget(a.mem, devices);
    let budget = DeviceBudget {
        mem_bytes_max: mem,
        threads: a.threads.max(1),
    };
    drop(create_root(&a.root, devices, &budget).map_err(|e| e.to_string())?);
    let token_path = a.root.join("cluster.token");
    write_token(&token_path, &random_token()?)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the insitu binary: {e}"))?;
    let mut children = vec![];
    for id in 0..devices {
        let dir = device_dir(&a.root, id);
        let ready = a.root.join(format!("dev{id}.ready"));
        let _ = std::fs::remove_file(&ready);
        let log_path = a.root.join(format!("dev{id}.log"));
        let log =
            std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let port = if a.base_port == 0 {
            0
        } else {
            a.base_port + id as u16
        };
        let mut cmd = Command::new(&exe);
        cmd.args(["device", "serve", "--dir"])
            .arg(&dir)
            .args(["--id", &id.to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--mem",
                &mem.to_string(),
                "--threads",
                &a.threads.to_string(),
            ])
            .arg("--token-file")
            .arg(&token_path)
            .arg("--ready-file")
            .arg(&ready);
        if let Some(m) = a.metrics_base_port {
            cmd.args(["--metrics", &format!("127.0.0.1:{}", m + id as u16)]);
        }
        if let Some(ops) = &a.operators {
            cmd.args(["--operators", ops]);
        }
        use std::os::unix::process::CommandExt;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0) // outlives this command and its terminal's Ctrl-C
            .spawn()
            .map_err(|e| format!("cannot start device {id}: {e}"))?;
        children.push((id, child, ready, log_path, dir));
    }
    let all_pids: Vec<u32> = children.iter().map(|c| c.1.id()).collect();
    let abort = |why: String| {
        for pid in &all_pids {
            // SAFETY: kill(2) on children this command just started.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        CliError::from(why)
    };
    let started = Instant::now();
    let mut entries = vec![];
    for (id, child, ready, log_path, dir) in &mut children {
        let addr = loop {
            if let Ok(addr) = std::fs::read_to_string(&*ready) {
                break addr;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(abort(format!(
                    "device {id} exited at start ({status}); its log {} ends with:\n{}",
                    log_path.display(),
                    log_tail(log_path)
                )));
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(abort(format!(
                    "device {id} did not listen within {} s; see {}",
                    START_TIMEOUT.as_secs(),
                    log_path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = std::fs::remove_file(&*ready);
        entries.push(DeviceEntry {
            id: *id,
            endpoint: format!("http://{}", addr.trim()),
            token_file: Some("cluster.token".into()),
            link: a.link.map(|l| l.to_string()),
            tls_ca: None,
            pid: Some(child.id()),
            dir: Some(dir.strip_prefix(&a.root).unwrap_or(dir).to_path_buf()),
        });
    }
    let file = ClusterFile {
        devices: entries,
        host: None,
    };
    file.store(&cluster_path).map_err(|e| e.to_string())?;
    for d in &file.devices {
        eprintln!(
            "device {} listening on {} (pid {})",
            d.id,
            d.endpoint,
            d.pid.unwrap_or(0)
        );
    }
    println!("{}", cluster_path.display());
    eprintln!(
        "cluster of {devices} device servers is up; use --cluster {} and stop it with \
         insitu cluster down --cluster {}",
        cluster_path.display(),
        cluster_path.display()
    );
    Ok(())
}

fn children_pids(entries: &[DeviceEntry]) -> Vec<u32> {
    entries.iter().filter_map(|e| e.pid).collect()
}

/// SIGTERM, then SIGKILL after a grace period.
fn stop_children(pids: &mut Vec<u32>) -> usize {
    let mut stopped = 0;
    for pid in pids.iter() {
        if is_device_server(*pid) {
            // SAFETY: kill(2) with a pid we checked is a device server.
            unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
            stopped += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && pids.iter().any(|p| is_device_server(*p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for pid in pids.iter() {
        if is_device_server(*pid) {
            // SAFETY: as above; the server ignored SIGTERM for 15 s.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
    }
    pids.clear();
    stopped
}

#[derive(Args, Debug)]
pub struct ClusterFileArgs {
    /// The cluster file.
    #[arg(long, conflicts_with = "root", required_unless_present = "root")]
    pub cluster: Option<PathBuf>,
    /// Root given to `cluster up` (its cluster.toml).
    #[arg(long)]
    pub root: Option<PathBuf>,
}

impl ClusterFileArgs {
    pub fn path(&self) -> PathBuf {
        match (&self.cluster, &self.root) {
            (Some(c), _) => c.clone(),
            (None, Some(r)) => cluster_file_of(r),
            (None, None) => unreachable!("clap requires one"),
        }
    }
}

pub fn cluster_down(a: ClusterFileArgs) -> CliResult<()> {
    let path = a.path();
    let mut file = ClusterFile::load(&path).map_err(|e| e.to_string())?;
    let mut pids = children_pids(&file.devices);
    if pids.is_empty() {
        return Err(format!(
            "{} lists no processes started by insitu cluster up",
            path.display()
        )
        .into());
    }
    let stopped = stop_children(&mut pids);
    for d in &mut file.devices {
        d.pid = None;
    }
    file.store(&path).map_err(|e| e.to_string())?;
    eprintln!("stopped {stopped} device servers of {}", path.display());
    Ok(())
}

pub async fn cluster_status(a: ClusterFileArgs) -> CliResult<()> {
    use insitu_host::DeviceClient;
    let path = a.path();
    let clients = insitu_flight::connect_cluster(&path, None, Default::default())
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "| device | endpoint | tables | active streams | stages ok/failed/cancelled | rows in | rows out | bytes read | bytes sent | memory in use / peak / budget |"
    );
    println!("|---:|---|---:|---:|---|---:|---:|---:|---:|---|");
    for c in clients {
        let s = c.stats().await.map_err(|e| e.to_string())?;
        let tables = c.manifest().await.map_err(|e| e.to_string())?.tables.len();
        println!(
            "| {} | {} | {tables} | {} | {}/{}/{} | {} | {} | {} | {} | {} / {} / {} |",
            s.device_id,
            c.endpoint().url,
            s.active_streams,
            s.stages_ok,
            s.stages_failed,
            s.stages_cancelled,
            s.rows_in,
            s.rows_out,
            human_bytes(s.bytes_read),
            human_bytes(s.bytes_sent),
            human_bytes(s.mem_in_use_bytes),
            human_bytes(s.mem_peak_bytes),
            human_bytes(s.mem_bytes_max),
        );
    }
    Ok(())
}
