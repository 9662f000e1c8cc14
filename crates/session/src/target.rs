//! Where a command's devices are: in this process or behind device servers.

use std::path::PathBuf;
use std::sync::Arc;

use insitu_device::root::open_root;
use insitu_device::{embedded, embedded_clients, Device};
use insitu_flight::FlightDeviceClient;
use insitu_host::DeviceClient;
use insitu_ingest::PartitionSink;
use insitu_link::LinkProfile;

use crate::{budget, DeviceOptions, SessionResult};

/// The devices a command works on.
#[derive(Debug, Clone)]
pub enum Target {
    /// Devices in this process, each behind its own link.
    Embedded(Vec<Arc<Device>>),
    /// Device servers listed in a cluster file.
    Cluster(PathBuf),
}

/// A device as a job uses it: to query and to write, through one client,
/// so the job's bytes cross the link both ways, embedded as over Flight.
pub struct JobDevice {
    pub client: Arc<dyn DeviceClient>,
    pub sink: Arc<dyn PartitionSink>,
}

impl JobDevice {
    fn of<C: DeviceClient + PartitionSink + 'static>(c: Arc<C>) -> Self {
        Self {
            client: Arc::clone(&c) as _,
            sink: c as _,
        }
    }
}

impl Target {
    /// The cluster of `options`, or the devices of its root (which must
    /// exist), opened with its budgets.
    pub fn open(options: &DeviceOptions) -> SessionResult<Self> {
        match &options.cluster {
            Some(c) => Ok(Target::Cluster(c.clone())),
            None => Ok(Target::Embedded(open_root(
                &options.root,
                &budget(options)?,
            )?)),
        }
    }

    /// Clients behind links of `link`: for embedded devices, one shared
    /// throttle (the host's port, default unlimited); for a cluster, the
    /// file's per-device links unless `link` overrides them.
    pub async fn clients(
        &self,
        link: Option<LinkProfile>,
    ) -> SessionResult<Vec<Arc<dyn DeviceClient>>> {
        match self {
            Target::Embedded(devices) => Ok(embedded_clients(
                devices.clone(),
                link.unwrap_or(LinkProfile::UNLIMITED),
            )),
            Target::Cluster(path) => Ok(connect(path, link)
                .await?
                .into_iter()
                .map(|c| c as Arc<dyn DeviceClient>)
                .collect()),
        }
    }

    /// Every device as a client that both reads and writes, over
    /// unlimited links (embedded) or the cluster file's.
    pub async fn job_devices(&self) -> SessionResult<Vec<JobDevice>> {
        Ok(match self {
            Target::Embedded(devices) => embedded(devices.clone(), LinkProfile::UNLIMITED)
                .into_iter()
                .map(JobDevice::of)
                .collect(),
            Target::Cluster(path) => connect(path, None)
                .await?
                .into_iter()
                .map(JobDevice::of)
                .collect(),
        })
    }
}

/// Connects to the device servers of the cluster file `path`.
pub(crate) async fn connect(
    path: &std::path::Path,
    link: Option<LinkProfile>,
) -> SessionResult<Vec<Arc<FlightDeviceClient>>> {
    Ok(insitu_flight::connect_cluster(path, link, Default::default()).await?)
}
